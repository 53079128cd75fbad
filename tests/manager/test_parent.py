"""The `ParentManager` side: what a peer-serving tier may call (create_store_job,
complete_store_job, lookup), from its own threads while the scheduler runs."""

from __future__ import annotations

import hashlib
import queue
import random
import threading
import time
from collections import Counter
from typing import Any, ClassVar

import pytest
from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.lookup import LookupResult
from kvtiers.contract.parent import ParentManager
from kvtiers.manager import TieringOffloadingManager
from kvtiers.policies.lru import LRUPolicy

from tests.manager.conftest import BLOCK, Harness, key, memory_tier
from tests.manager.fake_tiers import PeerMemoryTier, ScriptedTier
from tests.manager.invariants import check_holds, check_structure

HIT, MISS, PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING


def test_the_manager_is_a_parent_manager(harness):
    assert isinstance(harness(2).mgr, ParentManager)


def test_create_store_job_is_all_or_nothing(harness):
    h = harness(8, tiers=[memory_tier(64)])
    h.store([key(1), key(2)])
    h.mgr.prepare_store([key(3)])  # being stored: not readable yet
    h.seed(h.tiers[0], key(4))
    assert h.mgr.lookup(key(4)) is PENDING  # being promoted: not readable yet
    for keys in ([key(1), key(9)], [key(1), key(3)], [key(2), key(4)], [key(9)]):
        assert h.mgr.create_store_job(keys) is None
        check_holds(h.mgr, {h.mgr.slot_of(key(3)): 1})  # only the engine's store holds
    job = h.mgr.create_store_job([key(2), key(1)])
    assert isinstance(job, TransferJob)
    assert list(job.keys) == [key(2), key(1)]
    assert list(job.slots) == [h.mgr.slot_of(key(2)), h.mgr.slot_of(key(1))]
    for k, slot in zip(job.keys, job.slots, strict=True):
        assert bytes(h.pool.block(slot)) == h.content[k]
    h.mgr.complete_store_job(job.job_id)


def test_a_peer_job_pins_its_blocks_until_completed(harness):
    h = harness(2)
    h.store([key(1), key(2)])
    job = h.mgr.create_store_job([key(1)])
    assert h.mgr.stats()["pool"]["pinned"] == 1
    assert h.mgr.prepare_store([key(3), key(4)]) is None  # key 1 is not a candidate
    out = h.mgr.prepare_store([key(3)])
    assert out.evicted == [key(2)]
    h.mgr.complete_store(out.keys)
    h.mgr.reset()  # a pinned block survives a reset
    assert h.mgr.lookup(key(1)) is HIT
    # Peer jobs and engine loads hold the same block independently.
    h.mgr.prepare_load([key(1)])
    job2 = h.mgr.create_store_job([key(1)])
    h.mgr.complete_store_job(job.job_id)
    h.mgr.complete_load([key(1)])
    assert h.mgr.stats()["pool"]["pinned"] == 1  # job2 still holds it
    h.mgr.complete_store_job(job2.job_id)
    h.mgr.complete_store_job(job2.job_id)  # a second report is ignored
    h.mgr.complete_store_job(123456)  # so is an unknown job
    assert h.mgr.stats()["pool"]["pinned"] == 0
    assert h.mgr.prepare_store([key(5), key(6)]) is not None


def test_peer_job_ids_never_collide_with_tier_job_ids(harness):
    h = harness(8, tiers=[memory_tier(64)])
    seen: set[int] = set()
    for i in range(4):
        h.store([key(i)])
        h.mgr.step()  # a cascade job takes an id
        seen.update(h.mgr._traffic.jobs)
        job = h.mgr.create_store_job([key(i)])
        assert job.job_id not in seen
        seen.add(job.job_id)
        h.mgr.complete_store_job(job.job_id)
        h.settle()
    h.settle()
    assert h.mgr.stats()["pool"]["pinned"] == 0


def test_a_peer_job_with_a_repeated_key_leaves_no_hold_behind(harness):
    """bug: create_store_job takes its holds, then builds the TransferJob, which
    refuses a repeated key (ValueError): the holds and the registered peer job stay
    forever, and the block can never be evicted."""
    h = harness(4)
    h.store([key(1)])
    try:
        job = h.mgr.create_store_job([key(1), key(1)])
    except ValueError:
        job = None
    if job is not None:
        h.mgr.complete_store_job(job.job_id)
    assert h.mgr.stats()["pool"]["pinned"] == 0
    assert not h.mgr._peers


def test_the_lock_is_real_only_when_a_tier_serves_peers(harness):
    options = memory_tier(4)["options"]
    plain = harness(2, tiers=[memory_tier(4)])
    serving = harness(2, tiers=[{"type": "peer", "factory": lambda c: PeerMemoryTier(c, options)}])
    assert not hasattr(plain.mgr._lock, "acquire")
    assert hasattr(serving.mgr._lock, "acquire")


# --------------------------------------------------------------- threads


def _content(k: bytes) -> bytes:
    return hashlib.shake_128(k).digest(BLOCK)


def test_peer_threads_and_the_scheduler_keep_every_invariant():
    """The scheduler stores, scans, loads and steps while two peer threads pin and
    ship blocks and look keys up. Every shipped block has its stored bytes; the
    structure holds whenever looked at (under the lock); nothing stays pinned."""
    spec = {"type": "peer", "factory": lambda ctx: PeerMemoryTier(ctx, memory_tier(24)["options"])}
    h = Harness(12, tiers=[spec], cascade_queue_blocks=4)
    universe = [key(i) for i in range(30)]
    stop = threading.Event()
    errors: list[str] = []
    shipped = Counter[str]()

    def peer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                keys = rng.sample(universe, rng.randint(1, 3))
                job = h.mgr.create_store_job(keys)
                if job is not None:
                    for k, slot in zip(job.keys, job.slots, strict=True):
                        if bytes(h.pool.block(slot)) != _content(k):
                            errors.append(f"peer shipped wrong bytes for {k.hex()}")
                    shipped["blocks"] += len(keys)
                    h.mgr.complete_store_job(job.job_id)
                else:
                    shipped["refused"] += 1
                h.mgr.lookup(rng.choice(universe))  # may start promotions
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(repr(exc))

    threads = [threading.Thread(target=peer, args=(s,), daemon=True) for s in (1, 2)]
    for t in threads:
        t.start()
    rng = random.Random(0)
    loads = 0
    try:
        # 1.5 s of it, and on a loaded machine on until both sides did some work
        # (loads and shipped blocks), bounded.
        end, give_up = time.monotonic() + 1.5, time.monotonic() + 60
        while not errors and time.monotonic() < give_up and (
                time.monotonic() < end or loads == 0 or shipped["blocks"] == 0):
            out = h.mgr.prepare_store(rng.sample(universe, rng.randint(1, 3)))
            if out is not None:
                for k, slot in zip(out.keys, out.slots, strict=True):
                    h.pool.block(slot)[:] = _content(k)
                h.mgr.complete_store(out.keys)
            prefix = rng.sample(universe, 4)
            hits = h.mgr.lookup_prefix(prefix).hits
            try:
                slots = h.mgr.prepare_load(prefix[:hits])
            except KeyError:
                slots = None  # a peer's lookup promoted something and evicted a hit
            if slots is not None:
                for k, slot in zip(prefix[:hits], slots, strict=True):
                    assert bytes(h.pool.block(slot)) == _content(k)
                h.mgr.complete_load(prefix[:hits])
                loads += hits
            h.mgr.touch(prefix)
            h.mgr.step()
            with h.mgr._lock:
                check_structure(h.mgr, h.pool, _content)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors[:5]
    assert not any(t.is_alive() for t in threads)
    assert shipped["blocks"] > 0 and loads > 0
    h.settle()
    check_structure(h.mgr, h.pool, _content)
    check_holds(h.mgr, {})
    assert h.mgr.stats()["pool"]["pinned"] == 0
    h.close()


class BatchingPeerTier(ScriptedTier):
    """A peer-serving tier with one worker thread that runs jobs and peer requests
    in arrival order, and only once flushed (by `drain` or `close`): a tier that
    batches its I/O. Peer requests call the manager from that thread."""

    serves_peers: ClassVar[bool] = True

    def __init__(self, ctx: Any):
        super().__init__(ctx)
        self.parent: ParentManager | None = None
        self.tasks: queue.Queue[Any] = queue.Queue()
        self.flush = threading.Event()
        self.served = 0
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.thread.start()

    def serve_external_requests(self, parent: ParentManager) -> None:
        self.parent = parent

    def peer_request(self, keys: list[bytes]) -> None:
        self.tasks.put(("peer", keys))

    def _submit(self, job: TransferJob, load: bool) -> None:
        self.tasks.put(("job", job, load))

    def _work(self) -> None:
        while True:
            self.flush.wait()
            task = self.tasks.get()
            try:
                if task is None:
                    return
                if task[0] == "peer":
                    assert self.parent is not None
                    job = self.parent.create_store_job(task[1])
                    if job is not None:
                        self.parent.complete_store_job(job.job_id)
                    self.served += 1
                else:
                    result = self._run(task[1], task[2])
                    with self._lock:
                        self.finished.append(result)
            finally:
                self.tasks.task_done()

    def get_finished_jobs(self) -> list[Any]:
        with self._lock:
            done, self.finished = self.finished, []
        return done

    def drain(self, timeout: float | None = None) -> bool:
        self.flush.set()
        end = None if timeout is None else time.monotonic() + timeout
        while self.tasks.unfinished_tasks:
            if end is not None and time.monotonic() > end:
                return False
            time.sleep(0.001)
        return True

    def close(self) -> None:
        self.flush.set()
        self.tasks.put(None)
        self.thread.join()  # in-flight peer requests finish first


def _batching_harness() -> tuple[Harness, BatchingPeerTier]:
    h = Harness(4, tiers=[{"type": "batching", "factory": BatchingPeerTier}])
    tier = h.tiers[0]
    tier.serve_external_requests(h.mgr)
    return h, tier


def test_drain_does_not_hold_the_manager_while_a_tier_serves_peers():
    """bug: drain() holds the manager's lock while it waits in tier.drain(); a peer
    request the tier runs meanwhile needs that lock, so drain waits out its whole
    timeout and returns with the tier's work unfinished and uncollected."""
    h, tier = _batching_harness()
    try:
        h.store([key(1)])  # write_through: a copy is queued
        tier.peer_request([key(1)])  # a peer asks for the block; queued first
        start = time.monotonic()
        h.mgr.drain(timeout=2)
        took = time.monotonic() - start
        assert h.mgr.stats()["tiers"]["batching"]["cascaded_blocks"] == 1, (
            f"drain returned after {took:.1f}s without the copy"
        )
        assert tier.served == 1
    finally:
        tier.flush.set()
        tier.drain(5)
        h.close()


def test_close_does_not_deadlock_with_a_tier_finishing_peer_requests():
    """bug: close() holds the manager's lock while tier.close() joins the tier's
    threads; a peer request still in flight needs the lock: deadlock."""
    h, tier = _batching_harness()
    h.store([key(1)])
    tier.peer_request([key(1)])  # arrives just before shutdown
    closer = threading.Thread(target=h.mgr.close, daemon=True)
    closer.start()
    closer.join(3)
    # On failure both threads stay blocked (daemons); the harness is not reused.
    assert not closer.is_alive(), "TieringOffloadingManager.close() deadlocked"
    assert tier.served == 1


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_peer_jobs_and_cascades_hold_one_block_together(harness, write_policy):
    h = harness(2, tiers=[memory_tier(8)], write_policy=write_policy)
    h.store([key(1), key(2)])
    job = h.mgr.create_store_job([key(1)])
    h.mgr.touch([key(2)])
    # write_back: key 2 is dirty; the only candidate goes down first.
    out = h.mgr.prepare_store([key(3)])
    h.settle()
    if out is None:
        out = h.mgr.prepare_store([key(3)])
    assert out is not None and out.keys == [key(3)]
    h.pool.block(out.slots[0])[:] = h.content[key(3)] = _content(key(3))
    h.mgr.complete_store(out.keys)
    assert h.mgr.lookup(key(1)) is HIT  # held by the peer throughout
    h.mgr.complete_store_job(job.job_id)
    h.settle()
    check_structure(h.mgr, h.pool, h.content)
    check_holds(h.mgr, {})


def test_an_empty_peer_job_is_harmless():
    mgr = TieringOffloadingManager(2, LRUPolicy.for_slots(2))
    job = mgr.create_store_job([])
    assert job is not None and list(job.keys) == [] and list(job.slots) == []
    mgr.complete_store_job(job.job_id)
    assert mgr.stats()["pool"]["pinned"] == 0 and not mgr._peers
    mgr.close()
