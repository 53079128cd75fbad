"""A multi-turn, shared-prefix trace through `harness.Engine`, and what an ideal cache
would have served of it, so that two offloading stacks can be compared on the same
requests.

`Trace`: `sessions` conversations share a system prompt of `system_blocks` blocks;
each has `turns` turns, a turn's prompt being the conversation so far (its earlier
prompts and answers) plus `user_blocks` new blocks, its answer `answer_tokens`
tokens. A round takes one turn of every session, `concurrency` sessions at a time (a
wave); after each wave the offloading settles (its tiers' writes end) and the GPU
prefix cache is reset, so every reuse comes from the offloading stack. The tokens
depend on `seed` only: every stack gets the same requests.

`run_trace(engine, trace)` drives it and returns a `TraceRun`: blocks loaded (each one
checked byte for byte by the harness as it lands), blocks an ideal cache serves (the
leading full blocks of a wave's prompts that an earlier wave computed, each once: the
requests of one wave share what they load through vLLM's prefix cache), pages checked.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from .harness import BLOCK, VOCAB, Engine


@dataclass(frozen=True)
class Trace:
    sessions: int = 8
    concurrency: int = 4
    turns: int = 3
    system_blocks: int = 4
    user_blocks: int = 2
    answer_tokens: int = 16
    seed: int = 1


@dataclass(frozen=True)
class TraceRun:
    loaded_blocks: int  # pages the offloading stack loaded, every one checked
    ideal_blocks: int  # blocks a perfect cache would have served
    pages_checked: int

    @property
    def hit_rate(self) -> float:
        return self.loaded_blocks / self.ideal_blocks if self.ideal_blocks else 0.0


class Ideal:
    """The full blocks computed so far, each named by its prefix: a prompt's leading
    blocks among them are what a perfect cache serves it."""

    def __init__(self) -> None:
        self._seen: set[tuple[int, ...]] = set()

    def reusable(self, tokens: list[int]) -> set[tuple[int, ...]]:
        found = set()
        for i in range((len(tokens) - 1) // BLOCK):  # the last token is always computed
            prefix = tuple(tokens[: (i + 1) * BLOCK])
            if prefix not in self._seen:
                break
            found.add(prefix)
        return found

    def computed(self, tokens: list[int]) -> None:
        for i in range(len(tokens) // BLOCK):
            self._seen.add(tuple(tokens[: (i + 1) * BLOCK]))


def run_trace(engine: Engine, trace: Trace, max_steps: int = 4000) -> TraceRun:
    """Drive `trace` through `engine` (see the module docstring). Raises
    AssertionError when a wave does not finish within `max_steps` steps."""
    rng = random.Random(trace.seed)
    system = [rng.randrange(VOCAB) for _ in range(trace.system_blocks * BLOCK)]
    history = {s: list(system) for s in range(trace.sessions)}
    ideal = Ideal()
    ideal_blocks = loaded = 0
    for turn in range(trace.turns):
        for first in range(0, trace.sessions, trace.concurrency):
            wave = range(first, min(first + trace.concurrency, trace.sessions))
            wanted: set[tuple[int, ...]] = set()
            requests = {}
            for s in wave:
                user = [rng.randrange(VOCAB) for _ in range(trace.user_blocks * BLOCK)]
                prompt = history[s] + user
                wanted |= ideal.reusable(prompt)
                requests[s] = engine.add(f"s{s}t{turn}", prompt, trace.answer_tokens)
            ideal_blocks += len(wanted)
            for _ in range(max_steps):
                result = engine.step()
                loaded += result.loaded_pages
                if not engine.scheduler.requests:
                    break
                if not result.output.num_scheduled_tokens:
                    time.sleep(0.001)  # waiting on a tier's thread (probe, promotion)
            else:
                raise AssertionError(f"turn {turn}, wave from session {first}: not finished")
            for s, request in requests.items():
                history[s] = list(request.all_token_ids)
                ideal.computed(history[s][:-1])  # the last token's KV is never written
            engine.settle()
            assert engine.scheduler.reset_prefix_cache()
    return TraceRun(loaded, ideal_blocks, engine.pages_checked)
