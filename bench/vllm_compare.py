#!/usr/bin/env python3
"""Same-run comparison through vLLM 0.33's real scheduler on CPU: one multi-turn,
shared-prefix workload, three offloading stacks, each with an fs tier under a CPU
pool too small for the workload:

- (a) vllm-tiering: vLLM's own `TieringOffloadingSpec` with its `fs` tier;
- (b) kvtiers-tier: vLLM's `TieringOffloadingSpec` with kvtiers' fs tier under it
  (level 1, `kvtiers_vllm.tier.KvtiersTier`; skipped, and said so, when that module
  is not there);
- (c) kvtiers-spec: `KvtiersOffloadingSpec` (level 2): kvtiers' manager and fs tier,
  the engine being the fs root's only writer (`"shared": false`: a block kvtiers'
  index lacks is a miss at once); kvtiers-spec-shared: the same with the fs tier's
  default (`"shared": true`: an unknown block is probed first, RETRY, as vLLM's fs
  tier always does).

    PYTHONPATH=kvtiers-core/src:kvtiers-fs/src:kvtiers-vllm/src:. \\
        .venv/bin/python bench/vllm_compare.py [--runs 5] [--quick]

The workload: `--sessions` conversations share a system prompt of `--system-blocks`
blocks; each has `--turns` turns, a turn's prompt being the conversation so far (its
previous prompts and answers) plus `--user-blocks` new blocks, and its answer
`--answer-tokens` tokens. A round takes one turn of every session, `--concurrency`
sessions at a time (a wave); after each wave the GPU prefix cache is reset, so every
reuse comes from the offloading stack: a wave's working set fits the CPU pool
(`--pool-chunks`), all the conversations do not, so older turns come back from fs.
The harness (tests/vllm/harness.py) drives the engine: its CPU memcpy worker stands
for vLLM's CUDA worker, and every page a load writes is checked against the bytes the
"model" wrote for those tokens ("bytes verified").

Figures, per stack (median of `--runs` interleaved runs, the stacks' order rotating):

- hit rate: blocks loaded from the offloading stack / blocks an ideal cache would
  serve: the leading full blocks of a wave's prompts that an earlier wave computed,
  each once (requests of one wave sharing a block load it once);
- scheduler CPU time per step, p50 and p99 (µs): the scheduler thread's CPU time
  (`time.thread_time_ns`) in `Scheduler.schedule()` plus `update_from_output()`,
  which run every call into the offloading manager, over the steps that scheduled
  tokens (tier I/O runs on the tiers' threads and is not in it);
- the offloading manager's share of it, per step (p50, p99) and in total: the CPU
  time of the connector's calls into the manager (`MANAGER_CALLS`), the part of the
  step where the stacks differ (the rest is vLLM's scheduler, the same for all);
- bytes verified, steps, wall seconds.

Scenarios (`--scenario`, default all): "fits" (the defaults: a wave's working set fits
the CPU pool, older turns come back from fs) and "pressure" (8 sessions at once in a
64-slot pool). Writes bench/results/vllm_compare.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# vLLM warns on every refused store ("cannot store chunks"): the figures say it.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from tests.vllm import harness as h  # noqa: E402

STACKS = ("vllm-tiering", "kvtiers-tier", "kvtiers-spec", "kvtiers-spec-shared")
RESULTS = ROOT / "bench" / "results" / "vllm_compare.json"
#: name -> (what it changes in the defaults, what it shows)
SCENARIOS: dict[str, tuple[dict[str, Any], str]] = {
    "fits": ({}, "a wave's working set fits the CPU pool; older turns come back from fs"),
    "pressure": (
        {"pool_chunks": 64, "concurrency": 8},
        "8 sessions at once in a 64-slot pool: promotions evict each other, stores are "
        "refused, copies down queue up",
    ),
}
THREADS = 4  # I/O threads per direction, the same for every fs tier
#: The scheduler-side connector's calls into the offloading manager (vLLM 0.33).
MANAGER_CALLS = (
    "lookup", "get_load_source", "prepare_load", "complete_load", "touch", "prepare_store",
    "complete_store", "on_new_request", "on_request_finished", "on_schedule_end",
    "has_pending_work", "take_events", "get_stats",
)  # fmt: skip


def stack_config(stack: str, fs_root: Path, pool_chunks: int, fs_bytes: int) -> dict[str, Any]:
    """The kv_connector_extra_config of one stack (its spec made by the harness)."""
    from kvtiers_vllm.spec import KvtiersOffloadingSpec
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

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


class Ideal:
    """Which full blocks earlier requests computed: a request's leading blocks in
    that set are what a perfect cache serves it."""

    def __init__(self) -> None:
        self._seen: set[tuple[int, ...]] = set()

    def reusable(self, tokens: list[int]) -> set[tuple[int, ...]]:
        """The leading blocks of `tokens` computed before (each named by its prefix)."""
        found = set()
        for i in range((len(tokens) - 1) // h.BLOCK):  # the last token is computed
            prefix = tuple(tokens[: (i + 1) * h.BLOCK])
            if prefix not in self._seen:
                break
            found.add(prefix)
        return found

    def computed(self, tokens: list[int]) -> None:
        for i in range(len(tokens) // h.BLOCK):
            self._seen.add(tuple(tokens[: (i + 1) * h.BLOCK]))


def timed(obj: Any, name: str, sink: list[int]) -> None:
    """Wrap `obj.name` to add its calls' CPU time (ns, this thread) to sink[-1]."""
    inner = getattr(obj, name)

    def wrapper(*args: Any, **kw: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return inner(*args, **kw)
        finally:
            sink[-1] += time.thread_time_ns() - start

    setattr(obj, name, wrapper)


def run_stack(stack: str, args: argparse.Namespace, model: Path, seed: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"vllm-compare-{stack}-"))
    fs_root = work / "fs"
    fs_root.mkdir()
    cfg = stack_config(stack, fs_root, args.pool_chunks, 1 << 30)
    engine = h.Engine(model, cfg, num_blocks=args.gpu_blocks, max_num_seqs=args.concurrency,
                      max_num_batched_tokens=2048)  # fmt: skip
    step_ns: list[int] = [0]
    timed(engine.scheduler, "schedule", step_ns)
    timed(engine.scheduler, "update_from_output", step_ns)
    # The offloading manager's share: the same connector calls it the same way for
    # every stack, so this is where the stacks differ (the rest is vLLM's scheduler).
    manager_ns: list[int] = [0]
    for method in MANAGER_CALLS:
        timed(engine.manager, method, manager_ns)
    rng = random.Random(seed)
    system = [rng.randrange(h.VOCAB) for _ in range(args.system_blocks * h.BLOCK)]
    history = {s: list(system) for s in range(args.sessions)}
    ideal = Ideal()
    ideal_blocks = loaded = 0
    busy_steps: list[int] = []
    manager_steps: list[int] = []
    start = time.perf_counter()
    try:
        for turn in range(args.turns):
            for first in range(0, args.sessions, args.concurrency):
                wave = range(first, min(first + args.concurrency, args.sessions))
                requests = {}
                wanted: set[tuple[int, ...]] = set()
                for s in wave:
                    user = [rng.randrange(h.VOCAB) for _ in range(args.user_blocks * h.BLOCK)]
                    prompt = history[s] + user
                    wanted |= ideal.reusable(prompt)
                    requests[s] = engine.add(f"s{s}t{turn}", prompt, args.answer_tokens)
                # A block several requests of the wave share is loaded once (vLLM's
                # prefix cache serves the others).
                ideal_blocks += len(wanted)
                for _ in range(args.max_steps):
                    result = engine.step()
                    loaded += result.loaded_pages
                    if result.output.num_scheduled_tokens:
                        busy_steps.append(step_ns[-1])
                        manager_steps.append(manager_ns[-1])
                    step_ns.append(0)
                    manager_ns.append(0)
                    if not engine.scheduler.requests:
                        break
                    if not result.output.num_scheduled_tokens:
                        time.sleep(0.001)  # waiting on a tier's thread
                else:
                    raise Stalled(f"{stack}: turn {turn} did not finish")
                for s, request in requests.items():
                    history[s] = list(request.all_token_ids)
                    ideal.computed(history[s][: len(history[s]) - 1])
                settle(engine)
                engine.scheduler.reset_prefix_cache()
        wall = time.perf_counter() - start
        checked = engine.pages_checked
    finally:
        engine.close()
        shutil.rmtree(work, ignore_errors=True)
    us = sorted(ns / 1000 for ns in busy_steps)
    mus = sorted(ns / 1000 for ns in manager_steps)
    return {
        "hit_rate": loaded / ideal_blocks if ideal_blocks else 0.0,
        "loaded_blocks": loaded,
        "ideal_blocks": ideal_blocks,
        "sched_us_p50": percentile(us, 50),
        "sched_us_p99": percentile(us, 99),
        "sched_cpu_s_total": sum(us) / 1e6,
        "manager_us_p50": percentile(mus, 50),
        "manager_us_p99": percentile(mus, 99),
        "manager_cpu_s_total": sum(mus) / 1e6,
        "busy_steps": len(us),
        "bytes_verified": checked * h.PAGE * h.LAYERS,
        "wall_s": wall,
    }


def settle(engine: h.Engine, max_steps: int = 2000) -> None:
    """Let the tiers finish their writes (both stacks get the same chance)."""
    for _ in range(max_steps):
        if not engine.busy():
            return
        engine.step()
        time.sleep(0.002)
    raise RuntimeError("offloading still busy after the turn")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    k = (len(values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4, help="sessions in flight at once")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-blocks", type=int, default=8)
    p.add_argument("--user-blocks", type=int, default=4)
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--pool-chunks", type=int, default=128, help="CPU pool slots")
    p.add_argument("--gpu-blocks", type=int, default=512)
    # Steps without scheduled tokens (waiting on a tier's thread) sleep 1 ms: on a
    # loaded machine a turn may wait that long for the fs threads.
    p.add_argument("--max-steps", type=int, default=30000)
    p.add_argument("--scenario", choices=["all", *SCENARIOS], default="all")
    p.add_argument("--quick", action="store_true", help="2 runs, 3 turns (a smoke run)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.turns = 2, 3
    stacks = list(STACKS)
    skipped = {}
    if importlib.util.find_spec("kvtiers_vllm.tier") is None:
        stacks.remove("kvtiers-tier")
        skipped["kvtiers-tier"] = "kvtiers_vllm.tier (level 1) is not installed in this tree"
    model = h.write_tiny_llama(Path(tempfile.mkdtemp(prefix="vllm-compare-model-")))
    chosen = SCENARIOS if args.scenario == "all" else {args.scenario: SCENARIOS[args.scenario]}
    scenarios = {}
    for name, (overrides, what) in chosen.items():
        sargs = argparse.Namespace(**{**vars(args), **overrides})
        print(f"== scenario {name}: {what}", flush=True)
        stalled: dict[str, int] = {}
        raw = run_scenario(stacks, sargs, model, stalled)
        medians = {st: {k: statistics.median(r[k] for r in raw[st]) for k in raw[st][0]}
                   for st in stacks if raw[st]}  # fmt: skip
        print_table(medians, skipped)
        for st, n in stalled.items():
            print(f"({st}: {n} of {args.runs} runs stalled, left out of its figures)")
        scenarios[name] = {
            "what": what,
            "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(sargs).items()},
            "median": medians,
            "runs": raw,
            "stalled_runs": stalled,
            "goal_met": _goal(medians),
            "goal_met_manager": _goal(medians, "manager"),
        }
    shutil.rmtree(model, ignore_errors=True)
    doc = {
        "what": "bench/vllm_compare.py: vLLM 0.33 real scheduler on CPU, multi-turn shared-prefix",
        "machine": {"python": platform.python_version(), "cpus": _cpus()},
        "scenarios": scenarios,
        "skipped": skipped,
        "goal": "kvtiers-spec hit_rate >= vllm-tiering's, with lower sched_us_p50 and p99 "
        "(goal_met; goal_met_manager: with lower manager_us_p50 and p99)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


class Stalled(RuntimeError):
    """A turn did not finish within `--max-steps` steps."""


def run_scenario(
    stacks: list[str], args: argparse.Namespace, model: Path, stalled: dict[str, int]
) -> dict[str, list[dict[str, Any]]]:
    """`args.runs` runs of every stack, interleaved, the order rotating by run. A run
    that stalls is counted in `stalled` and left out of the figures."""
    raw: dict[str, list[dict[str, Any]]] = {s: [] for s in stacks}
    for run in range(args.runs):
        order = stacks[run % len(stacks):] + stacks[: run % len(stacks)]
        for stack in order:
            try:
                raw[stack].append(run_stack(stack, args, model, seed=1000 + run))
            except Stalled as exc:  # said and counted, not a figure
                print(f"run {run + 1}/{args.runs} {stack}: STALLED ({exc})", flush=True)
                stalled[stack] = stalled.get(stack, 0) + 1
                continue
            print(f"run {run + 1}/{args.runs} {stack}: " + ", ".join(
                f"{k}={v:.4g}" for k, v in raw[stack][-1].items()), flush=True)  # fmt: skip
    return raw


def _goal(m: dict[str, dict[str, float]], part: str = "sched") -> bool | None:
    """kvtiers-spec's hit rate >= vllm-tiering's with lower p50 and p99 of `part`'s
    CPU time per step ("sched": the whole scheduler step; "manager": its share)."""
    a, c = m.get("vllm-tiering"), m.get("kvtiers-spec")
    if a is None or c is None:
        return None
    return bool(c["hit_rate"] >= a["hit_rate"] and c[f"{part}_us_p50"] < a[f"{part}_us_p50"]
                and c[f"{part}_us_p99"] < a[f"{part}_us_p99"])  # fmt: skip


def _cpus() -> int:
    return os.cpu_count() or 0


def print_table(medians: dict[str, dict[str, float]], skipped: dict[str, str]) -> None:
    cols: list[tuple[str, str, Callable[[float], str]]] = [
        ("hit rate", "hit_rate", lambda v: f"{v:.1%}"),
        ("loaded/ideal", "", lambda v: ""),
        ("sched µs p50", "sched_us_p50", lambda v: f"{v:.0f}"),
        ("sched µs p99", "sched_us_p99", lambda v: f"{v:.0f}"),
        ("sched CPU s", "sched_cpu_s_total", lambda v: f"{v:.3f}"),
        ("manager µs p50", "manager_us_p50", lambda v: f"{v:.0f}"),
        ("manager µs p99", "manager_us_p99", lambda v: f"{v:.0f}"),
        ("manager CPU s", "manager_cpu_s_total", lambda v: f"{v:.3f}"),
        ("steps", "busy_steps", lambda v: f"{v:.0f}"),
        ("bytes verified", "bytes_verified", lambda v: f"{v:,.0f}"),
        ("wall s", "wall_s", lambda v: f"{v:.2f}"),
    ]
    header = ["stack"] + [c[0] for c in cols]
    rows = []
    for stack, m in medians.items():
        row = [stack]
        for _, key, fmt in cols:
            if not key:
                row.append(f"{m['loaded_blocks']:.0f}/{m['ideal_blocks']:.0f}")
            else:
                row.append(fmt(m[key]))
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    print("| " + " | ".join(h_.ljust(w) for h_, w in zip(header, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)) + " |")
    for stack, why in skipped.items():
        print(f"({stack} not run: {why})")


if __name__ == "__main__":
    sys.exit(main())
