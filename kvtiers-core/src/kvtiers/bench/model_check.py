"""The model check: reloaded KV is exact, shown with a real model's logits.

A tiny decoder (`kvtiers.bench.model`) holds a multi-turn conversation three times,
with the same weights, tokens and pages:

1. all KV resident on the "GPU";
2. before every turn after the first, the full pages of the conversation so far are
   stored through kvtiers (manager + DeviceSwapper) into the CPU pool, overwritten
   with garbage on the GPU, and loaded back into the same pages;
3. the same, but after the stores have cascaded to an `fs` tier the CPU pool drops
   everything (`manager.reset()`), so the pages come back from `fs` by promotion.

The logits of every forward pass must be bit-identical (`torch.equal`) across the
three runs, with a fixed thread count and deterministic algorithms. A control run
scrambles the pages without reloading them, to show the check would notice.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvtiers.bench.model import TinyConfig, TinyDecoder
from kvtiers.config import load_config
from kvtiers.contract.namespace import Namespace
from kvtiers.errors import KvtiersError
from kvtiers.extras import BENCH_EXTRA, missing_torch
from kvtiers.hashing import prefix_block_hashes
from kvtiers.manager.build import build_manager
from kvtiers.pool import CpuPool
from kvtiers.swap import DeviceSwapper

try:
    import torch
except ImportError as exc:  # the scheduler side runs without torch; the bench does not
    raise missing_torch("kvtiers bench", exc, extra=BENCH_EXTRA) from exc

TURNS = 4
USER_TOKENS = 40  # new prompt tokens per turn
GEN_TOKENS = 24  # tokens generated per turn
POOL_SLOTS = 64
WAIT_S = 30.0

Hook = Callable[[list[int], torch.Tensor], None]


class ModelCheckError(KvtiersError):
    """The check could not run as designed (a block was not found or not copied)."""


@dataclass
class RunLog:
    name: str
    logits: list[torch.Tensor] = field(default_factory=list)
    stored_blocks: int = 0
    reloaded_blocks: int = 0
    promoted_blocks: int = 0  # reloads that came back from fs (run 3)


@dataclass
class ModelCheckResult:
    config: TinyConfig
    runs: list[RunLog]
    identical: dict[str, bool]  # run name -> every step equal to run 1's
    control_differs: bool  # scrambling the pages without a reload changes the logits
    seconds: float

    @property
    def steps(self) -> int:
        return len(self.runs[0].logits)

    @property
    def ok(self) -> bool:
        return all(self.identical.values()) and self.control_differs

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "steps": self.steps,
            "seconds": self.seconds,
            "model": self.config.describe(),
            "turns": TURNS,
            "user_tokens": USER_TOKENS,
            "gen_tokens": GEN_TOKENS,
            "identical": self.identical,
            "control_differs": self.control_differs,
            "runs": [
                {
                    "name": r.name,
                    "steps": len(r.logits),
                    "stored_blocks": r.stored_blocks,
                    "reloaded_blocks": r.reloaded_blocks,
                    "promoted_from_fs": r.promoted_blocks,
                }
                for r in self.runs
            ],
        }


@contextlib.contextmanager
def deterministic(threads: int = 1) -> Iterator[None]:
    """Fixed thread count and deterministic algorithms, restored afterwards."""
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old_det)
        torch.set_num_threads(old_threads)


def converse(model: TinyDecoder, log: RunLog, between: Hook | None = None, seed: int = 0) -> None:
    """The conversation: each turn feeds the user's tokens (and the last generated
    one) in one prefill, then generates greedily one token per forward pass."""
    c = model.config
    rng = np.random.default_rng(seed)
    table = torch.from_numpy(rng.permutation(c.num_pages)).to(model.device)
    if c.num_pages * c.page_tokens < TURNS * (USER_TOKENS + GEN_TOKENS):
        raise ValueError("the conversation does not fit the model's pages")
    model.clear_cache()
    cached: list[int] = []  # tokens whose KV is in the pages
    pending: list[int] = []
    for turn in range(TURNS):
        if turn and between is not None:
            between(cached, table)
        pending += rng.integers(0, c.vocab, USER_TOKENS).tolist()
        for _ in range(GEN_TOKENS):
            tokens = torch.tensor(pending, device=model.device)
            logits = model.forward(tokens, len(cached), table)
            log.logits.append(logits.clone())
            cached += pending
            pending = [int(logits[-1].argmax())]


class RoundTrip:
    """The between-turns hook of runs 2 and 3: store the full pages through kvtiers,
    scramble them, (run 3: cascade to fs, empty the pool), load them back."""

    def __init__(self, model: TinyDecoder, log: RunLog, fs_root: str | None):
        self.model = model
        self.log = log
        self.page_tokens = model.config.page_tokens
        geometry = model.geometry()
        slot = -(-geometry.block_bytes // 4096) * 4096
        doc: dict[str, Any] = {"cpu_bytes_to_use": POOL_SLOTS * slot}
        if fs_root is not None:
            doc["secondary_tiers"] = [
                {"type": "fs", "root_dir": fs_root, "capacity_bytes": 64 << 20}
            ]
        self.from_fs = fs_root is not None
        self.pool = CpuPool(geometry.block_bytes, doc["cpu_bytes_to_use"], pin=False)
        namespace = Namespace("kvtiers-bench/tiny-decoder", (geometry,), revision="model-check")
        self.mgr = build_manager(load_config(doc), self.pool.view, namespace)
        self.swap = DeviceSwapper(model.kv_layout(), self.pool)
        self.gen = torch.Generator().manual_seed(1234)
        self.job_id = 0
        self.stored_total = 0

    def close(self) -> None:
        self.swap.close()
        self.mgr.close()
        self.pool.close()

    def __call__(self, cached: list[int], table: torch.Tensor) -> None:
        full = len(cached) // self.page_tokens
        keys = prefix_block_hashes(cached[: full * self.page_tokens], self.page_tokens)
        pages = table[:full].cpu().numpy()
        self._store(keys, pages)
        if self.from_fs:
            self._cascade_then_empty_pool()
        self.model.scramble_pages(table[:full], self.gen)
        self._load(keys, pages)

    def _store(self, keys: list[bytes], pages: np.ndarray) -> None:
        out = self.mgr.prepare_store(keys)
        if out is None:
            raise ModelCheckError("the CPU pool refused the store")
        if out.keys:
            index = {k: i for i, k in enumerate(keys)}
            result = self._copy("store", pages[[index[k] for k in out.keys]], out.slots, out.keys)
            self.mgr.complete_store(result.ok, True)
            self.log.stored_blocks += len(result.ok)
            self.stored_total += len(result.ok)

    def _cascade_then_empty_pool(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            self.mgr.drain(timeout=1.0)
            fs = self.mgr.stats()["tiers"]["fs"]
            if fs["cascades_dropped"] or fs["cascade_failures"]:
                raise ModelCheckError(f"cascades to fs were dropped or failed: {fs}")
            if fs["cascaded_blocks"] >= self.stored_total:
                break
            if time.monotonic() > deadline:
                raise ModelCheckError("the cascade to fs did not finish in time")
        self.mgr.reset()
        if self.mgr.stats()["pool"]["resident"]:
            raise ModelCheckError("manager.reset() left blocks in the CPU pool")

    def _load(self, keys: list[bytes], pages: np.ndarray) -> None:
        promoted_before = self._promoted()
        deadline = time.monotonic() + WAIT_S
        while True:
            found = self.mgr.lookup_prefix(keys)
            if found.hits == len(keys):
                break
            if not found.retry or time.monotonic() > deadline:
                raise ModelCheckError(
                    f"only {found.hits} of {len(keys)} blocks came back "
                    f"({'from fs' if self.from_fs else 'from the CPU pool'})"
                )
            self.mgr.step()
            time.sleep(0.001)
        slots = self.mgr.prepare_load(keys)
        try:
            self._copy("load", pages, slots, keys)
        finally:
            self.mgr.complete_load(keys)
        self.log.reloaded_blocks += len(keys)
        self.log.promoted_blocks += self._promoted() - promoted_before

    def _promoted(self) -> int:
        return int(self.mgr.stats()["tiers"].get("fs", {}).get("promoted_hits", 0))

    def _copy(self, direction: str, pages: np.ndarray, slots: Any, keys: list[bytes]) -> Any:
        self.job_id += 1
        slots = np.asarray(slots, np.int64)
        if direction == "store":
            self.swap.submit_store(self.job_id, pages, slots, keys=keys)
        else:
            self.swap.submit_load(self.job_id, slots, pages, keys=keys)
        if not self.swap.wait([self.job_id], timeout=WAIT_S):
            raise ModelCheckError(f"swapper {direction} job did not finish")
        (result,) = [r for r in self.swap.get_finished() if r.job_id == self.job_id]
        if result.failed:
            raise ModelCheckError(f"swapper {direction} failed: {result.error}")
        return result


def run_model_check(
    tmp_dir: str | None = None, config: TinyConfig | None = None
) -> ModelCheckResult:
    """Runs 1-3 and the control; see the module doc. `tmp_dir`: where run 3's fs
    tier keeps its (temporary) directory."""
    config = config or TinyConfig()
    t0 = time.perf_counter()
    with (
        deterministic(),
        tempfile.TemporaryDirectory(prefix="kvtiers-model-check-", dir=tmp_dir) as root,
    ):
        model = TinyDecoder(config)
        resident = RunLog("1: all KV resident")
        converse(model, resident)
        runs = [resident]
        for name, fs_root in (
            ("2: reloaded from the CPU pool", None),
            ("3: reloaded from fs (CPU pool emptied)", root),
        ):
            log = RunLog(name)
            hook = RoundTrip(model, log, fs_root)
            try:
                converse(model, log, hook)
            finally:
                hook.close()
            runs.append(log)
        control = RunLog("control: scrambled, not reloaded")
        gen = torch.Generator().manual_seed(99)
        converse(
            model,
            control,
            lambda cached, table: model.scramble_pages(
                table[: len(cached) // config.page_tokens], gen
            ),
        )
    identical = {
        r.name: len(r.logits) == len(resident.logits)
        and all(torch.equal(a, b) for a, b in zip(resident.logits, r.logits, strict=True))
        for r in runs[1:]
    }
    differs = not all(
        torch.equal(a, b) for a, b in zip(resident.logits, control.logits, strict=True)
    )
    return ModelCheckResult(config, runs, identical, differs, time.perf_counter() - t0)


def main(tmp_dir: str | None = None, json_out: Path | None = None) -> int:
    """`kvtiers bench --model-check`: print the verdict; 0 when identical."""
    result = run_model_check(tmp_dir)
    steps = result.steps
    print(
        f"model check: a tiny decoder ({result.config.describe()}), random weights (seed "
        f"{result.config.seed}); {TURNS} turns of {USER_TOKENS} prompt + {GEN_TOKENS} "
        f"generated tokens = {steps} forward passes per run; 1 thread, deterministic algorithms"
    )
    for run in result.runs:
        extra = ""
        if run.reloaded_blocks:
            extra = f": {run.stored_blocks} blocks stored, {run.reloaded_blocks} reloaded" + (
                f" ({run.promoted_blocks} promoted from fs)" if run.promoted_blocks else ""
            )
        verdict = (
            ""
            if run is result.runs[0]
            else (
                "  logits identical to run 1"
                if result.identical[run.name]
                else "  LOGITS DIFFER from run 1"
            )
        )
        print(f"  run {run.name}{extra}{verdict}")
    print(
        f"  control: pages scrambled and not reloaded -> logits "
        f"{'differ (the check has teeth)' if result.control_differs else 'DO NOT DIFFER'}"
    )
    verdict = "PASSED" if result.ok else "FAILED"
    print(
        f"model check {verdict}: torch.equal on every step's logits across the three runs "
        f"({result.seconds:.1f} s)"
    )
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.as_dict(), indent=2))
    sys.stdout.flush()
    return 0 if result.ok else 1
