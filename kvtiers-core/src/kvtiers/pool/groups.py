"""CPU pools for models whose KV-cache groups have different block sizes (hybrid
models: full and sliding-window attention, attention and mamba state, ...).

All blocks in one pool have one size, so there is one `CpuPool` per distinct block
size, serving every group of that size. The byte budget is split so that **every
group can hold the same number of blocks**:

    blocks_per_group = cpu_bytes_to_use // sum(slot_bytes(s) * groups_of_size(s))
    pool of size s   = blocks_per_group * groups_of_size(s) slots

Why this rule: an engine stores a prefix as one block per group for each run of
tokens (every group covers the same tokens), and can only reuse a prefix whose blocks
it finds in every group. Balanced in blocks, all pools cover the same number of
tokens; a pool that filled up first would evict blocks whose siblings in the other
pools are still held and now useless. Splitting the bytes evenly would give a pool of
small blocks far more coverage than one of large blocks; splitting by block size alone
would shortchange a size that more groups share. Slot bytes (block rounded up to
4 KiB) are what a block really occupies. What remains of the budget (less than one
block per group) is left unused.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvtiers.contract.namespace import BlockGeometry
from kvtiers.contract.pool_view import round_up
from kvtiers.pool.cpu_pool import CpuPool
from kvtiers.pool.memory import (
    HEADER_BYTES,
    SHM_DIR,
    PoolSizeError,
    check_pool_fits,
    human_bytes,
    open_shm,
    shm_path,
)
from kvtiers.pool.pinning import ProgressFn


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """One pool of a hybrid model: its block size and the groups it serves."""

    block_bytes: int
    groups: tuple[int, ...]
    num_slots: int = 0

    @property
    def slot_bytes(self) -> int:
        return round_up(self.block_bytes)

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.slot_bytes


def group_by_size(groups: Sequence[BlockGeometry]) -> list[PoolPlan]:
    """One (slot-less) plan per distinct block size, in order of first appearance."""
    if not groups:
        raise ValueError("need the geometry of at least one KV group")
    members: dict[int, list[int]] = {}
    for index, geometry in enumerate(groups):
        members.setdefault(geometry.block_bytes, []).append(index)
    return [PoolPlan(size, tuple(indices)) for size, indices in members.items()]


def plan_pools(groups: Sequence[BlockGeometry], cpu_bytes_to_use: int) -> list[PoolPlan]:
    """Split `cpu_bytes_to_use` by the module's rule. `PoolSizeError` when the budget
    cannot hold one block of every group."""
    budget = cpu_bytes_to_use
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise ValueError(f"cpu_bytes_to_use must be a non-negative integer, got {budget!r}")
    plans = group_by_size(groups)
    per_block_of_each_group = sum(p.slot_bytes * len(p.groups) for p in plans)
    blocks_per_group = cpu_bytes_to_use // per_block_of_each_group
    if blocks_per_group == 0:
        raise PoolSizeError(
            f"cpu_bytes_to_use ({human_bytes(cpu_bytes_to_use)}) cannot hold one block of "
            f"each of the {len(groups)} KV groups ({human_bytes(per_block_of_each_group)}): "
            f"raise cpu_bytes_to_use to at least {per_block_of_each_group}"
        )
    return [PoolPlan(p.block_bytes, p.groups, blocks_per_group * len(p.groups)) for p in plans]


def _shifted(progress: ProgressFn | None, before: int, total: int) -> ProgressFn | None:
    """One pool's progress as part of all pools' progress."""
    if progress is None:
        return None
    return lambda done, _: progress(before + done, total)


class CpuPools:
    """The pools of one model, one per distinct block size; `pool_for_group(i)` is the
    pool holding group `i`'s blocks. `options` go to every `CpuPool` (pin, prefault,
    chunk_bytes, shm_dir, cuda_flags, cuda_backend); `progress` covers all pools.
    Shared pools are named `<name>.<pool index>`."""

    def __init__(
        self,
        groups: Sequence[BlockGeometry],
        cpu_bytes_to_use: int,
        *,
        shared: bool = False,
        name: str | None = None,
        progress: ProgressFn | None = None,
        **options: Any,
    ):
        plans = plan_pools(groups, cpu_bytes_to_use)
        if name is not None and not shared:
            raise ValueError("only shared pools have a name: pass shared=True")
        if shared:
            name = name if name is not None else f"{os.getpid()}-{secrets.token_hex(6)}"
            shm_path(name + ".0", options.get("shm_dir", SHM_DIR))  # validate the name
        # Check the whole budget first: each pool checks only itself, and one that
        # fits after its siblings were allocated must not be the first refusal.
        check_pool_fits(
            sum(p.nbytes + (HEADER_BYTES if shared else 0) for p in plans),
            shm_dir=options.get("shm_dir", SHM_DIR) if shared else None,
            what=f"the {len(plans)} CPU pools",
        )
        total = sum(p.nbytes for p in plans)
        pools: list[CpuPool] = []
        try:
            for index, plan in enumerate(plans):
                pools.append(
                    CpuPool(
                        plan.block_bytes,
                        plan.nbytes,
                        shared=shared,
                        name=f"{name}.{index}" if shared else None,
                        progress=_shifted(progress, sum(p.nbytes for p in pools), total),
                        **options,
                    )
                )
        except BaseException:
            for pool in pools:
                pool.close()
            raise
        self._setup(pools, plans, len(groups), name)

    @classmethod
    def attach(
        cls,
        name: str,
        groups: Sequence[BlockGeometry],
        *,
        progress: ProgressFn | None = None,
        **options: Any,
    ) -> CpuPools:
        """Attach to the pools another process created as `name` for these groups."""
        plans = group_by_size(groups)
        shm_dir = options.get("shm_dir", SHM_DIR)
        sizes = []
        for index in range(len(plans)):  # read the sizes first, for one progress total
            backing, header = open_shm(shm_path(f"{name}.{index}", shm_dir))
            backing.mm.close()
            sizes.append(header.nbytes)
        pools: list[CpuPool] = []
        try:
            for index, plan in enumerate(plans):
                pools.append(
                    CpuPool.attach(
                        f"{name}.{index}",
                        plan.block_bytes,
                        progress=_shifted(progress, sum(sizes[:index]), sum(sizes)),
                        **options,
                    )
                )
        except BaseException:
            for pool in pools:
                pool.close()
            raise
        self = cls.__new__(cls)
        self._setup(pools, plans, len(groups), name)
        return self

    def _setup(
        self, pools: list[CpuPool], plans: list[PoolPlan], num_groups: int, name: str | None
    ) -> None:
        self.pools: tuple[CpuPool, ...] = tuple(pools)
        self.name = name
        self._pool_of_group = [0] * num_groups
        for index, plan in enumerate(plans):
            for group in plan.groups:
                self._pool_of_group[group] = index
        self.blocks_per_group = min(
            pool.num_slots // len(plan.groups) for pool, plan in zip(pools, plans, strict=True)
        )

    def pool_index(self, group_index: int) -> int:
        """Which of `pools` holds group `group_index`'s blocks."""
        if not 0 <= group_index < len(self._pool_of_group):
            raise IndexError(
                f"KV group {group_index} out of range 0..{len(self._pool_of_group) - 1}"
            )
        return self._pool_of_group[group_index]

    def pool_for_group(self, group_index: int) -> CpuPool:
        return self.pools[self.pool_index(group_index)]

    @property
    def nbytes(self) -> int:
        return sum(pool.nbytes for pool in self.pools)

    def __len__(self) -> int:
        return len(self.pools)

    def __iter__(self) -> Iterator[CpuPool]:
        return iter(self.pools)

    def close(self) -> None:
        """Close every pool (idempotent)."""
        for pool in self.pools:
            pool.close()

    def __enter__(self) -> CpuPools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{p.num_slots} x {p.block_bytes} B" for p in self.pools)
        return f"<CpuPools {self.name or 'anonymous'}: {sizes}; {human_bytes(self.nbytes)}>"
