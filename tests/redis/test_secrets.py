"""Credentials - the `password` option, a password in the URL - never appear in what
the tier logs (any level), raises, counts or shows (`repr`, stats), nor in
`kvtiers validate`'s output, whether the server takes them, refuses them, or goes
away mid-run."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from kvtiers.cli import main
from kvtiers.errors import ConfigError
from kvtiers.testing import JobTracker, fill_slots, random_keys

from tests.redis.helpers import BLOCK, context
from tests.redis.server import RedisServer, new_password


def _clean(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a credential leaked into:\n{text}"


def test_the_tier_never_logs_raises_or_counts_credentials(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from kvtiers_redis.tier import RedisTier

    password, wrong = new_password(), new_password()
    server = RedisServer(tmp_path / "redis", password=password)
    server.start()
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    tiers: list[tuple[RedisTier, list[bytes]]] = []
    try:
        host = f"127.0.0.1:{server.port}"
        for config in ({"url": f"redis://:{password}@{host}/0"},
                       {"url": f"redis://{host}/0", "password": password},
                       {"url": f"redis://default:{password}@{host}/1"}):
            ctx = context()
            tier = RedisTier(ctx, {"capacity_bytes": 8 * BLOCK, **config})
            keys = random_keys(2)
            tiers.append((tier, keys))
            jobs = JobTracker(tier, timeout_s=60)
            fill_slots(ctx.pool, range(2))
            assert jobs.run_store(keys, range(2)).success
            assert jobs.run_load(keys, [4, 5]).success
            seen += [repr(tier), str(tier.settings), str(tier.stats()), str(tier.config.keys())]
        server.kill()  # errors from here on: connection refused, counted, logged once
        for tier, keys in tiers:
            jobs = JobTracker(tier, timeout_s=60)
            assert set(jobs.run_load(keys, [0, 1]).failed) == set(keys)
            assert not jobs.run_store(random_keys(1), [0]).success
            seen.append(str(tier.stats()))
        server.start()
        for config in ({"url": f"redis://:{wrong}@{host}/0"},
                       {"url": f"redis://{host}/0", "password": wrong},
                       {"url": f"redis://{host}/0"}):  # no password at all
            with pytest.raises(ConfigError) as err:
                RedisTier(context(), {"capacity_bytes": BLOCK, **config})
            assert "$.password" in str(err.value) and "refused" in str(err.value)
            seen.append(str(err.value))
    finally:
        for tier, _ in tiers:
            tier.close()
        server.stop()
    seen += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    text = "\n".join(seen)
    _clean(text, password, wrong)
    assert "redis.store.ConnectionError" in text  # the failures were there, scrubbed
    assert f"redis://127.0.0.1:{server.port}/0" in text  # the server, named without them


def test_validate_never_prints_credentials(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    password = new_password()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"cpu_bytes_to_use": 1 << 26, "secondary_tiers": [
        {"type": "redis", "url": f"redis://user:{password}@127.0.0.1:1/0",
         "password": password, "capacity_bytes": 1 << 20}]}))
    outputs = []
    for extra in ([], ["--json"], ["--show"]):
        assert main(["validate", str(path), *extra]) == 0
        out = capsys.readouterr()
        outputs.append(out.out + out.err)
    text = "\n".join(outputs)
    _clean(text, password)
    assert text.count("***") >= 4, text
