"""Code that runs in child processes (started by a multiprocessing forkserver, so
each one is a real process that the tests may SIGKILL): writers that store blocks
on a root and log the keys the tier reported stored."""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path
from typing import Any

from kvtiers.contract.jobs import TransferJob
from kvtiers.contract.keys import make_key

from tests.fs.helpers import BB, block_data, context, open_tier

_ids = iter(range(1, 1 << 62))


def writer(root: str, capacity_blocks: int, seed: int, log_path: str, ready: Any,
           rotate_bytes: int = 0, jobs: int = 0, key_space: int = 0,
           result_queue: Any = None, in_flight: int = 4, block_bytes: int = BB,
           key_base: int = 0) -> None:
    """Store random blocks forever (or `jobs` jobs), `in_flight` jobs at a time of
    1-8 blocks each; after each job, append the keys reported ok to `log_path`, one
    hex line per key, with one write(2). With `key_space`, keys are drawn from
    `key_base + range(key_space)` (writers sharing one store the same keys)."""
    if rotate_bytes:
        import kvtiers_fs.namespace.store as store_mod

        store_mod.ROTATE_MIN_BYTES = rotate_bytes
    rng = random.Random(seed)
    ctx = context(block_bytes, 8 * in_flight, clock=time.monotonic)
    tier = open_tier(ctx, root, capacity_blocks)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    ready.set()
    done = 0
    while not jobs or done < jobs:
        submitted = []
        for j in range(in_flight):
            n = rng.randint(1, 8)
            if key_space:
                keys = list(dict.fromkeys(
                    make_key((key_base + rng.randrange(key_space)).to_bytes(16, "big"))
                    for _ in range(n)))
            else:
                keys = [make_key(rng.randbytes(16)) for _ in range(n)]
            slots = list(range(8 * j, 8 * j + len(keys)))
            for key, slot in zip(keys, slots, strict=True):
                ctx.pool.block(slot)[:] = block_data(key, block_bytes)
            job = TransferJob(next(_ids), keys, slots)
            tier.submit_store(job)
            submitted.append(job.job_id)
        results: dict[int, Any] = {}
        while len(results) < len(submitted):
            for r in tier.get_finished_jobs():
                results[r.job_id] = r
            time.sleep(0.0005)
        lines = b"".join(k.hex().encode() + b"\n" for r in results.values() for k in r.ok)
        if lines:
            os.write(log, lines)
        done += len(submitted)
    stats = tier.stats()
    tier.close()
    if result_queue is not None:
        result_queue.put({"evictions": stats.evictions, "errors": dict(stats.errors),
                          "written": stats.blocks_written,
                          "waited": sum(s.waited for s in tier.stores)})


def die_half_way(root: str, keys: list[bytes], block_bytes: int, ready: Any) -> None:
    """Store keys[0]; then reserve keys[1:], write half of keys[1]'s temporary file
    and all of keys[2]'s file (renamed into place), commit neither, and wait to be
    killed: the state a writer killed between writing and committing leaves."""
    from kvtiers_fs.disk import layout

    ctx = context(block_bytes, 8, clock=time.monotonic)
    tier = open_tier(ctx, root, 100)
    ctx.pool.block(0)[:] = block_data(keys[0], block_bytes)
    tier.submit_store(TransferJob(next(_ids), keys[:1], [0]))
    while not tier.get_finished_jobs():
        time.sleep(0.001)
    store = tier.stores[0]
    idns = [layout.ident(k) for k in keys[1:]]
    store.reserve([(i, layout.file_bytes(block_bytes)) for i in idns])
    shard = store.shard_fd(idns[0], create=True)
    fd = os.open(layout.tmp_name(idns[0], store.writer), os.O_WRONLY | os.O_CREAT, 0o600,
                 dir_fd=shard)
    os.write(fd, os.urandom(1000))
    os.close(fd)
    os.close(shard)
    ctx.pool.block(1)[:] = block_data(keys[2], block_bytes)
    shard = store.shard_fd(idns[1], create=True)
    tier._io[0].write(shard, idns[1], keys[2], store.writer, ctx.pool.block(1))
    os.close(shard)
    ready.put(store.writer)
    time.sleep(3600)


def stop_while_writing(root: str, keys: list[bytes], block_bytes: int, log_path: str,
                       ready: Any) -> None:
    """Store `keys` (one job), stopping this whole process with SIGSTOP as soon as
    the temporary file of keys[0] is created (before a byte of it is written), with
    no other block of the job written yet; after a SIGCONT, finish, log the keys
    reported ok (as `writer` does) and exit."""
    import signal
    import threading

    import kvtiers_fs.disk.blockio as blockio

    real_pwritev, real_write = blockio._pwritev_all, blockio.BlockIO.write
    first = keys[0]
    resumed = threading.Event()
    writing_first = threading.local()

    def stop_then_write(fd: int, buffers: Any, offset: int) -> None:
        if getattr(writing_first, "on", False) and not resumed.is_set():
            os.kill(os.getpid(), signal.SIGSTOP)
            resumed.set()
        real_pwritev(fd, buffers, offset)

    def write_in_order(io: Any, shard_fd: int, idn: bytes, key: bytes, *args: Any,
                       **kw: Any) -> None:
        # The pool's idle load thread takes store work too: whichever thread writes
        # which key, the other keys wait until keys[0]'s write has been stopped.
        if key != first:
            resumed.wait()
            return real_write(io, shard_fd, idn, key, *args, **kw)
        writing_first.on = True
        try:
            return real_write(io, shard_fd, idn, key, *args, **kw)
        finally:
            writing_first.on = False

    blockio._pwritev_all = stop_then_write  # type: ignore[assignment]
    blockio.BlockIO.write = write_in_order  # type: ignore[method-assign]
    ctx = context(block_bytes, 8, clock=time.monotonic)
    tier = open_tier(ctx, root, 100, threads={"load": 1, "store": 1})
    ready.set()  # an Event: a queue's message could still sit in its feeder thread here
    for slot, key in enumerate(keys):
        ctx.pool.block(slot)[:] = block_data(key, block_bytes)
    tier.submit_store(TransferJob(next(_ids), keys, list(range(len(keys)))))
    results: list[Any] = []
    while not results:
        results = tier.get_finished_jobs()
        time.sleep(0.001)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(log, b"".join(k.hex().encode() + b"\n" for k in results[0].ok))
    os.close(log)
    tier.close()


def die_while_rotating(root: str, keys: list[bytes], block_bytes: int, ready: Any) -> None:
    """Store `keys`, then rotate the journal and SIGKILL this process at the moment
    it would append the ROTATE record (its new snapshot is in place by then)."""
    import signal

    import kvtiers_fs.journal.records as jr
    import kvtiers_fs.namespace.store as store_mod
    from kvtiers_fs.journal.files import Journal

    ctx = context(block_bytes, len(keys), clock=time.monotonic)
    tier = open_tier(ctx, root, 1000)
    for slot, key in enumerate(keys):
        ctx.pool.block(slot)[:] = block_data(key, block_bytes)
    tier.submit_store(TransferJob(next(_ids), keys, list(range(len(keys)))))
    while not tier.get_finished_jobs():
        time.sleep(0.001)
    real = Journal.append

    def append(self: Any, records: Any) -> None:
        if records and records[0].op == jr.ROTATE:
            os.kill(os.getpid(), signal.SIGKILL)
        real(self, records)

    Journal.append = append  # type: ignore[method-assign]
    store_mod.ROTATE_FACTOR = 0
    ready.put(True)
    # A Queue's put hands the item to a feeder thread: flush it to the pipe before
    # the SIGKILL below, or the parent may never hear (it waited out its bound).
    ready.close()
    ready.join_thread()
    tier.stores[0]._rotate(0)


def read_log(path: str) -> list[bytes]:
    """Keys a writer logged; a line cut by a kill is ignored."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    keys = []
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is unfinished
        with contextlib.suppress(ValueError):
            keys.append(bytes.fromhex(line.decode()))
    return keys


def fill_without_compaction(root: str, capacity_blocks: int, seed: int, result: Any) -> None:
    """What a tier whose journal is never compacted does on a small filesystem: store
    jobs of 8 random blocks, rotations and compactions off, until a store fails
    `full`; put the keys reported stored (oldest first) on `result`, then exit."""
    import kvtiers_fs.namespace.store as store_mod

    store_mod.ROTATE_MIN_BYTES = 1 << 40
    store_mod.CLOSE_ROTATE_BYTES = 1 << 40
    rng = random.Random(seed)
    ctx = context(BB, 8, clock=time.monotonic)
    tier = open_tier(ctx, root, capacity_blocks)
    store = tier.stores[0]
    store.journal_limit = 1 << 40
    store._compact = lambda: False  # type: ignore[method-assign]
    stored: list[bytes] = []
    for _ in range(100_000):
        keys = [make_key(rng.randbytes(16)) for _ in range(8)]
        for slot, key in enumerate(keys):
            ctx.pool.block(slot)[:] = block_data(key, BB)
        tier.submit_store(TransferJob(next(_ids), keys, list(range(8))))
        results: list[Any] = []
        while not results:
            results = tier.get_finished_jobs()
            time.sleep(0.0002)
        stored += [k for k in keys if k in results[0].ok]
        if results[0].failed:
            break
    result.put((stored, dict(tier.stats().errors)))
    result.close()
    result.join_thread()
    tier.close()


def store_and_load(root: str, capacity_blocks: int, seed: int, key_space: int, ready: Any,
                   seconds: float, missed_pause_s: float = 0.0) -> None:
    """For `seconds`: store jobs of 1-4 keys drawn from `range(key_space)` (writers
    sharing one root store the same keys, evicting one another's), and load keys the
    tier says it holds - every block loaded checked against its bytes (an
    AssertionError, exit code 1, on a wrong one). `missed_pause_s`: a load that
    finds no file pauses that long before it reads the journal (the other writer
    may store the block again meanwhile)."""
    from kvtiers.contract.lookup import LookupResult
    from kvtiers_fs.tier import FsTier

    if missed_pause_s:
        missing = FsTier._missing

        def pause_then_missing(self: Any, store: Any, idn: bytes) -> None:
            time.sleep(missed_pause_s)
            missing(self, store, idn)

        FsTier._missing = pause_then_missing  # type: ignore[method-assign]

    rng = random.Random(seed)
    ctx = context(BB, 8, clock=time.monotonic)
    tier = open_tier(ctx, root, capacity_blocks)
    space = [make_key(i.to_bytes(16, "big")) for i in range(key_space)]
    ready.set()

    def run(job: TransferJob, load: bool = False) -> Any:
        if load:
            tier.submit_load(job)
        else:
            tier.submit_store(job)
        while True:
            for r in tier.get_finished_jobs():
                return r
            time.sleep(0.0002)

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        keys = rng.sample(space, rng.randint(1, 4))
        for slot, key in enumerate(keys):
            ctx.pool.block(slot)[:] = block_data(key, BB)
        run(TransferJob(next(_ids), keys, list(range(len(keys)))))
        held = [k for k in rng.sample(space, 8) if tier.lookup(k) is LookupResult.HIT][:4]
        if not held:
            continue
        slots = list(range(4, 4 + len(held)))
        for slot in slots:
            ctx.pool.block(slot)[:] = os.urandom(BB)
        result = run(TransferJob(next(_ids), held, slots), load=True)
        for key, slot in zip(held, slots, strict=True):
            if key in result.ok:
                assert bytes(ctx.pool.block(slot)) == block_data(key, BB), "wrong bytes"
    tier.close()
