"""`load_config` raises `ConfigError` and nothing else, for any input: valid kvtiers
and vLLM configs mutated (values swapped for odd ones, keys dropped or added,
sections duplicated), random JSON, and raw text. Bounded: a few hundred examples,
a few seconds.

Machine checks run too: every path the generators can produce is one of a small
set (a temporary directory, missing or virtual paths), so nothing outside the
test's directory is ever written.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvtiers.config import load_config
from kvtiers.config.vllm import NATIVE
from kvtiers.errors import ConfigError
from kvtiers.plugins import Registered, Registry

from .conftest import REPO, GiB

ROOT = Path(tempfile.mkdtemp(prefix="kvtiers-config-property-"))
(ROOT / "a").mkdir()
(ROOT / "b").mkdir()


@pytest.fixture(scope="module", autouse=True)
def _remove_root() -> Iterator[None]:
    yield
    shutil.rmtree(ROOT, ignore_errors=True)


def _with_fs(base: Registry) -> Registry:
    reg = Registry(tiers=dict(base.tiers), policies=dict(base.policies))
    from kvtiers_fs import plugin

    [record] = plugin.kvtiers_register_tiers()
    reg.tiers["fs"] = Registered(record, "fs", "kvtiers-fs", "0")
    return reg


PATHS = [str(ROOT / "a"), str(ROOT / "b") + "/", str(ROOT), "rel/dir", "/nonexistent/x",
         "/proc", "", "/a\x00b", str(ROOT / "a" / "missing")]
NAMES = ["memory", "faulty", "fs", "wrap", "disk", "checked", "ghost", "badschema", "lru",
         "arc", "sieve", "write_back", "OffloadingConnector", "TieringOffloadingSpec",
         "KvtiersOffloadingSpec", "kv_both", "vllm.x", "kvtiers_vllm"]
KEYS = ["type", "inner", "mirrors", "cpu_bytes_to_use", "secondary_tiers", "breaker",
        "root_dir", "capacity_bytes", "threads", "load", "eviction_policy", "spec_name",
        "spec_module_path", "kv_connector", "kv_role", "kv_connector_extra_config",
        "kv_connector_module_path", "n_read_threads", "job_timeout_s", "hash_seed", "x"]

SEEDS: list[Any] = [
    json.loads((REPO / "examples" / "config.json").read_text()),
    json.loads((REPO / "examples" / "vllm_kv_transfer_config.json").read_text()),
    {"cpu_bytes_to_use": 64 << 20, "secondary_tiers": [
        {"type": "fs", "root_dir": [str(ROOT / "a"), str(ROOT / "b")], "capacity_bytes": 1 << 20},
        {"type": "wrap", "inner": {"type": "disk", "root_dir": "/kv"},
         "mirrors": [{"type": "checked"}]}]},
    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 64 << 20,
        "eviction_policy": "lru", "secondary_tiers": [
            {"type": "fs", "root_dir": str(ROOT / "a"), "n_read_threads": 2}]}},
    {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": GiB, "block_size": 16,
     "secondary_tiers": [{"type": "disk", "root_dir": "/kv", "n_write_threads": 3}]},
]

odd_ints = st.sampled_from([0, -1, 1, 7, 2**31, 2**63, 2**64 - 1, 2**64, 10**400, -(10**400)])
leaves = st.one_of(
    st.none(), st.booleans(), odd_ints, st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(blacklist_characters="/"), max_size=8),
    st.sampled_from(NAMES), st.sampled_from(PATHS),
)
json_values = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)


def _places(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _places(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _places(value, (*path, i))
    return out


def _mutate(data: st.DataObject, doc: Any) -> Any:
    places = _places(doc)
    where = data.draw(st.sampled_from(places))
    op = data.draw(st.sampled_from(["replace", "delete", "add", "duplicate", "wrap"]))
    if not where:
        return data.draw(json_values) if op == "replace" else doc
    parent: Any = doc
    for part in where[:-1]:
        parent = parent[part]
    last = where[-1]
    if op == "replace":
        parent[last] = data.draw(json_values)
    elif op == "delete":
        del parent[last]
    elif op == "add" and isinstance(parent[last], dict):
        parent[last][data.draw(st.sampled_from(KEYS))] = data.draw(json_values)
    elif op == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[last]))
    elif op == "wrap":
        parent[last] = data.draw(st.sampled_from([[parent[last]], {"type": "wrap",
                                                                   "inner": parent[last]}]))
    return doc


def _attempt(registry: Registry, source: Any, check_machine: bool) -> None:
    try:
        cfg = load_config(source, registry, check_machine=check_machine)
    except ConfigError as exc:
        assert exc.problems
        for p in exc.problems:
            assert p.path.startswith("$") and p.message, p
        return
    document = json.dumps(cfg.to_dict(), allow_nan=False)  # always valid JSON
    if cfg.source_format == NATIVE or check_machine:
        again = load_config(document, registry, check_machine=check_machine)
        assert again.to_dict() == cfg.to_dict()


EXAMPLES = settings(max_examples=80, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@EXAMPLES
@given(data=st.data())
def test_mutated_valid_configs(registry: Registry, data: st.DataObject) -> None:
    reg = _with_fs(registry)
    doc = copy.deepcopy(data.draw(st.sampled_from(SEEDS)))
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _mutate(data, doc)
    machine = data.draw(st.booleans())
    _attempt(reg, doc, machine)
    try:
        text = json.dumps(doc)
    except ValueError:
        return  # a non-JSON value (only a mapping can carry it)
    _attempt(reg, text, machine)


@EXAMPLES
@given(doc=json_values, machine=st.booleans())
def test_random_json(registry: Registry, doc: Any, machine: bool) -> None:
    reg = _with_fs(registry)
    if isinstance(doc, dict):
        _attempt(reg, doc, machine)
    _attempt(reg, json.dumps(doc), machine)


@EXAMPLES
@given(
    text=st.one_of(
        st.text(max_size=40),
        st.sampled_from(SEEDS).map(json.dumps).flatmap(
            lambda s: st.tuples(st.integers(0, len(s)), st.integers(0, 5), st.text(max_size=3))
            .map(lambda t: s[: t[0]] + t[2] + s[t[0] + t[1]:])
        ),
    )
)
def test_raw_text(registry: Registry, text: str) -> None:
    # Text that is not JSON is taken for a file path: only paths of the set above,
    # or ones that cannot exist, are ever opened.
    if text.lstrip()[:1] not in ("{", "[") and "/" in text:
        text = text.replace("/", "_")
    _attempt(_with_fs(registry), text, check_machine=False)
