#!/usr/bin/env python3
"""A toy inference engine that embeds kvtiers the way a real one does: two processes.

- The **scheduler process** holds the manager (`kvtiers.build_manager`) over a shared
  CPU pool (`kvtiers.CpuPool(..., shared=True)`) and the config's secondary tiers. It
  turns each prompt's token blocks into keys (`kvtiers.prefix_block_hashes`), asks the
  manager which leading blocks it holds, and tells the worker what to copy.
- The **worker process** attaches to the same pool by name (`CpuPool.attach`) and runs
  a `DeviceSwapper` between its KV cache (here a CPU tensor standing in for GPU memory)
  and the pool's slots. It "computes" the KV of blocks nobody had (bytes derived from
  the block's tokens) and checks every block it reloads against those bytes.

They talk over a pipe, once per step, as an engine's scheduler and model runner do.
Run it twice on the same fs root: the second run starts with an empty CPU pool and
gets its hits from the fs tier (a promotion: RETRY, then HIT_PENDING, then HIT).

    python examples/embedding/toy_engine.py --config examples/embedding/config.json

Prints one JSON line of counters at the end; exit 1 if any reloaded byte was wrong.
docs/engines.md walks through this file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import kvtiers
from kvtiers import BlockGeometry, BlockKey, Namespace

# The model's KV geometry: what a real engine reads from its model config.
GEOMETRY = BlockGeometry(layers=4, kv_heads=2, head_size=16, dtype="float16", tokens_per_block=16)
MODEL = "toy-engine/example-model"
GPU_PAGES = 256  # the worker's KV cache: pages of one block each


# --------------------------------------------------------------------------- worker


def block_content(key: BlockKey, nbytes: int) -> bytes:
    """The KV bytes the toy model computes for a block: a function of its key (so of
    its tokens and everything before them), never zeros."""
    out = bytearray()
    counter = 0
    while len(out) < nbytes:
        out += hashlib.blake2b(key + counter.to_bytes(4, "little"), digest_size=64).digest()
        counter += 1
    return bytes(out[:nbytes])


def worker_main(pool_name: str, conn: Connection) -> None:
    """The model runner: owns the KV cache and the swapper; one thread."""
    import numpy as np
    import torch

    pool = kvtiers.CpuPool.attach(pool_name, GEOMETRY.block_bytes)
    g = GEOMETRY
    # Cross-layer layout [pages, layers, K/V, tokens, heads, head_dim], as some engines
    # keep it; per-layer tensors work the same way (KVLayout.per_layer).
    kv = torch.empty((GPU_PAGES, g.layers, 2, g.tokens_per_block, g.kv_heads, g.head_size),
                     dtype=torch.float16)  # fmt: skip
    pages_u8 = kv.view(torch.uint8).view(GPU_PAGES, -1)
    swapper = kvtiers.DeviceSwapper(kvtiers.KVLayout.cross_layer(kv), pool)
    expected: dict[int, tuple[list[int], list[bytes]]] = {}  # load job -> what to check
    in_flight: set[int] = set()
    try:
        while True:
            msg = conn.recv()
            op = msg[0]
            if op == "stop":
                break
            if op == "compute":  # the forward pass writes the blocks' KV
                _, pages, keys = msg
                for page, key in zip(pages, keys, strict=True):
                    data = np.frombuffer(block_content(key, g.block_bytes), np.uint8)
                    pages_u8[page].copy_(torch.from_numpy(data.copy()))
            elif op == "store":  # pages -> pool slots
                _, job_id, pages, slots, keys = msg
                in_flight.add(job_id)
                swapper.submit_store(job_id, np.asarray(pages), np.asarray(slots), keys=keys)
            elif op == "load":  # pool slots -> pages
                _, job_id, slots, pages, keys = msg
                pages_u8[pages] = 0  # so a load that copies nothing cannot pass the check
                expected[job_id] = (pages, [block_content(k, g.block_bytes) for k in keys])
                in_flight.add(job_id)
                swapper.submit_load(job_id, np.asarray(slots), np.asarray(pages), keys=keys)
            elif op == "poll":  # once per step: which copies ended, and were they right
                if msg[1]:
                    swapper.wait(in_flight)
                finished = []
                for r in swapper.get_finished():
                    in_flight.discard(r.job_id)
                    checked = bad = 0
                    if r.job_id in expected:
                        loaded, want = expected.pop(r.job_id)
                        for page, content in zip(loaded, want, strict=True):
                            checked += 1
                            bad += bytes(pages_u8[page].numpy()) != content
                    finished.append((r.job_id, list(r.ok), list(r.failed), checked, bad))
                conn.send(finished)
    finally:
        swapper.close()
        pool.close()
        conn.close()


# --------------------------------------------------------------------------- scheduler


@dataclass
class Counters:
    requests: int = 0
    prompt_blocks: int = 0
    hit_blocks: int = 0
    computed_blocks: int = 0
    stored_blocks: int = 0
    verified_blocks: int = 0
    bad_blocks: int = 0
    retried_lookups: int = 0
    events: dict[str, int] = field(default_factory=dict)


@dataclass
class Job:
    kind: str  # "load" or "store"
    keys: list[BlockKey]


class Scheduler:
    """The engine's scheduler: one thread calls the manager (lookups, store and load
    bookkeeping, `step()` once per step), as DESIGN.md's scheduler contract asks."""

    def __init__(self, manager: kvtiers.TieringOffloadingManager, conn: Connection):
        self.mgr = manager
        self.conn = conn
        self.jobs: dict[int, Job] = {}
        self.next_job = 0
        self.free_pages = list(range(GPU_PAGES))
        self.c = Counters()

    def run_request(self, request_id: str, tokens: Sequence[int]) -> None:
        mgr, c = self.mgr, self.c
        keys = kvtiers.prefix_block_hashes(tokens, GEOMETRY.tokens_per_block)
        mgr.on_request_start(request_id)
        # A block on its way from a secondary tier (promotion) or an existence probe
        # in flight says "retry": the request waits a step and asks again, the way an
        # engine defers a request whose prefix is being loaded.
        found = mgr.lookup_prefix(keys)
        for _ in range(500):
            if not found.retry:
                break
            c.retried_lookups += 1
            self.step()
            time.sleep(0.002)
            found = mgr.lookup_prefix(keys)
        hits = keys[: found.hits]
        pages = [self.free_pages.pop() for _ in keys]
        if hits:  # pin the hits' slots and copy them into the request's pages
            slots = mgr.prepare_load(hits)
            mgr.touch(hits)
            self.submit("load", hits, ("load", self.next_job, slots, pages[: len(hits)], hits))
        rest, rest_pages = keys[len(hits):], pages[len(hits):]
        if rest:  # the prefill computes the rest; offload what the pool lacks
            self.conn.send(("compute", rest_pages, rest))
            out = mgr.prepare_store(rest)
            if out is not None and out.keys:
                page_of = dict(zip(rest, rest_pages, strict=True))
                job = ("store", self.next_job, [page_of[k] for k in out.keys], out.slots, out.keys)
                self.submit("store", out.keys, job)
        c.requests += 1
        c.prompt_blocks += len(keys)
        c.hit_blocks += len(hits)
        c.computed_blocks += len(rest)
        self.step(wait=True)  # a real engine overlaps this with the next requests
        self.free_pages += pages
        mgr.on_request_finished(request_id)

    def submit(self, kind: str, keys: list[BlockKey], message: tuple[Any, ...]) -> None:
        self.jobs[self.next_job] = Job(kind, keys)
        self.next_job += 1
        self.conn.send(message)

    def step(self, wait: bool = False) -> None:
        """One scheduler step: the worker's finished copies, then the manager's step
        (tier jobs collected, promotions and cascades submitted), then its events."""
        self.conn.send(("poll", wait))
        for job_id, ok, failed, checked, bad in self.conn.recv():
            job = self.jobs.pop(job_id)
            if job.kind == "load":
                self.mgr.complete_load(job.keys)  # unpin
                self.c.verified_blocks += checked - bad
                self.c.bad_blocks += bad + len(failed)
            else:  # the copied blocks become readable; the failed ones are dropped
                self.mgr.complete_store(ok, success=True)
                if failed:
                    self.mgr.complete_store(failed, success=False)
                self.c.stored_blocks += len(ok)
        self.mgr.step()
        # Events say which blocks became readable ("stored") or left ("removed") in
        # each tier: what a KV-aware router needs. Forward them; here we count them.
        for event in self.mgr.take_events():
            name = f"{event.kind}:{event.tier}"
            self.c.events[name] = self.c.events.get(name, 0) + len(event.keys)


def workload(seed: int, conversations: int, turns: int) -> list[tuple[str, list[int]]]:
    """Multi-turn chats sharing one system prompt: each turn's prompt is the whole
    conversation so far, so its prefix was seen on the turn before."""
    rng = random.Random(seed)
    system = [rng.randrange(32000) for _ in range(256)]
    requests = []
    for conv in range(conversations):
        history = list(system)
        for turn in range(turns):
            history += [rng.randrange(32000) for _ in range(rng.randrange(40, 120))]
            requests.append((f"c{conv}-t{turn}", list(history)))
    return requests


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a kvtiers config (JSON file)")
    p.add_argument("--conversations", type=int, default=6)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--seed", type=int, default=1, help="workload seed (same seed, same prompts)")
    args = p.parse_args(argv)
    try:
        config = kvtiers.load_config(args.config)
    except kvtiers.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    namespace = Namespace(MODEL, (GEOMETRY,))
    # The scheduler does no DMA: the pool it creates needs no pinning; the worker pins
    # its own mapping when it attaches (on a CUDA machine).
    pool = kvtiers.CpuPool(GEOMETRY.block_bytes, config.cpu_bytes_to_use, shared=True, pin=False)
    manager = kvtiers.build_manager(config, pool.view, namespace, enable_events=True)
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    worker = ctx.Process(target=worker_main, args=(pool.name, theirs), daemon=True)
    worker.start()
    sched = Scheduler(manager, ours)
    try:
        for request_id, tokens in workload(args.seed, args.conversations, args.turns):
            sched.run_request(request_id, tokens)
        sched.step(wait=True)
        manager.drain(timeout=30)  # cascades to the secondary tiers finish
        sched.step()
        ours.send(("stop",))
        worker.join(30)
    finally:
        if worker.is_alive():
            worker.kill()
        manager.close()
        pool.close()
    summary = {**sched.c.__dict__, "tiers": manager.stats().get("tiers", {})}
    print(json.dumps(summary, default=str))
    return 1 if sched.c.bad_blocks or worker.exitcode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
