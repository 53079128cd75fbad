"""Tenants (Mooncake's `tenant_id`, the tier's `tenant`). A master started with
`--enable_multi_tenants` (and its tenant quota policy file) keeps tenants apart:
engines of one tenant share blocks, another tenant on the same master, prefix and
model neither sees nor reads them and stores its own under the same names; a
tenant the policy does not list is refused (stores fail `rejected`, named in the
error counts, the breaker stays closed). The master's admin listing shows no
tenant's objects. A master without the flag ignores `tenant_id`: tenants share
everything there (separate them by `prefix`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kvtiers import FailureReason, LookupResult
from kvtiers.testing import (
    JobTracker,
    check_blocks,
    fill_slots,
    poison_slots,
    random_keys,
    resolve_lookup,
)

from tests.mooncake.helpers import MiB, Tiers, context
from tests.mooncake.master import Master
from tests.mooncake.netns import NetNamespace

N = 6
POLICY = """version: 1
tenants:
  - name: alpha
    quota: 268435456
  - name: beta
    quota: 268435456
"""


@pytest.fixture(scope="module")
def tenant_master(ns: NetNamespace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Master]:
    logs = tmp_path_factory.mktemp("mooncake-tenants")
    policy = Path(logs) / "tenants.yaml"
    policy.write_text(POLICY)
    m = Master(ns, logs, extra_args=["--enable_multi_tenants=true",
                                     f"--tenant_quota_connector_uri={policy}"])
    m.start()
    yield m
    m.stop_with_clients()


def test_tenants_apart_on_a_multi_tenant_master(ns: NetNamespace,
                                                tenant_master: Master) -> None:
    tiers = Tiers(ns, tenant_master)
    try:
        ctx_a, ctx_a2, ctx_b = context(), context(), context()
        alpha = tiers.open(ctx_a, tenant="alpha")
        # another engine of alpha, on a connection of its own (another segment size)
        alpha2 = tiers.open(ctx_a2, tenant="alpha", segment_bytes=48 * MiB)
        beta = tiers.open(ctx_b, tenant="beta")
        assert alpha.client.conn is not alpha2.client.conn
        keys = random_keys(N)
        ours = fill_slots(ctx_a.pool, range(N))
        assert JobTracker(alpha).run_store(keys, range(N)).success

        # Same tenant: found by the probe, promoted, bytes verified.
        assert all(resolve_lookup(alpha2, k, 30) is LookupResult.HIT for k in keys)
        poison_slots(ctx_a2.pool, range(N, 2 * N))
        assert JobTracker(alpha2).run_load(keys, range(N, 2 * N)).success
        check_blocks(ctx_a2.pool, [(N + i, b) for i, b in enumerate(ours)])

        # Another tenant: the same names are not there.
        assert all(resolve_lookup(beta, k, 30) is LookupResult.MISS for k in keys)
        result = JobTracker(beta).run_load(keys, range(N, 2 * N))
        assert set(result.failed.values()) == {FailureReason.MISSING}, result.failed
        # ... and it stores its own under them, which alpha never reads.
        theirs = fill_slots(ctx_b.pool, range(N))
        assert JobTracker(beta).run_store(keys, range(N)).success
        poison_slots(ctx_b.pool, range(N, 2 * N))
        assert JobTracker(beta).run_load(keys, range(N, 2 * N)).success
        check_blocks(ctx_b.pool, [(N + i, b) for i, b in enumerate(theirs)])
        poison_slots(ctx_a2.pool, range(N, 2 * N))
        assert JobTracker(alpha2).run_load(keys, range(N, 2 * N)).success
        check_blocks(ctx_a2.pool, [(N + i, b) for i, b in enumerate(ours)])
        # The master holds both tenants' objects under the same names; its admin
        # listing shows neither (the tier's admin_address features see no tenant).
        assert tenant_master.view().key_count == 2 * N
        assert not {alpha.names.key_of(n) for n in tenant_master.names()} & set(keys)
    finally:
        tiers.close_all()


def test_unlisted_tenant_is_refused(ns: NetNamespace, tenant_master: Master) -> None:
    tiers = Tiers(ns, tenant_master)
    try:
        ctx = context()
        tier = tiers.open(ctx, tenant="gamma")
        keys = random_keys(3)
        fill_slots(ctx.pool, range(3))
        result = JobTracker(tier).run_store(keys, range(3))
        assert set(result.failed.values()) == {FailureReason.REJECTED}, result.failed
        assert tier.breaker.opened == 0
        assert tier.stats().errors.get("mooncake.store.tenant not registered with the "
                                       "master (-1701)") == 3, tier.stats().errors
        assert tier.stats().usage_bytes == 0
    finally:
        tiers.close_all()


def test_tenant_is_ignored_without_multi_tenants(master: Master, tiers: Tiers) -> None:
    """What a master without `--enable_multi_tenants` does: one flat namespace."""
    ctx_a, ctx_b = context(), context()
    alpha = tiers.open(ctx_a, tenant="alpha")
    beta = tiers.open(ctx_b, tenant="beta")
    keys = random_keys(2)
    blocks = fill_slots(ctx_a.pool, range(2))
    assert JobTracker(alpha).run_store(keys, range(2)).success
    assert resolve_lookup(beta, keys[0], 30) is LookupResult.HIT
    poison_slots(ctx_b.pool, [4, 5])
    assert JobTracker(beta).run_load(keys, [4, 5]).success
    check_blocks(ctx_b.pool, [(4, blocks[0]), (5, blocks[1])])
