#!/usr/bin/env python3
"""Same-run comparison through vLLM's real scheduler on CPU, on every supported vLLM
version: one multi-turn, shared-prefix workload, four offloading stacks, each with an
fs tier under vLLM's CPU pool:

- vllm-tiering: vLLM's own `TieringOffloadingSpec` with its `fs` tier;
- kvtiers-tier: vLLM's `TieringOffloadingSpec` with kvtiers' fs tier under it
  (level 1, `kvtiers_vllm.tier.KvtiersTier`);
- kvtiers-spec: `KvtiersOffloadingSpec` (level 2): kvtiers' manager and fs tier,
  the engine being the fs root's only writer (`"shared": false`: a block kvtiers'
  index lacks is a miss at once); kvtiers-spec-shared: the same with the fs tier's
  default (`"shared": true`: an unknown block is probed first, RETRY, as vLLM's fs
  tier always does).

    PYTHONPATH=kvtiers-core/src:kvtiers-fs/src:kvtiers-vllm/src:. \\
        .venv/bin/python bench/vllm_compare.py [--runs 5] [--quick] [--vllm ...]

Which vLLM (`--vllm`, repeatable): `installed` (this environment's own) or a folder
holding another vLLM installed with `pip install --target` (put first on PYTHONPATH,
as `make`'s `.venv/vllm-0.34`); by default this environment's own and every
`<venv>/vllm-*` folder. Each version runs in a worker process of its own (one vLLM per
process), the versions taking turns run by run, the order rotating: a slow spell of
the machine falls on both. A vLLM that kvtiers-vllm does not support is refused,
naming it and the supported ones.

The workload: `--sessions` conversations share a system prompt of `--system-blocks`
blocks; each has `--turns` turns, a turn's prompt being the conversation so far (its
previous prompts and answers) plus `--user-blocks` new blocks, and its answer
`--answer-tokens` tokens. A round takes one turn of every session, `--concurrency`
sessions at a time (a wave); after each wave the GPU prefix cache is reset, so every
reuse comes from the offloading stack. The harness (tests/vllm/harness.py) drives the
engine: its CPU memcpy worker stands for vLLM's CUDA worker, and every page a load
writes is checked against the bytes the "model" wrote for those tokens.

Scenarios (`--scenario`, default all; each changes the defaults as said):
- fits: the whole working set (~330 blocks) fits the CPU pool (512 slots): every
  reuse is a CPU hit, fs only takes copies;
- pressure: it does not (128 slots; a wave's ~90 blocks fit): older turns come back
  from fs;
- overload: 8 sessions at once in 64 slots: not even a wave fits, promotions evict
  each other, stores are refused, copies down queue up.

Figures, per stack (median of `--runs` runs, the stacks' order rotating):
- hit rate: blocks loaded from the offloading stack / blocks an ideal cache would
  serve (the leading full blocks of a wave's prompts that an earlier wave computed,
  each once);
- scheduler CPU time per step, p50 and p99 (µs): the scheduler thread's CPU time
  (`time.thread_time_ns`) in `Scheduler.schedule()` plus `update_from_output()`,
  which make every call into the offloading manager, over the steps that scheduled
  tokens (tier I/O runs on the tiers' threads and is not in it); `sched_cpu_s_all`:
  the same over every step, waiting and settling ones included;
- the offloading manager's part of it: per step (p50, p99), in total, and its share
  of the scheduler's CPU time over every step: the connector's calls into the
  manager (every method of the installed vLLM's `OffloadingManager` interface) made
  inside those two, where the stacks differ (the rest is vLLM's scheduler, the same
  code for all);
- bytes verified; steps that scheduled tokens, that waited on a tier, that let the
  tiers finish their writes after a wave; wall seconds.

CPU times are net of the metering: reading a thread's CPU clock is a system call
(~1 µs on a VM) and a step makes tens of manager calls, so what a metered call adds,
outside it and inside it, is measured (`MeterCost`) before each scenario's run and
taken off per call. Each version's file also holds, per scenario, the run-by-run
ratios of kvtiers-spec to vllm-tiering and the percentiles of every step of every
run pooled.

Writes one JSON per vLLM version, bench/results/vllm_compare_vllm-<version>_<machine>.json
(`--machine`, default `<host>-<cpus>cpu`), and prints each scenario's table with the
versions side by side (bench/vllm_compare_report.py prints them again from the files).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]
# vLLM warns on every refused store ("cannot store chunks"): the figures say it.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import vllm_compare_report as report  # noqa: E402

STACKS = ("vllm-tiering", "kvtiers-tier", "kvtiers-spec", "kvtiers-spec-shared")
RESULTS = ROOT / "bench" / "results"
#: name -> (what it changes in the defaults, what it shows)
SCENARIOS: dict[str, tuple[dict[str, Any], str]] = {
    "fits": (
        {"pool_chunks": 512},
        "the whole working set fits the CPU pool (512 slots): every reuse is a CPU hit",
    ),
    "pressure": (
        {},
        "the working set does not fit the CPU pool (128 slots, a wave's part does): "
        "older turns come back from fs",
    ),
    "overload": (
        {"pool_chunks": 64, "concurrency": 8},
        "8 sessions at once in a 64-slot pool: promotions evict each other, stores are "
        "refused, copies down queue up",
    ),
}
THREADS = 4  # I/O threads per direction, the same for every fs tier


# --- one stack, one run (in a worker process, on its vLLM) ------------------------------


def stack_config(stack: str, fs_root: Path, pool_chunks: int, fs_bytes: int) -> dict[str, Any]:
    """The kv_connector_extra_config of one stack (its spec made by the harness)."""
    from kvtiers_vllm.spec import KvtiersOffloadingSpec
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    from tests.vllm import harness as h

    common = {
        "cpu_bytes_to_use": pool_chunks * h.PAGE * h.LAYERS,
        "eviction_policy": "lru",
        "offload_prompt_only": False,  # answers are part of the next turn's prefix
        "spec_module_path": h.SPEC_MODULE,
    }
    if stack == "vllm-tiering":
        h.cpu_worker_spec(TieringOffloadingSpec, "BenchVllmTiering")
        tier = {"type": "fs", "root_dir": str(fs_root),
                "n_read_threads": THREADS, "n_write_threads": THREADS}  # fmt: skip
        return {**common, "spec_name": "BenchVllmTiering", "secondary_tiers": [tier]}
    if stack == "kvtiers-tier":
        h.cpu_worker_spec(TieringOffloadingSpec, "BenchKvtiersTier")
        inner = {"type": "fs", "root_dir": str(fs_root), "capacity_bytes": fs_bytes,
                 "threads": {"load": THREADS, "store": THREADS}}  # fmt: skip
        tier = {"type": "KvtiersTier", "module_path": "kvtiers_vllm.tier", "tier": inner}
        return {**common, "spec_name": "BenchKvtiersTier", "secondary_tiers": [tier]}
    h.cpu_worker_spec(KvtiersOffloadingSpec, "BenchKvtiersSpec")
    # This engine is the only writer of its fs root: kvtiers' index is the whole
    # truth, a block it lacks is a miss at once ("shared": false). The "-shared" row
    # keeps the default (others may write: an unknown block is probed, RETRY), as
    # vLLM's fs tier always does.
    tier = {"type": "fs", "root_dir": str(fs_root), "capacity_bytes": fs_bytes,
            "n_read_threads": THREADS, "n_write_threads": THREADS,
            "shared": stack == "kvtiers-spec-shared"}  # fmt: skip
    return {**common, "spec_name": "BenchKvtiersSpec", "secondary_tiers": [tier]}


def manager_calls() -> list[str]:
    """The installed vLLM's `OffloadingManager` methods the connector calls (`touch` on
    0.33 only), less `lock` (a context the connector enters), `shutdown` and
    `config_info`'s metadata."""
    from vllm.v1.kv_offload.base import OffloadingManager

    skip = {"lock", "shutdown"}
    return sorted(
        name for name, value in vars(OffloadingManager).items()
        if callable(value) and not name.startswith("_") and name not in skip
    )  # fmt: skip


class CpuMeter:
    """The calling thread's CPU time (ns) in the wrapped calls and their number: since
    the last `take()` and in all (`total`, `calls`). A wrapped call made inside another
    is counted once (in the outer); with a `within` meter, only calls made inside one
    of its calls count (the manager's calls from the scheduler step, not the harness's)."""

    def __init__(self, within: CpuMeter | None = None) -> None:
        self.total = self.calls = 0
        self._slot = self._slot_calls = self._depth = 0
        self._within = within

    def wrap(self, obj: Any, name: str) -> None:
        inner = getattr(obj, name)

        def wrapper(*args: Any, **kw: Any) -> Any:
            if self._depth or (self._within is not None and not self._within._depth):
                return inner(*args, **kw)
            self._depth += 1
            start = time.thread_time_ns()
            try:
                return inner(*args, **kw)
            finally:
                spent = time.thread_time_ns() - start
                self._depth -= 1
                self._slot += spent
                self._slot_calls += 1

        setattr(obj, name, wrapper)

    def take(self) -> tuple[int, int]:
        """(ns, calls) since the last take."""
        spent, calls = self._slot, self._slot_calls
        self.total += spent
        self.calls += calls
        self._slot = self._slot_calls = 0
        return spent, calls


@dataclass(frozen=True)
class MeterCost:
    """What metering one call costs (ns): `outer`, seen by a meter around the caller
    (the scheduler's, around each manager call); `inner`, inside the call's own
    measurement. The figures are given net of both: on this machine reading a thread's
    CPU clock is a system call, ~1 µs, and a step makes tens of manager calls."""

    outer: float
    inner: float

    @classmethod
    def measure(cls, n: int = 20000, repeat: int = 5) -> MeterCost:
        class Empty:
            def call(self) -> None:
                return None

        outer, inner = [], []
        for _ in range(repeat):
            bare, metered = Empty(), Empty()
            meter = CpuMeter()
            meter.wrap(metered, "call")
            timings = []
            for target in (bare, metered):
                start = time.thread_time_ns()
                for _ in range(n):
                    target.call()
                timings.append(time.thread_time_ns() - start)
            outer.append(max(0.0, (timings[1] - timings[0]) / n))
            inner.append(meter.take()[0] / n)
        return cls(statistics.median(outer), statistics.median(inner))


class Ideal:
    """Which full blocks earlier requests computed: a request's leading blocks in
    that set are what a perfect cache serves it."""

    def __init__(self, block: int) -> None:
        self._block = block
        self._seen: set[tuple[int, ...]] = set()

    def reusable(self, tokens: list[int]) -> set[tuple[int, ...]]:
        """The leading blocks of `tokens` computed before (each named by its prefix)."""
        found = set()
        for i in range((len(tokens) - 1) // self._block):  # the last token is computed
            prefix = tuple(tokens[: (i + 1) * self._block])
            if prefix not in self._seen:
                break
            found.add(prefix)
        return found

    def computed(self, tokens: list[int]) -> None:
        for i in range(len(tokens) // self._block):
            self._seen.add(tuple(tokens[: (i + 1) * self._block]))


class Stalled(RuntimeError):
    """A turn did not finish within `max_steps` steps."""


def run_stack(
    stack: str, p: dict[str, Any], model: Path, seed: int, cost: MeterCost
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """One run of the workload through `stack`: its figures, net of `cost`, and the
    scheduler's and the manager's CPU µs of each step that scheduled tokens."""
    from tests.vllm import harness as h

    work = Path(tempfile.mkdtemp(prefix=f"vllm-compare-{stack}-"))
    fs_root = work / "fs"
    fs_root.mkdir()
    cfg = stack_config(stack, fs_root, p["pool_chunks"], 1 << 30)
    engine = h.Engine(model, cfg, num_blocks=p["gpu_blocks"], max_num_seqs=p["concurrency"],
                      max_num_batched_tokens=2048)  # fmt: skip
    sched = CpuMeter()
    manager = CpuMeter(within=sched)
    sched.wrap(engine.scheduler, "schedule")
    sched.wrap(engine.scheduler, "update_from_output")
    for method in manager_calls():
        manager.wrap(engine.manager, method)
    rng = random.Random(seed)
    system = [rng.randrange(h.VOCAB) for _ in range(p["system_blocks"] * h.BLOCK)]
    history = {s: list(system) for s in range(p["sessions"])}
    ideal = Ideal(h.BLOCK)
    ideal_blocks = loaded = wait_steps = settle_steps = 0
    busy_steps: list[float] = []
    manager_steps: list[float] = []
    gc.collect()  # the previous run's garbage is not this one's to collect
    start = time.perf_counter()
    try:
        for turn in range(p["turns"]):
            for first in range(0, p["sessions"], p["concurrency"]):
                wave = range(first, min(first + p["concurrency"], p["sessions"]))
                requests = {}
                wanted: set[tuple[int, ...]] = set()
                for s in wave:
                    user = [rng.randrange(h.VOCAB) for _ in range(p["user_blocks"] * h.BLOCK)]
                    prompt = history[s] + user
                    wanted |= ideal.reusable(prompt)
                    requests[s] = engine.add(f"s{s}t{turn}", prompt, p["answer_tokens"])
                # A block several requests of the wave share is loaded once (vLLM's
                # prefix cache serves the others).
                ideal_blocks += len(wanted)
                sched.take(), manager.take()  # adding requests is not a step
                for _ in range(p["max_steps"]):
                    result = engine.step()
                    loaded += result.loaded_pages
                    (step_ns, _), (manager_ns, calls) = sched.take(), manager.take()
                    if result.output.num_scheduled_tokens:
                        busy_steps.append(max(0.0, step_ns - calls * cost.outer))
                        manager_steps.append(max(0.0, manager_ns - calls * cost.inner))
                    if not engine.scheduler.requests:
                        break
                    if not result.output.num_scheduled_tokens:
                        wait_steps += 1
                        time.sleep(0.001)  # waiting on a tier's thread
                else:
                    raise Stalled(f"{stack}: turn {turn} did not finish")
                for s, request in requests.items():
                    history[s] = list(request.all_token_ids)
                    ideal.computed(history[s][: len(history[s]) - 1])
                settle_steps += settle(engine)
                engine.scheduler.reset_prefix_cache()
        wall = time.perf_counter() - start
        checked = engine.pages_checked
        sched.take(), manager.take()
    finally:
        engine.close()
        shutil.rmtree(work, ignore_errors=True)
    us = sorted(ns / 1000 for ns in busy_steps)
    mus = sorted(ns / 1000 for ns in manager_steps)
    sched_all = sched.total - manager.calls * cost.outer
    manager_all = manager.total - manager.calls * cost.inner
    figures = {
        "hit_rate": loaded / ideal_blocks if ideal_blocks else 0.0,
        "loaded_blocks": loaded,
        "ideal_blocks": ideal_blocks,
        "sched_us_p50": percentile(us, 50),
        "sched_us_p99": percentile(us, 99),
        "sched_cpu_s_total": sum(us) / 1e6,
        "sched_cpu_s_all": sched_all / 1e9,
        "manager_us_p50": percentile(mus, 50),
        "manager_us_p99": percentile(mus, 99),
        "manager_cpu_s_total": sum(mus) / 1e6,
        "manager_cpu_s_all": manager_all / 1e9,
        "manager_share": manager_all / sched_all if sched_all > 0 else 0.0,
        "manager_calls": manager.calls,
        "busy_steps": len(us),
        "wait_steps": wait_steps,
        "settle_steps": settle_steps,
        "bytes_verified": checked * h.PAGE * h.LAYERS,
        "wall_s": wall,
    }
    return figures, {"sched": us, "manager": mus}


def settle(engine: Any, max_steps: int = 2000) -> int:
    """Let the tiers finish their writes (every stack gets the same chance); the
    steps that took."""
    for steps in range(max_steps):
        if not engine.busy():
            return steps
        engine.step()
        time.sleep(0.002)
    raise RuntimeError("offloading still busy after the turn")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


# --- the worker process: one vLLM, runs on request -------------------------------------


def serve() -> int:
    """The worker's loop: say which vLLM this is (or why it is refused), then answer
    each request line ({"scenario", "params", "run"}) on stdin with one line of
    results. Only those lines go to stdout; everything else printed goes to stderr."""
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(doc: dict[str, Any]) -> None:
        results.write(json.dumps(doc) + "\n")

    from kvtiers_vllm.compat.versions import UnsupportedVllmError, require_vllm

    try:
        version = require_vllm()
    except UnsupportedVllmError as exc:
        send({"error": f"bench/vllm_compare.py: {exc}"})
        return 2
    import vllm

    if vllm.__version__ != version:
        send({"error": f"bench/vllm_compare.py: vLLM {vllm.__version__} imported from "
                       f"{vllm.__file__}, but the installed metadata says {version}"})  # fmt: skip
        return 2
    from tests.vllm import harness as h

    stacks = list(STACKS)
    skipped = {}
    try:
        import kvtiers_vllm.tier  # noqa: F401
    except ImportError as exc:
        stacks.remove("kvtiers-tier")
        skipped["kvtiers-tier"] = f"kvtiers_vllm.tier (level 1) does not import: {exc}"
    model = h.write_tiny_llama(Path(tempfile.mkdtemp(prefix="vllm-compare-model-")))
    send({"vllm": version, "vllm_file": vllm.__file__, "stacks": stacks, "skipped": skipped,
          "manager_calls": manager_calls()})  # fmt: skip
    try:
        for line in sys.stdin:
            request = json.loads(line)
            run, p = request["run"], request["params"]
            order = stacks[run % len(stacks) :] + stacks[: run % len(stacks)]
            out: dict[str, Any] = {"results": {}, "steps": {}, "stalled": {}}
            cost = MeterCost.measure()  # under this moment's load
            for stack in order:
                load = os.getloadavg()[0]
                try:
                    figures, steps = run_stack(stack, p, model, 1000 + run, cost)
                except Stalled as exc:  # said and counted, not a figure
                    out["stalled"][stack] = str(exc)
                    print(f"[vLLM {version}] run {run + 1} {request['scenario']} {stack}: "
                          f"STALLED ({exc})", flush=True)  # fmt: skip
                    continue
                figures |= {"run": run, "load_avg": load, "meter_outer_ns": cost.outer,
                            "meter_inner_ns": cost.inner}  # fmt: skip
                out["results"][stack] = figures
                out["steps"][stack] = steps
                print(
                    f"[vLLM {version}] run {run + 1} {request['scenario']} {stack}: "
                    + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()),
                    flush=True,
                )
            send(out)
    finally:
        shutil.rmtree(model, ignore_errors=True)
    return 0


# --- the driver: one worker per vLLM, taking turns -------------------------------------


class Worker:
    """A worker process on one vLLM (`where`: "installed", or a folder put first on
    PYTHONPATH)."""

    def __init__(self, where: str) -> None:
        self.where = where
        env = dict(os.environ)
        if where != "installed":
            env["PYTHONPATH"] = os.pathsep.join(
                [str(Path(where).resolve()), *filter(None, [env.get("PYTHONPATH")])]
            )
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.hello = self._read()
        if "error" in self.hello:
            self.close()
            raise SystemExit(f"{self.hello['error']} (--vllm {where})")
        self.version: str = self.hello["vllm"]

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise SystemExit(f"bench/vllm_compare.py: the worker on --vllm {self.where} "
                             f"exited ({code}); its error is above")  # fmt: skip
        doc: dict[str, Any] = json.loads(line)
        return doc

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        stdin: IO[str] | None = self._proc.stdin
        assert stdin is not None
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        return self._read()

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def default_vllms() -> list[str]:
    """This environment's own vLLM and every vLLM installed beside it (`<venv>/vllm-*`)."""
    return ["installed", *(str(d) for d in sorted(Path(sys.prefix).glob("vllm-*")) if d.is_dir())]


def source_state() -> dict[str, Any]:
    """Which kvtiers code ran: the commit, the files changed since (kvtiers-vllm,
    kvtiers-core), the newest change, and a digest of their sources."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "--no-optional-locks", *args], cwd=ROOT,
                              capture_output=True, text=True, check=False)  # fmt: skip
        return done.stdout.strip()

    dirs = ["kvtiers-vllm/src", "kvtiers-core/src", "kvtiers-fs/src"]
    files = sorted(f for d in dirs for f in (ROOT / d).rglob("*.py"))
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    newest = max(files, key=lambda f: f.stat().st_mtime)
    return {
        "commit": git("rev-parse", "HEAD"),
        "changed": git("status", "--porcelain", "--", *dirs).splitlines(),
        "newest_file": str(newest.relative_to(ROOT)),
        "newest_mtime_utc": datetime.fromtimestamp(newest.stat().st_mtime, UTC).isoformat(
            timespec="seconds"
        ),
        "sources_sha256": digest.hexdigest()[:16],
    }


def drive(args: argparse.Namespace, argv: Sequence[str]) -> int:
    where = args.vllm or default_vllms()
    workers: list[Worker] = []
    try:
        for w in where:
            workers.append(Worker(w))
            print(f"--vllm {w}: vLLM {workers[-1].version}", flush=True)
        versions = [w.version for w in workers]
        if len(set(versions)) != len(versions):
            raise SystemExit(f"bench/vllm_compare.py: two --vllm run the same vLLM: "
                             f"{dict(zip(where, versions, strict=True))}")  # fmt: skip
        chosen = SCENARIOS if args.scenario == "all" else {args.scenario: SCENARIOS[args.scenario]}
        params = {
            name: {**{k: v for k, v in vars(args).items() if k in PARAMS}, **overrides}
            for name, (overrides, _) in chosen.items()
        }
        # version -> scenario -> stack -> one entry per run
        raw: dict[str, dict[str, dict[str, list[dict[str, float]]]]] = {
            w.version: {n: {s: [] for s in w.hello["stacks"]} for n in chosen} for w in workers
        }
        stalled: dict[str, dict[str, dict[str, int]]] = {
            w.version: {n: {} for n in chosen} for w in workers
        }
        pooled: dict[str, dict[str, dict[str, dict[str, list[float]]]]] = {
            w.version: {n: {} for n in chosen} for w in workers
        }
        loads: list[float] = []
        start = time.time()
        for run in range(args.runs):
            for k, name in enumerate(chosen):
                turn = (run + k) % len(workers)
                for w in workers[turn:] + workers[:turn]:
                    print(f"== run {run + 1}/{args.runs}, {name}, vLLM {w.version}", flush=True)
                    loads.append(os.getloadavg()[0])
                    got = w.ask({"scenario": name, "params": params[name], "run": run})
                    for stack, figures in got["results"].items():
                        raw[w.version][name][stack].append(figures)
                        pooled[w.version][name].setdefault(stack, {"sched": [], "manager": []})
                        for part, values in got["steps"][stack].items():
                            pooled[w.version][name][stack][part] += values
                    for stack in got["stalled"]:
                        stalled[w.version][name][stack] = stalled[w.version][name].get(stack, 0) + 1
        loads.append(os.getloadavg()[0])
        wall = time.time() - start
    finally:
        for w in workers:
            w.close()
    docs = []
    common = {
        "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(argv),
        "pythonpath": os.environ.get("PYTHONPATH", ""),
        "machine": machine_info(args.machine),
        "load_avg": {"min": min(loads), "max": max(loads)},
        "bench_wall_s": wall,
        "source": source_state(),
        "versions_interleaved": versions,
        "goal": report.GOAL,
    }
    for w in workers:
        scenarios = {}
        for name, (_, what) in chosen.items():
            runs = {s: r for s, r in raw[w.version][name].items() if r}
            summaries = {s: report.summarize(r) for s, r in runs.items()}
            median = {s: m for s, (m, _) in summaries.items()}
            scenarios[name] = {
                "what": what,
                "params": params[name],
                "median": median,
                "range": {s: r for s, (_, r) in summaries.items()},
                "goal": report.goal(median),
                "paired_ratios": report.paired_ratios(runs),
                "pooled_steps": {
                    s: {
                        f"{part}_us_p{q}": percentile(sorted(v), q)
                        for part, v in parts.items()
                        for q in (50, 99)
                    }
                    | {"steps": len(parts["sched"])}
                    for s, parts in pooled[w.version][name].items()
                },  # fmt: skip
                "runs": runs,
                "stalled_runs": stalled[w.version][name],
            }
        doc = {
            "what": f"bench/vllm_compare.py: vLLM {w.version}'s real scheduler on CPU, "
            "multi-turn shared-prefix workload",
            "vllm": w.version,
            "vllm_from": w.where,
            **common,
            "skipped": w.hello["skipped"],
            "manager_calls_wrapped": w.hello["manager_calls"],
            "scenarios": scenarios,
        }
        out = args.out_dir / f"vllm_compare_vllm-{w.version}_{args.machine}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        doc["history"] = previous_history(out)
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {out}")
        docs.append(doc)
    print()
    print(report.side_by_side(docs))
    for doc in docs:
        for name, entry in doc["scenarios"].items():
            for stack, n in entry["stalled_runs"].items():
                print(f"(vLLM {doc['vllm']} {name} {stack}: {n} of {args.runs} runs stalled, "
                      "left out of its figures)")  # fmt: skip
        for stack, why in doc["skipped"].items():
            print(f"(vLLM {doc['vllm']}: {stack} not run: {why})")
    return 0


def previous_history(path: Path) -> list[Any]:
    """The `"history"` of the result file being replaced (earlier runs worth keeping,
    newest first, as `{"date", "machine", "note", "result"}`), or none."""
    try:
        history = json.loads(path.read_text()).get("history", [])
    except (OSError, ValueError, AttributeError):
        return []
    return history if isinstance(history, list) else []


def machine_info(name: str) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"name": name, "cpus": os.cpu_count() or 0, "cpu": model,
            "python": platform.python_version(), "platform": platform.platform()}  # fmt: skip


#: The workload's parameters (the rest of the command line is the driver's).
PARAMS = ("sessions", "concurrency", "turns", "system_blocks", "user_blocks",
          "answer_tokens", "pool_chunks", "gpu_blocks", "max_steps")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4, help="sessions in flight at once")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-blocks", type=int, default=8)
    p.add_argument("--user-blocks", type=int, default=4)
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--pool-chunks", type=int, default=128,
                   help="CPU pool slots (a scenario that sets its own wins)")  # fmt: skip
    p.add_argument("--gpu-blocks", type=int, default=512)
    # Steps without scheduled tokens (waiting on a tier's thread) sleep 1 ms: on a
    # loaded machine a turn may wait that long for the fs threads.
    p.add_argument("--max-steps", type=int, default=30000)
    p.add_argument("--scenario", choices=["all", *SCENARIOS], default="all")
    p.add_argument("--quick", action="store_true", help="2 runs, 3 turns (a smoke run)")
    p.add_argument("--vllm", action="append", metavar="installed|DIR",
                   help="a vLLM to run on (repeatable; default: this environment's own "
                        "and every <venv>/vllm-* folder)")  # fmt: skip
    p.add_argument("--machine", default=f"{platform.node() or 'host'}-{os.cpu_count()}cpu",
                   help="the machine's name in the result files' names")  # fmt: skip
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return serve()
    if args.quick:
        args.runs, args.turns = 2, 3
    return drive(args, ["bench/vllm_compare.py", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
