#!/usr/bin/env python3
"""kvtiers-p2p benchmark: pull throughput of the p2p tier against raw pyzmq zero-copy
between the same two processes in the same run, and the control plane's lookup
round trip, on loopback (and across two network namespaces with --netns).

    PYTHONPATH=kvtiers-core/src:kvtiers-p2p/src .venv/bin/python bench/p2p_bench.py
    ... bench/p2p_bench.py --netns      # also across a veth pair (root; made and removed)
    ... bench/p2p_bench.py --quick
    ... bench/p2p_bench.py --job-mib 256 # larger jobs (default 64 MiB of 32 KiB blocks,
                                         # 128 MiB of 2 MiB blocks)

Rows per data plane (zmq always; nixl when NIXL imports), median of --runs runs,
raw and p2p interleaved within each run; MB/s = 10^6 bytes/s of block bytes moved:
- raw, zmq: the serving process sends the blocks as zero-copy frames on request
  (one multipart message, no protocol, no checksums); the puller copies each frame
  into a slot of its pool - the floor of the ZeroMQ data plane;
- raw, nixl: one NIXL READ of every block from the server's registered pool into
  the puller's, no protocol, no checksums (the same two agents the tier uses, the
  same prepared descriptors): each key's block from its slot in the server's pool
  into the slot the tier's load gives it (the same bytes, the same places; the
  server's manager filled its pool from the top, so these pairs do not merge into
  one copy); `raw_contiguous_MBps` is the READ of server slot s into slot s (one
  merged copy: the baseline of the first measurements), in the same runs;
- raw xN, nixl: the same READ cut into N equal runs moved at once on the N NIXL
  agents of the tier's transfer streams (default 2): raw NIXL with the tier's
  parallelism (a copy within one host is CPU work: the tier's two streams use two
  cores, the single raw READ one); p2p/rawxN is the median of each run's ratio;
- p2p: an engine's request - the tier's lookups (its probe asks the server: on
  NIXL the lookup leases the blocks, the server pinning them and saying their
  slots and checksums; untimed, as they come a scheduler step or more before the
  load), then the tier's load of the same blocks as one job, timed: on NIXL it READs
  them under the lease with no round trip (`kvtiers_p2p.pull.leases`), verifying each
  block in its slot, and says Landed; on ZeroMQ it fetches them (below);
- p2p fetch: the same load again right after, with no lookup before it (the
  holder remembered, no lease: what a second load of the same blocks does): the
  server pins the blocks through its manager, checksums them, ships them (frames,
  or its slots for the puller to READ), pipelined in fetches (small first, then
  the server's pin budget), moved on the tier's transfer streams;
  with `--jobs K`, both loads as K jobs submitted at once (what an engine loading
  several requests does: their fetches overlap);
- lookup RTT: one key per Lookup through the real server (handshake once), p50/p99;
- p2p/raw: the ratio of the medians; per-run: the median of each run's ratio;
  fetch/raw: the median of each run's ratio for p2p fetch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "p2p_bench.json"


def _keys(n: int) -> list[bytes]:
    import hashlib

    from kvtiers.contract.keys import make_key

    return [make_key(hashlib.sha256(f"bench/{i}".encode()).digest()) for i in range(n)]


def serve(spec: dict[str, Any]) -> None:
    """The serving process: an engine with `n` blocks in its pool, and a raw ROUTER."""
    import threading

    import zmq
    from kvtiers.contract.clock import monotonic
    from kvtiers.contract.pool_view import PoolView
    from kvtiers.contract.tier import TierContext
    from kvtiers.manager import TieringOffloadingManager
    from kvtiers.policies.lru import LRUPolicy
    from kvtiers.testing import make_namespace
    from kvtiers_p2p.tier import P2PTier

    n, bb, host = spec["n"], spec["block_bytes"], spec["host"]
    pool = PoolView.anonymous(n, bb)
    ctx = TierContext(pool, make_namespace("bench", bb), clock=monotonic, name="p2p")
    tier = P2PTier(ctx, {"host": host, "port": 0, "limits": {"max_pinned_share": 1.0},
                         "data_plane": spec.get("plane", "zmq"),
                         "transfer_streams": spec.get("streams", 2)})
    mgr = TieringOffloadingManager(n, LRUPolicy.for_slots(n), [tier])
    tier.serve_external_requests(mgr)
    keys = _keys(n)
    out = mgr.prepare_store(keys)
    assert out is not None
    for slot in out.slots:
        pool.block(slot)[:] = os.urandom(bb)
    mgr.complete_store(keys)
    mgr.drain(30)

    zctx = zmq.Context()
    raw = zctx.socket(zmq.ROUTER)
    raw.setsockopt(zmq.LINGER, 0)
    raw_port = raw.bind_to_random_port(f"tcp://{host}")
    stop = threading.Event()

    def raw_server() -> None:
        while not stop.is_set():
            if raw.poll(50):
                ident, _ = raw.recv_multipart()
                frames = [zmq.Frame(pool.block(s)) for s in range(n)]
                raw.send_multipart([ident, *frames], copy=False)

    thread = threading.Thread(target=raw_server, daemon=True)
    thread.start()
    assert tier.server is not None
    print(json.dumps({"p2p": tier.server.endpoint, "raw": f"tcp://{host}:{raw_port}",
                      "slots": list(out.slots)}), flush=True)
    sys.stdin.read()
    stop.set()
    thread.join()
    raw.close(0)
    zctx.term()
    mgr.close()


def measure(spec: dict[str, Any], prefix: list[str]) -> dict[str, Any]:
    """Start a server (behind `prefix`), pull from it, return the figures."""
    import zmq
    from kvtiers.contract.clock import monotonic
    from kvtiers.contract.jobs import TransferJob
    from kvtiers.contract.lookup import LookupResult
    from kvtiers.contract.pool_view import PoolView
    from kvtiers.contract.tier import TierContext
    from kvtiers.testing import make_namespace
    from kvtiers_p2p.tier import P2PTier
    from kvtiers_p2p.wire.codec import decode_server, encode
    from kvtiers_p2p.wire.protocol import DataPlane, Lookup

    n, bb, runs = spec["n"], spec["block_bytes"], spec["runs"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "kvtiers-core" / "src"), str(ROOT / "kvtiers-p2p" / "src"), str(ROOT),
         *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])}
    server = subprocess.Popen([*prefix, sys.executable, __file__, "--serve", json.dumps(spec)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env)
    assert server.stdout is not None and server.stdin is not None
    ends = json.loads(server.stdout.readline())
    pool = PoolView.anonymous(n, bb)
    ctx = TierContext(pool, make_namespace("bench", bb), clock=monotonic, name="p2p")
    plane = spec.get("plane", "zmq")
    # Short-lived verdicts: each run's lookups ask the server again (and lease).
    tier = P2PTier(ctx, {"peers": [ends["p2p"]], "hit_ttl_s": 0.1,
                         "num_threads": spec.get("threads", 1), "data_plane": plane,
                         "transfer_streams": spec.get("streams", 2)})
    keys = _keys(n)
    try:
        def lookups() -> None:
            """The request's lookups until every key is a hit (the probe asks)."""
            time.sleep(0.15)  # the verdicts of the run before are stale
            end = time.monotonic() + 60
            # Every key asked each pass (all() would stop at the first RETRY: one
            # key probed per pass).
            while [tier.lookup(k) for k in keys].count(LookupResult.HIT) < n:
                assert time.monotonic() < end, "the p2p tier never saw the blocks"
                time.sleep(0.001)

        def load(first_id: int) -> float:
            """The tier's load of every key (as `--jobs` jobs), timed."""
            t1 = time.perf_counter()
            jobs = spec.get("jobs", 1)
            per = -(-n // jobs)
            for j, first in enumerate(range(0, n, per)):
                tier.submit_load(TransferJob(first_id + j, keys[first:first + per],
                                             list(range(first, min(n, first + per)))))
            assert tier.drain(120)
            results = tier.get_finished_jobs()
            t2 = time.perf_counter()
            assert len(results) == -(-n // per), results
            for result in results:
                assert result.success, result.reasons()
            return t2 - t1

        lookups()
        zctx = zmq.Context()
        raw = zctx.socket(zmq.DEALER)
        raw.connect(ends["raw"])
        raw_s, p2p_s, fetch_s, contig_s, par_s = [], [], [], [], []
        leased: list[int] = []
        streams = tier.nixl.streams if tier.nixl is not None else 1
        link = next(iter(tier.links.values()))
        # The server's slot of each key: the tier's load moves key i from there
        # into slot i, and so does the raw READ (the same bytes, the same places).
        pairs = list(zip(ends["slots"], range(n), strict=True))
        if plane == "nixl":
            # The raw baselines' own NIXL agents in this process (one, and one per
            # stream), connected to the server's like the tier's: no tier code in
            # their path.
            from kvtiers_p2p.wire.nixl_plane import NixlPlane

            assert link.nixl_peer is not None
            agent, desc = link.nixl_peer
            single = NixlPlane(pool, "raw")
            multi = NixlPlane(pool, "raw-streams", streams=streams) if streams > 1 else None
            for base in (single, multi):
                if base is not None:
                    _connect(base, desc, streams)
        for run in range(runs + 1):  # the first of each is a warm-up
            if run:  # the request's lookups (they lease), then the raw READs, its load
                lookups()
            if plane == "nixl":  # also the old baseline: slot s into slot s (merged)
                tc = time.perf_counter()
                state = single.read(agent, desc, [(s, s) for s in range(n)], 60.0)
                assert state == "DONE", state
                if run:
                    contig_s.append(time.perf_counter() - tc)
            t0 = time.perf_counter()
            if plane == "nixl":  # one READ of every block, key i into slot i
                state = single.read(agent, desc, pairs, 60.0)
                assert state == "DONE", state
            else:
                raw.send(b"go")
                frames = raw.recv_multipart(copy=False)
                for slot, frame in enumerate(frames):
                    pool.block(slot)[:] = frame.buffer
            raw_t = time.perf_counter() - t0
            if plane == "nixl" and multi is not None:  # the same READ cut over the streams
                tp = time.perf_counter()
                _parallel_read(multi, agent, desc, pairs, streams)
                if run:
                    par_s.append(time.perf_counter() - tp)
            held = link.leases.blocks
            p2p_t = load((run + 1) * 10000)
            fetch_t = load((run + 1) * 10000 + 5000)  # no lookup before it: no lease
            if run:
                raw_s.append(raw_t)
                p2p_s.append(p2p_t)
                fetch_s.append(fetch_t)
                leased.append(held)
        if plane == "nixl":
            single.close()
            if multi is not None:
                multi.close()
        # Lookup round trips through the real server.
        look = zctx.socket(zmq.DEALER)
        look.connect(ends["p2p"])
        look.send(encode(tier.identity.hello(DataPlane("zmq", n, pool.slot_bytes))))
        decode_server(look.recv())
        rtts = []
        for i in range(spec["lookups"]):
            t0 = time.perf_counter()
            look.send(encode(Lookup(i, [keys[i % n]])))
            decode_server(look.recv())
            rtts.append(time.perf_counter() - t0)
        raw.close(0)
        look.close(0)
        zctx.term()
    finally:
        tier.close()
        server.stdin.close()
        server.wait(60)
    moved = n * bb
    rtts.sort()
    return {
        "plane": plane, "block_bytes": bb, "blocks": n,
        "raw_MBps": moved / statistics.median(raw_s) / 1e6,
        "p2p_MBps": moved / statistics.median(p2p_s) / 1e6,
        "raw_MBps_runs": [moved / t / 1e6 for t in raw_s],
        **({"raw_contiguous_MBps": moved / statistics.median(contig_s) / 1e6,
            "raw_contiguous_MBps_runs": [moved / t / 1e6 for t in contig_s]}
           if contig_s else {}),
        "transfer_streams": streams,
        **({"raw_streams_MBps": moved / statistics.median(par_s) / 1e6,
            "raw_streams_MBps_runs": [moved / t / 1e6 for t in par_s],
            "p2p_over_raw_streams_median": statistics.median(
                r / p for r, p in zip(par_s, p2p_s, strict=True))}
           if par_s else {}),
        "p2p_MBps_runs": [moved / t / 1e6 for t in p2p_s],
        # blocks leased by each run's lookups when its load began (NIXL: all n)
        "leased_blocks_runs": leased,
        "p2p_fetch_MBps": moved / statistics.median(fetch_s) / 1e6,
        "p2p_fetch_MBps_runs": [moved / t / 1e6 for t in fetch_s],
        "p2p_fetch_over_raw_median": statistics.median(
            r / p for r, p in zip(raw_s, fetch_s, strict=True)),
        # per run: raw time / p2p time (the two interleaved), and their median
        "p2p_over_raw_runs": [r / p for r, p in zip(raw_s, p2p_s, strict=True)],
        "p2p_over_raw_median": statistics.median(r / p for r, p in zip(raw_s, p2p_s,
                                                                        strict=True)),
        "lookup_rtt_us_p50": rtts[len(rtts) // 2] * 1e6,
        "lookup_rtt_us_p99": rtts[int(len(rtts) * 0.99)] * 1e6,
    }


def _connect(plane: Any, desc: Any, streams: int) -> None:
    """Connect a baseline plane to the server's agent and wait until a READ on
    each of its streams goes through (UCX sets connections up lazily)."""
    remote = plane.connect(desc)
    for stream in range(plane.streams):
        end = time.monotonic() + 30
        while plane.read(remote, desc, [(0, 0)], 5.0, stream) != "DONE":
            assert time.monotonic() < end, "a baseline NIXL agent never reached the server"
            time.sleep(0.05)


def _parallel_read(plane: Any, agent: str, desc: Any, pairs: list[tuple[int, int]],
                   streams: int) -> None:
    """The raw READ of `pairs` cut into `streams` equal runs, each on a stream
    (NIXL agent) of its own, all at once: raw NIXL with the tier's parallelism."""
    import threading

    per = -(-len(pairs) // streams)
    states: list[str] = []

    def one(i: int) -> None:
        states.append(plane.read(agent, desc, pairs[i * per:(i + 1) * per], 60.0, i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert states == ["DONE"] * streams, states


def _nixl_imports() -> bool:
    from kvtiers_p2p.wire.nixl_plane import nixl_available

    return nixl_available()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=4,
                        help="the puller's num_threads (copier threads; the tier's default 4)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="the tier's load as that many jobs submitted together "
                             "(an engine loading several requests at once; default 1)")
    parser.add_argument("--streams", type=int, default=2,
                        help="the tiers' transfer_streams (NIXL READs at once; default 2)")
    parser.add_argument("--netns", action="store_true",
                        help="also measure across two network namespaces (needs root)")
    parser.add_argument("--planes", default="zmq,nixl",
                        help="data planes to measure, comma-separated (nixl: when it imports)")
    parser.add_argument("--sizes", default="32,2048",
                        help="block sizes in KiB, comma-separated (32: 2048 blocks, 2048: 64)")
    parser.add_argument("--job-mib", type=int, default=0,
                        help="MiB of blocks per load job, every size (default: 64 MiB of "
                             "32 KiB blocks, 128 MiB of 2 MiB blocks)")
    parser.add_argument("--no-loopback", action="store_true",
                        help="with --netns: only across the namespaces")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve))
        return
    if args.client:  # inside the puller's namespace
        spec = json.loads(args.client)
        print(json.dumps(measure(spec, spec.pop("prefix"))), flush=True)
        return
    scale = 4 if args.quick else 1
    counts = {32: 2048, 2048: 64}
    if args.job_mib < 0:
        parser.error(f"--job-mib must be positive, got {args.job_mib}")
    if args.jobs < 1 or args.streams < 1:
        parser.error(f"--jobs and --streams must be at least 1, got {args.jobs}, "
                     f"{args.streams}")
    cases = [(kib << 10, max(1, (args.job_mib << 20) // (kib << 10)) if args.job_mib else
              counts.get(kib, max(1, (64 << 20) // (kib << 10))) // scale)
             for kib in map(int, args.sizes.split(","))]
    wanted = args.planes.split(",")
    planes = [p for p in ("zmq", "nixl") if p in wanted and (p == "zmq" or _nixl_imports())]
    rows: list[dict[str, Any]] = []
    for plane in planes if not args.no_loopback else []:
        for bb, n in cases:
            spec = {"n": n, "block_bytes": bb, "runs": args.runs, "host": "127.0.0.1",
                    "lookups": 500 if args.quick else 2000, "plane": plane,
                    "threads": args.threads, "streams": args.streams, "jobs": args.jobs}
            rows.append({"where": "loopback", **measure(spec, [])})
    if args.netns:
        sys.path.insert(0, str(ROOT))
        from tests.p2p import netns

        with netns.veth_pair() as pair:
            for plane, (bb, n) in ((p, c) for p in planes for c in cases):
                spec = {"n": n, "block_bytes": bb, "runs": args.runs, "host": pair.addr_a,
                        "lookups": 500 if args.quick else 2000, "prefix": pair.prefix(pair.a),
                        "plane": plane, "threads": args.threads, "streams": args.streams,
                        "jobs": args.jobs}
                out = subprocess.run(
                    [*pair.prefix(pair.b), sys.executable, __file__, "--client",
                     json.dumps(spec)], capture_output=True, text=True, check=True,
                    timeout=600, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                        [str(ROOT / "kvtiers-core" / "src"), str(ROOT / "kvtiers-p2p" / "src"),
                         str(ROOT), os.environ.get("PYTHONPATH", "")])})
                rows.append({"where": "netns veth", **json.loads(out.stdout.splitlines()[-1])})
    header = (f"{'where':<11} {'plane':<5} {'block':>7} {'blocks':>6} {'raw MB/s':>9} "
              f"{'p2p MB/s':>9} {'p2p/raw':>8} {'per-run':>8} {'fetch/raw':>9} "
              f"{'raw xN MB/s':>12} {'p2p/rawxN':>9} {'lookup p50 us':>14} {'p99 us':>8}")
    print(header)
    for r in rows:
        par = (f"{r['raw_streams_MBps']:>12.0f} {r['p2p_over_raw_streams_median']:>9.2f}"
               if "raw_streams_MBps" in r else f"{'-':>12} {'-':>9}")
        print(f"{r['where']:<11} {r['plane']:<5} {r['block_bytes'] >> 10:>6}K {r['blocks']:>6} "
              f"{r['raw_MBps']:>9.0f} {r['p2p_MBps']:>9.0f} "
              f"{r['p2p_MBps'] / r['raw_MBps']:>8.2f} {r['p2p_over_raw_median']:>8.2f} "
              f"{r['p2p_fetch_over_raw_median']:>9.2f} {par} "
              f"{r['lookup_rtt_us_p50']:>14.0f} {r['lookup_rtt_us_p99']:>8.0f}")
    doc = {"machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
                      f"Python {platform.python_version()}",
           "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": args.runs,
           "threads": args.threads, "streams": args.streams, "jobs": args.jobs,
           "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
