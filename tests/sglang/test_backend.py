"""kvtiers' SGLang backend built by SGLang's own factory ("dynamic") over a host
pool: every path moves the exact random bytes that were set, or misses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvtiers import ConfigError
from kvtiers_sglang.keys import block_keys, page_hash
from kvtiers_sglang.pages import LayoutError
from kvtiers_sglang.versions import UnsupportedSglangError, require_sglang
from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE

from .harness import extra_config, fs_tier, make_backend, page_keys
from .host_pool import HostPool


def memory_tier(capacity: int = 1 << 24) -> dict[str, object]:
    return {"type": "memory", "capacity_bytes": capacity}


@pytest.mark.parametrize(("layout", "mla"), [
    ("page_first", False), ("page_first_direct", False), ("page_head", False),
    ("page_first", True), ("page_first_direct", True),
])
def test_v1_round_trip_in_place(tmp_path: Path, layout: str, mla: bool) -> None:
    """batch_set_v1 from host pages, batch_get_v1 into other host pages: the loaded
    pages hold the stored bytes; batch_exists counts the leading run."""
    gen = torch.Generator().manual_seed(1)
    backend, pool = make_backend(extra_config([fs_tier(tmp_path / "fs")]), layout=layout, mla=mla)
    pool.fill_random(gen)
    keys = page_keys(gen, 5)
    stored = [pool.page_bytes(p) for p in range(5)]
    assert backend.batch_set_v1(keys, pool.indices([0, 1, 2, 3, 4])) == [True] * 5
    assert backend.batch_exists(keys) == 5
    unknown = page_keys(gen, 1)
    assert backend.batch_exists(keys[:2] + unknown + keys[2:]) == 2
    assert backend.exists(keys[3]) and not backend.exists(unknown[0])
    pool.fill_random(gen)
    targets = [9, 11, 6, 15, 7]
    assert backend.batch_get_v1(keys, pool.indices(targets)) == [True] * 5
    assert [pool.page_bytes(p) for p in targets] == stored
    backend.close()


def test_generic_path_and_v1_share_pages(tmp_path: Path) -> None:
    """SGLang's generic path (flat page tensors) stores and loads the same bytes under
    the same keys as the zero-copy path, both ways."""
    gen = torch.Generator().manual_seed(2)
    backend, pool = make_backend(extra_config([memory_tier()], v1=False))
    pool.fill_random(gen)
    keys = page_keys(gen, 4)
    page = pool.page_size
    assert backend.batch_set(keys[:2], [pool.get_data_page(p * page) for p in (0, 1)])
    assert backend.set(keys[2], pool.get_data_page(2 * page))
    assert backend.batch_set_v1(keys[3:], pool.indices([3])) == [True]
    stored = [pool.page_bytes(p) for p in range(4)]
    dummies = [pool.get_dummy_flat_data_page() for _ in keys]
    got = backend.batch_get(keys, dummies)
    assert all(g is d for g, d in zip(got, dummies, strict=True))
    assert [d.view(torch.uint8).numpy().tobytes() for d in dummies] == stored
    assert backend.get(page_keys(gen, 1)[0], pool.get_dummy_flat_data_page()) is None
    pool.fill_random(gen)
    assert backend.batch_get_v1(keys, pool.indices([5, 6, 7, 8])) == [True] * 4
    assert [pool.page_bytes(p) for p in (5, 6, 7, 8)] == stored
    backend.close()


def test_layer_first_is_refused_in_place_and_served_by_the_generic_path(tmp_path: Path) -> None:
    """layer_first spreads a page over every layer: interface_v1 is refused by name
    at registration; without it the generic path serves the pool."""
    with pytest.raises(LayoutError, match="page_first"):
        make_backend(extra_config([memory_tier()]), layout="layer_first")
    gen = torch.Generator().manual_seed(3)
    backend, pool = make_backend(extra_config([memory_tier()], v1=False), layout="layer_first")
    pool.fill_random(gen)
    keys = page_keys(gen, 3)
    assert backend.batch_set(keys, [pool.get_data_page(p * pool.page_size) for p in range(3)])
    stored = [pool.page_bytes(p) for p in range(3)]
    pool.fill_random(gen)
    for i, key in enumerate(keys):
        target = pool.get_dummy_flat_data_page()
        assert backend.get(key, target) is target
        pool.set_from_flat_data_page((10 + i) * pool.page_size, target)
    assert [pool.page_bytes(10 + i) for i in range(3)] == stored
    # v1 calls still answer a list of the right length: misses
    assert backend.batch_get_v1(keys, pool.indices([4, 5, 6])) == [False] * 3
    backend.close()


def test_namespaces_keep_models_and_ranks_apart(tmp_path: Path) -> None:
    """Two servers of one model and TP rank share an fs root; another model, another
    TP rank or another page layout finds none of their pages."""
    gen = torch.Generator().manual_seed(4)
    extra = extra_config([fs_tier(tmp_path / "fs")])
    writer, pool = make_backend(extra)
    pool.fill_random(gen)
    keys = page_keys(gen, 3)
    assert writer.batch_set_v1(keys, pool.indices([0, 1, 2])) == [True] * 3
    writer.close()
    same, _ = make_backend(extra)
    assert same.batch_exists(keys) == 3
    same.close()
    for other in ({"model": "another/model"}, {"tp_rank": 1, "tp_size": 2},
                  {"layout": "page_first_direct"}):
        backend, _ = make_backend(extra, **other)
        assert backend.batch_exists(keys) == 0, other
        backend.close()


def test_mla_pages_are_written_once_and_read_by_every_rank(tmp_path: Path) -> None:
    """MLA KV is the same on every TP rank: only the storage writer stores (the
    others answer True without writing) and every rank reads the one copy."""
    gen = torch.Generator().manual_seed(5)
    extra = extra_config([fs_tier(tmp_path / "fs")])
    other, pool1 = make_backend(extra, mla=True, tp_rank=1, tp_size=2)
    pool1.fill_random(gen)
    keys = page_keys(gen, 2)
    assert other.batch_set_v1(keys, pool1.indices([0, 1])) == [True, True]
    assert other.batch_exists(keys) == 0  # rank 1 wrote nothing
    writer, pool0 = make_backend(extra, mla=True, tp_rank=0, tp_size=2)
    pool0.fill_random(gen)
    assert writer.batch_set_v1(keys, pool0.indices([0, 1])) == [True, True]
    stored = [pool0.page_bytes(p) for p in (0, 1)]
    other.close()
    reader, pool1 = make_backend(extra, mla=True, tp_rank=1, tp_size=2)
    assert reader.batch_get_v1(keys, pool1.indices([3, 4])) == [True, True]
    assert [pool1.page_bytes(p) for p in (3, 4)] == stored
    writer.close()
    reader.close()


def test_every_v1_call_answers_one_bool_per_key(tmp_path: Path) -> None:
    """SGLang's controller thread dies on anything but a list of len(keys) bools:
    before registration, on indices that are not whole pages, on keys that are not
    strings, after close, and on a full batch of misses."""
    gen = torch.Generator().manual_seed(6)
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from .harness import storage_config

    extra = extra_config([memory_tier()])
    early = StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    pool = HostPool()
    keys = page_keys(gen, 3)
    assert early.batch_get_v1(keys, pool.indices([0, 1, 2])) == [False] * 3
    assert early.batch_set_v1(keys, pool.indices([0, 1, 2])) == [False] * 3
    assert early.batch_exists(keys) == 0
    backend, pool = make_backend(extra)
    pool.fill_random(gen)
    assert backend.batch_set_v1(keys, pool.indices([0, 1])) == [False] * 3  # 2 pages for 3
    assert backend.batch_set_v1(keys, pool.indices([0, 1, 2])[1:]) == [False] * 3
    assert backend.batch_get_v1(keys, torch.arange(pool.size, pool.size + 48)) == [False] * 3
    bad = [keys[0], None, keys[2]]
    assert backend.batch_set_v1(bad, pool.indices([0, 1, 2])) == [False] * 3
    many = page_keys(gen, STORAGE_BATCH_SIZE)
    indices = pool.indices([p % pool.page_num for p in range(STORAGE_BATCH_SIZE)])
    assert backend.batch_get_v1(many, indices) == [False] * STORAGE_BATCH_SIZE
    backend.close()
    assert backend.batch_get_v1(keys, pool.indices([0, 1, 2])) == [False] * 3
    assert backend.batch_set_v1(keys, pool.indices([0, 1, 2])) == [False] * 3


def test_a_key_twice_in_one_batch(tmp_path: Path) -> None:
    """A page key given twice is stored once (both answers True) and loaded once
    (the second copy is a miss: its host page is not written)."""
    gen = torch.Generator().manual_seed(7)
    backend, pool = make_backend(extra_config([memory_tier()]))
    pool.fill_random(gen)
    key = page_keys(gen, 1)[0]
    assert backend.batch_set_v1([key, key], pool.indices([0, 1])) == [True, True]
    stored = pool.page_bytes(0)
    assert backend.batch_get_v1([key, key], pool.indices([4, 5])) == [True, False]
    assert pool.page_bytes(4) == stored
    backend.close()


def test_keys_are_one_to_one() -> None:
    """Hex page hashes decode; any other string is kept as text; the two forms and
    the K/V halves never share a key."""
    digest = "0f" * 32
    assert page_hash(digest) != page_hash(digest.upper())
    assert page_hash("ab") != page_hash("\xab")
    k, v = block_keys(digest, 2)
    assert k != v and k[:-4] == v[:-4] == b"\x01" + bytes.fromhex(digest)
    with pytest.raises(ValueError, match="non-empty string"):
        page_hash("")


def test_bad_options_fail_sglang_start_by_name(tmp_path: Path) -> None:
    """A wrong extra config is refused when SGLang builds the backend, every problem
    named with its JSON path."""
    extra = extra_config([{"type": "fss", "root_dir": str(tmp_path)}], exists_wait_s=-1)
    with pytest.raises(ConfigError) as err:
        make_backend(extra)
    text = str(err.value)
    assert "$.secondary_tiers[0].type" in text and "did you mean 'fs'" in text
    assert "$.exists_wait_s" in text


def test_version_gate() -> None:
    assert require_sglang("0.5.23") == "0.5.23"
    assert require_sglang("0.5.24rc1+cu129") == "0.5.24rc1+cu129"
    for version in ("0.5.22", "0.6.0", "0.4.9"):
        with pytest.raises(UnsupportedSglangError, match="0.5.x from 0.5.23"):
            require_sglang(version)


def test_stores_follow_each_tiers_admission(tmp_path: Path) -> None:
    """A tier admitting only blocks offered twice (`second_touch`): a page's first
    store is refused (False: stored nowhere), its second is stored and loads back."""
    tier = {**memory_tier(), "admission": "second_touch"}
    backend, pool = make_backend(extra_config([tier]))
    gen = torch.Generator().manual_seed(8)
    pool.fill_random(gen)
    keys = page_keys(gen, 3)
    assert backend.batch_set_v1(keys, pool.indices([0, 1, 2])) == [False] * 3
    assert backend.kvtiers_stats()["bridge"]["stores_not_admitted"] == 6  # K and V halves
    assert backend.batch_set_v1(keys, pool.indices([0, 1, 2])) == [True] * 3
    stored = [pool.page_bytes(p) for p in range(3)]
    assert backend.batch_get_v1(keys, pool.indices([5, 6, 7])) == [True] * 3
    assert [pool.page_bytes(p) for p in (5, 6, 7)] == stored
    backend.close()


def test_sglang_threads_at_once(tmp_path: Path) -> None:
    """SGLang's prefetch and backup threads call at the same time: four threads, each
    storing and loading its own pages, every loaded page holding its bytes."""
    import threading

    backend, pool = make_backend(extra_config([fs_tier(tmp_path / "fs")]),
                                 HostPool(pages=32))
    pool.fill_random(torch.Generator().manual_seed(9))
    failures: list[str] = []

    def worker(n: int) -> None:
        gen = torch.Generator().manual_seed(100 + n)
        src, dst = [4 * n, 4 * n + 1], [16 + 4 * n, 16 + 4 * n + 1]
        for _ in range(5):
            keys = page_keys(gen, 2)
            want = [pool.page_bytes(p) for p in src]
            if backend.batch_set_v1(keys, pool.indices(src)) != [True, True]:
                failures.append(f"set {n}")
            if backend.batch_get_v1(keys, pool.indices(dst)) != [True, True]:
                failures.append(f"get {n}")
            if [pool.page_bytes(p) for p in dst] != want:
                failures.append(f"bytes {n}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert backend.kvtiers_stats()["tiers"]["fs"]["blocks_read"] == 4 * 5 * 4
    backend.close()
