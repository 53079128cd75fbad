"""A multi-turn, shared-prefix chat workload, shared by the manager replay bench and
`kvtiers bench`.

Its shape follows the vLLM PR #46216 stress run: many sessions, each starting from
one of a set of long shared prefixes (system prompts, documents) and adding a few
turns of prompt and output tokens; a window of requests in flight; GPU prefix
caching off, so every reuse goes through the offloading tiers. The same seed gives
the same requests, keys included.

The generator yields `start` and `finish` events: a request starts (the engine
looks up its prompt, loads the hits, stores the new prompt blocks) and, when the
window is full, the oldest request finishes (its loads and stores complete, its
output blocks are stored). A session's next turn starts only after its previous
turn finished.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvtiers.contract.keys import BlockKey, key_hash
from kvtiers.hashing import DEFAULT_SEED, prefix_block_hashes


@dataclass(frozen=True)
class WorkloadSpec:
    num_prefixes: int = 200
    prefix_tokens: int = 10_000
    prompt_tokens: int = 128  # new prompt tokens per turn
    output_tokens: int = 128  # output tokens per turn
    turns: int = 5
    sessions_in_flight: int = 100
    total_sessions: int = 2_000
    block_tokens: int = 16
    vocab: int = 128_000
    seed: int = 0
    hash_seed: int | str | bytes = DEFAULT_SEED

    def __post_init__(self) -> None:
        for name in (
            "num_prefixes", "turns", "sessions_in_flight", "total_sessions", "block_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("prefix_tokens", "prompt_tokens", "output_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def requests(self) -> int:
        return self.total_sessions * self.turns


@dataclass
class Request:
    """One turn of one session. `prompt_keys` are the keys of every full block of
    the prompt (shared prefix and history included); `output_keys` the blocks that
    the generated tokens complete. `prompt_tokens` counts every prompt token."""

    req_id: str
    session: int
    turn: int
    prompt_tokens: int
    prompt_keys: list[BlockKey]
    output_keys: list[BlockKey] = field(default_factory=list)


@dataclass
class _Session:
    sid: int
    prefix: int
    turn: int = 0
    tokens: list[int] = field(default_factory=list)  # tail not yet in a full block
    keys: list[BlockKey] = field(default_factory=list)  # keys of full blocks so far


class Workload:
    """Iterate to get `("start", Request)` / `("finish", Request)` events."""

    def __init__(self, spec: WorkloadSpec):
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self._prefix_keys: dict[int, tuple[list[BlockKey], list[int]]] = {}

    def _prefix(self, index: int) -> tuple[list[BlockKey], list[int]]:
        """Keys of a shared prefix's full blocks and its trailing partial tokens."""
        cached = self._prefix_keys.get(index)
        if cached is None:
            spec = self.spec
            rng = random.Random(f"prefix-{spec.seed}-{index}")
            tokens = [rng.randrange(spec.vocab) for _ in range(spec.prefix_tokens)]
            keys = prefix_block_hashes(tokens, spec.block_tokens, seed=spec.hash_seed)
            tail = tokens[len(keys) * spec.block_tokens :]
            cached = self._prefix_keys[index] = (keys, tail)
        return cached

    def _extend(self, session: _Session, new_tokens: list[int]) -> list[BlockKey]:
        """Append tokens to the session; return keys of the blocks they complete."""
        spec = self.spec
        session.tokens.extend(new_tokens)
        parent = key_hash(session.keys[-1]) if session.keys else None
        added = prefix_block_hashes(
            session.tokens, spec.block_tokens, seed=spec.hash_seed, parent=parent
        )
        del session.tokens[: len(added) * spec.block_tokens]
        session.keys.extend(added)
        return added

    def _new_session(self, sid: int) -> _Session:
        prefix = self._rng.randrange(self.spec.num_prefixes)
        keys, tail = self._prefix(prefix)
        return _Session(sid, prefix, 0, list(tail), list(keys))

    def _tokens(self, n: int) -> list[int]:
        vocab = self.spec.vocab
        rng = self._rng
        return [rng.randrange(vocab) for _ in range(n)]

    def __iter__(self) -> Iterator[tuple[str, Request]]:
        spec = self.spec
        ready: deque[_Session] = deque()
        started = 0
        while started < min(spec.sessions_in_flight, spec.total_sessions):
            ready.append(self._new_session(started))
            started += 1
        window: deque[tuple[_Session, Request]] = deque()
        # At most one turn per session in flight, so the window is bounded by it.
        limit = min(spec.sessions_in_flight, spec.total_sessions)
        while ready or window:
            if ready and len(window) < limit:
                s = ready.popleft()
                self._extend(s, self._tokens(spec.prompt_tokens))
                prompt_len = len(s.keys) * spec.block_tokens + len(s.tokens)
                req = Request(f"s{s.sid}-t{s.turn}", s.sid, s.turn, prompt_len, list(s.keys))
                window.append((s, req))
                yield "start", req
                continue
            s, req = window.popleft()
            req.output_keys = self._extend(s, self._tokens(spec.output_tokens))
            yield "finish", req
            s.turn += 1
            if s.turn < spec.turns:
                ready.append(s)
            elif started < spec.total_sessions:
                ready.append(self._new_session(started))
                started += 1
