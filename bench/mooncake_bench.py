#!/usr/bin/env python3
"""kvtiers-mooncake benchmark: the `mooncake` tier against the raw Mooncake client
making the same zero-copy batch calls, on one real `mooncake_master`, in one run.

    PYTHONPATH=. .venv/bin/python bench/mooncake_bench.py             # 15 rounds
    PYTHONPATH=. .venv/bin/python bench/mooncake_bench.py --runs 3 --quick

Everything runs in a network namespace of its own when the script runs as root
(Mooncake's clients listen on 0.0.0.0); otherwise, or with --loopback (for a host
that nothing outside can reach), on loopback, said so in the output. One process:
a master (P2PHANDSHAKE, no metadata server) and one Mooncake connection with a
segment of its own, so objects land in local memory (Mooncake's
memcpy path, as on one host of a fleet).

Rows (GB/s = 10^9 block bytes/s; every pass writes new keys and every loaded byte
is compared with what was stored, outside the timed part):

- raw: `batch_put_from(names, slot addresses, sizes)` / `batch_get_into(...)` of the
  whole pass in one call, from and into a registered pool (what the tier's data
  path reduces to, without headers, checksums, index or jobs);
- raw-multi: the calls the tier makes, without the tier:
  `batch_put_from_multi_buffers` / `batch_get_into_multi_buffers` of a 106-byte
  header (the slot's header area) and the block per object, in one call;
- tier: the same blocks as one store job and one load job through
  `MooncakeTier` (`batch_put_from_multi_buffers` with a header per object, the
  checksums, verification, the index), submit to result. Its quota holds every
  pass, so no timed store evicts (an eviction adds one `batch_remove`).

Fairness: the segment's memory is touched once before any timed pass (filled with
objects and emptied), and one warm-up round of every kind runs first, so no timed
pass pays first-touch page faults (each sample records the process's minor faults).
A round runs raw, raw-multi and tier back to back, the order alternating round by
round; `tier_vs_raw` is the median over rounds of each round's tier/raw throughput
ratio (the two passes of a pair see the same machine load), `ratio_of_medians` the
ratio of the kinds' median throughputs.

Lookup: the raw `batch_is_exist` round trip for one key, and the tier's probed
lookup of a key another engine stored (RETRY until the probe thread's
`batch_is_exist` answers, then HIT): p50/p99 over --lookups keys.
Results: bench/results/mooncake_bench.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvtiers.contract.clock import monotonic
from kvtiers.sdk import LookupResult, TransferJob
from kvtiers.testing import make_context, make_namespace
from kvtiers_mooncake.client import close_connections
from kvtiers_mooncake.tier import MooncakeTier

from tests.mooncake import netns
from tests.mooncake.master import Master

OUT = Path(__file__).parent / "results" / "mooncake_bench.json"
SHAPES = {"2MiB": (2 << 20, 64), "32KiB": (32 << 10, 4096)}
HEADER = 106  # a header's bytes for a 36-byte key (record.header_bytes(36))
KINDS = ("raw", "raw_multi", "tier")
LEASE_MS = 1000


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def wait_job(tier: MooncakeTier, job: TransferJob) -> Any:
    while True:
        for result in tier.get_finished_jobs():
            if result.job_id == job.job_id:
                return result
        time.sleep(0.0002)


class Shape:
    """One block size: a pool twice a pass, one tier over it, the raw calls on the
    tier's own connection (the same process, segment and registration)."""

    def __init__(self, master: Master, name: str, block: int, count: int, passes: int,
                 options: dict[str, Any]):
        self.name, self.block, self.count = name, block, count
        self.ctx = make_context(block, 2 * count, clock=monotonic,
                                namespace=make_namespace("bench/mooncake", block))
        pass_bytes = block * count
        # The quota holds every tier pass (no timed store evicts); the segment holds
        # them below the master's eviction watermark (0.90), with room for raw passes.
        self.segment_bytes = (passes + 4) * pass_bytes * 5 // 4 + (64 << 20)
        self.tier = MooncakeTier(self.ctx, {
            "master_address": master.address, "capacity_bytes": passes * pass_bytes,
            "segment_bytes": self.segment_bytes,
            "prefix": f"b{uuid.uuid4().hex[:8]}", "timeout_s": 30, **options})
        self.store = self.tier.client.conn.store
        self.config = self.tier.client.config
        self.pool = self.ctx.pool
        self.jobs = 0
        for slot in range(2 * count):  # random bytes, once: every pass stores them anew
            self.pool.block(slot)[:] = os.urandom(block)
        self.src = [bytes(self.pool.block(s)) for s in range(count)]
        self.prefault()

    def prefault(self) -> None:
        """Touch the whole segment once: fill it with objects, then remove them."""
        names: list[str] = []
        piece = max(1, (16 << 20) // self.block)
        address = self.tier.client.slot_address(0)
        # Up to the size of the segment: past the watermark the master evicts for room.
        while len(names) * self.block < self.segment_bytes:
            batch = [f"fill-{uuid.uuid4().hex}" for _ in range(piece)]
            codes = self.store.batch_put_from(batch, [address] * piece, [self.block] * piece,
                                              self.config)
            names += [n for n, c in zip(batch, codes, strict=True) if c == 0]
            if any(c != 0 for c in codes):
                break
        self.store.batch_remove(names, True)

    def addresses(self, first: int) -> list[int]:
        return [self.tier.client.slot_address(first + i) for i in range(self.count)]

    def poison(self) -> None:
        for slot in range(self.count, 2 * self.count):
            self.pool.block(slot)[:8] = b"\xde\xad\xbe\xef" * 2

    def check(self) -> None:
        for i in range(self.count):
            if bytes(self.pool.block(self.count + i)) != self.src[i]:
                raise AssertionError(f"{self.name}: block {i} came back wrong")

    def raw_pass(self) -> tuple[float, float]:
        names = [f"raw-{uuid.uuid4().hex}" for _ in range(self.count)]
        sizes = [self.block] * self.count
        t0 = time.perf_counter()
        codes = self.store.batch_put_from(names, self.addresses(0), sizes, self.config)
        t1 = time.perf_counter()
        assert all(c == 0 for c in codes), set(codes)
        self.poison()
        t2 = time.perf_counter()
        got = self.store.batch_get_into(names, self.addresses(self.count), sizes)
        t3 = time.perf_counter()
        assert all(g == self.block for g in got), set(got)
        self.check()
        self.store.batch_remove(names, True)
        return t1 - t0, t3 - t2

    def raw_multi_pass(self) -> tuple[float, float]:
        """The tier's calls without the tier: each object a 70-byte header (the
        slot's header area) and the block, `batch_put_from_multi_buffers` /
        `batch_get_into_multi_buffers`, nothing checked but the bytes."""
        names = [f"rawm-{uuid.uuid4().hex}" for _ in range(self.count)]
        head = self.tier.client.header_address
        src, dst = self.addresses(0), self.addresses(self.count)
        sizes = [[HEADER, self.block]] * self.count
        t0 = time.perf_counter()
        codes = self.store.batch_put_from_multi_buffers(
            names, [[head(i), a] for i, a in enumerate(src)], sizes, self.config)
        t1 = time.perf_counter()
        assert all(c == 0 for c in codes), set(codes)
        self.poison()
        t2 = time.perf_counter()
        got = self.store.batch_get_into_multi_buffers(
            names, [[head(self.count + i), a] for i, a in enumerate(dst)], sizes)
        t3 = time.perf_counter()
        assert all(g == HEADER + self.block for g in got), set(got)
        self.check()
        self.store.batch_remove(names, True)
        return t1 - t0, t3 - t2

    def tier_pass(self) -> tuple[float, float]:
        keys = [os.urandom(32) + bytes(4) for _ in range(self.count)]
        self.jobs += 1
        store = TransferJob(2 * self.jobs, keys, list(range(self.count)))
        t0 = time.perf_counter()
        self.tier.submit_store(store)
        result = wait_job(self.tier, store)
        t1 = time.perf_counter()
        assert result.success, result.failed
        self.poison()
        load = TransferJob(2 * self.jobs + 1, keys, list(range(self.count, 2 * self.count)))
        t2 = time.perf_counter()
        self.tier.submit_load(load)
        result = wait_job(self.tier, load)
        t3 = time.perf_counter()
        assert result.success, result.failed
        self.check()
        return t1 - t0, t3 - t2


def lookups(master: Master, n: int) -> dict[str, Any]:
    """Raw `batch_is_exist` of one key, and the tier's probed lookup of keys a
    second engine (another tier on its own pool) stored."""
    block = 32 << 10
    ns_ = make_namespace("bench/mooncake-lookup", block)
    writer_ctx = make_context(block, n, clock=monotonic, namespace=ns_)
    reader_ctx = make_context(block, 4, clock=monotonic, namespace=ns_)
    config = {"master_address": master.address, "capacity_bytes": 2 * n * block,
              "prefix": f"l{uuid.uuid4().hex[:8]}"}
    writer = MooncakeTier(writer_ctx, config)
    reader = MooncakeTier(reader_ctx, config)
    try:
        keys = [os.urandom(32) + bytes(4) for _ in range(n)]
        for slot in range(n):
            writer_ctx.pool.block(slot)[:] = os.urandom(block)
        job = TransferJob(1, keys, list(range(n)))
        writer.submit_store(job)
        assert wait_job(writer, job).success
        raw, probed = [], []
        store = writer.client.conn.store
        for key in keys:
            name = writer.names.block(key)
            t0 = time.perf_counter()
            assert store.batch_is_exist([name]) == [1]
            raw.append(time.perf_counter() - t0)
        for key in keys:
            t0 = time.perf_counter()
            answer = reader.lookup(key)
            while answer is LookupResult.RETRY:
                time.sleep(0.00005)
                answer = reader.lookup(key)
            probed.append(time.perf_counter() - t0)
            assert answer is LookupResult.HIT
        return {"raw_exist_us": percentiles(raw), "tier_probed_lookup_us": percentiles(probed),
                "tier_held_lookup_us": held_lookup(writer, keys)}
    finally:
        reader.close()
        writer.close()


def held_lookup(tier: MooncakeTier, keys: list[bytes]) -> dict[str, float]:
    """A key this engine stored: answered from its index."""
    times = []
    for key in keys:
        t0 = time.perf_counter()
        tier.lookup(key)
        times.append(time.perf_counter() - t0)
    return percentiles(times)


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": round(at(0.5) * 1e6, 1), "p99": round(at(0.99) * 1e6, 1)}


@contextlib.contextmanager
def place(loopback: bool) -> Iterator[tuple[netns.NetNamespace | None, str]]:
    why = "--loopback" if loopback else netns.available()
    if why is not None:
        yield None, f"loopback ({why})"
        return
    space = netns.NetNamespace()
    try:
        with space.entered():
            yield space, f"network namespace {space.name}"
    finally:
        space.delete()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--lookups", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="a quarter of the blocks")
    parser.add_argument("--json", type=Path, default=OUT)
    parser.add_argument("--shapes", nargs="*", choices=sorted(SHAPES), help="default: all")
    parser.add_argument("--threads", type=int, nargs=2, metavar=("LOAD", "STORE"),
                        help="the tier's threads (default: its own, 2 and 2)")
    parser.add_argument("--loopback", action="store_true",
                        help="no network namespace, even as root (only on a host that "
                        "nothing outside can reach)")
    args = parser.parse_args()
    with place(args.loopback) as (space, where), tempfile.TemporaryDirectory() as tmp:
        runner: Any = space
        if space is None:
            print(f"warning: {where}: Mooncake's listeners are reachable on every "
                  "interface while this runs", file=sys.stderr)
            runner = LoopbackRunner()
        # A 1 s lease (default 10 s): blocks read by a pass can be removed soon after.
        master = Master(runner, Path(tmp), lease_ms=LEASE_MS)
        master.start()
        try:
            results = run(master, args)
            results["lookups"] = lookups(master, args.lookups)
        finally:
            close_connections(master.address)
            master.stop()
    results["where"] = where
    results["master_lease_ms"] = LEASE_MS
    results["machine"] = f"{platform.node()} {platform.machine()} {os.cpu_count()} cores"
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["command"] = " ".join(["bench/mooncake_bench.py", *sys.argv[1:]])
    print_table(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


class LoopbackRunner:
    """`NetNamespace`'s calls, in the root namespace (a non-root run)."""

    name = "root"

    def command(self, *args: str) -> list[str]:
        return list(args)

    def run(self, fn: Any, *args: Any, timeout: float = 60.0) -> Any:
        return fn(*args)

    def free_port(self) -> int:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


def run(master: Master, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": args.runs, "shapes": {}}
    for name, (block, count) in SHAPES.items():
        if args.shapes and name not in args.shapes:
            continue
        count = count // 4 if args.quick else count
        options = {"threads": {"load": args.threads[0], "store": args.threads[1]}} \
            if args.threads else {}
        shape = Shape(master, name, block, count, passes=args.runs + 2, options=options)
        try:
            passes = {"raw": shape.raw_pass, "raw_multi": shape.raw_multi_pass,
                      "tier": shape.tier_pass}
            for fn in passes.values():  # warm-up: connections, the pool's pages
                fn()
            samples: dict[str, list[float]] = {f"{k}_{op}": [] for k in KINDS
                                               for op in ("store", "load")}
            pair: dict[str, list[float]] = {f"{k}_{op}": [] for k in ("tier", "raw_multi")
                                            for op in ("store", "load")}
            fault_counts: dict[str, list[int]] = {k: [] for k in KINDS}
            for r in range(args.runs):
                order = KINDS if r % 2 == 0 else tuple(reversed(KINDS))
                got: dict[str, tuple[float, float]] = {}
                for who in order:
                    before = faults()
                    got[who] = passes[who]()
                    fault_counts[who].append(faults() - before)
                for who, (put, get) in got.items():
                    samples[f"{who}_store"].append(block * count / put / 1e9)
                    samples[f"{who}_load"].append(block * count / get / 1e9)
                for who in ("tier", "raw_multi"):
                    pair[f"{who}_store"].append(got["raw"][0] / got[who][0])
                    pair[f"{who}_load"].append(got["raw"][1] / got[who][1])
            med = {k: round(statistics.median(v), 3) for k, v in samples.items()}
            ratio = {k: round(statistics.median(v), 3) for k, v in pair.items()}
            out["shapes"][name] = {
                "block_bytes": block, "blocks": count, "median_gbps": med,
                "tier_vs_raw": {"store": ratio["tier_store"], "load": ratio["tier_load"]},
                "raw_multi_vs_raw": {"store": ratio["raw_multi_store"],
                                     "load": ratio["raw_multi_load"]},
                "ratio_of_medians": {
                    "store": round(med["tier_store"] / med["raw_store"], 3),
                    "load": round(med["tier_load"] / med["raw_load"], 3)},
                "pair_ratio_range": {k: [round(min(v), 3), round(max(v), 3)]
                                     for k, v in pair.items()},
                "blocks_per_s": {k: round(v * 1e9 / block) for k, v in med.items()},
                "minor_faults_per_pass_max": {k: max(v) for k, v in fault_counts.items()},
                "samples_gbps": {k: [round(x, 3) for x in v] for k, v in samples.items()}}
        finally:
            shape.tier.close()
            close_connections(master.address)  # its segment and objects go with it
    return out


def print_table(r: dict[str, Any]) -> None:
    print(f"\nmooncake tier vs raw client ({r['where']}; {r['machine']}; medians of "
          f"{r['runs']} rounds; tier/raw: median of the rounds' ratios [range])")
    print(f"{'blocks':>16} {'op':>6} {'raw GB/s':>9} {'raw-multi':>10} {'tier GB/s':>10} "
          f"{'tier/raw':>9} {'range':>13} {'tier blocks/s':>14}")
    for name, s in r["shapes"].items():
        for op in ("store", "load"):
            med = s["median_gbps"]
            low, high = s["pair_ratio_range"]["tier_" + op]
            print(f"{s['blocks']:>5} x {name:>8} {op:>6} {med['raw_' + op]:>9.3f} "
                  f"{med['raw_multi_' + op]:>10.3f} {med['tier_' + op]:>10.3f} "
                  f"{s['tier_vs_raw'][op]:>9.2f} "
                  f"{f'{low:.2f}-{high:.2f}':>13} "
                  f"{s['blocks_per_s']['tier_' + op]:>14,}")
    lk = r["lookups"]
    print(f"lookup round trip (us): raw batch_is_exist p50 {lk['raw_exist_us']['p50']} "
          f"p99 {lk['raw_exist_us']['p99']}; tier probed (RETRY -> HIT) p50 "
          f"{lk['tier_probed_lookup_us']['p50']} p99 {lk['tier_probed_lookup_us']['p99']}; "
          f"tier held p50 {lk['tier_held_lookup_us']['p50']} p99 "
          f"{lk['tier_held_lookup_us']['p99']}")


if __name__ == "__main__":
    sys.exit(main())
