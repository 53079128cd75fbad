"""The CPU pool: the gateway tier's shared memory, one slot per block.

- `CpuPool` (`kvtiers.pool.cpu_pool`): one pool of equal slots, created by the
  scheduler process and attached by GPU workers; `pool.view` is the contract's
  `PoolView` that the manager and the tiers use.
- `CpuPools` (`kvtiers.pool.groups`): one pool per block size, for models whose KV
  groups differ, the byte budget split in proportion (`plan_pools`).
- `kvtiers.pool.memory`: the memory behind a pool (anonymous or /dev/shm), its
  header, and the machine's limits that a pool must fit.
- `kvtiers.pool.pinning`: prefaulting and CUDA registration, in chunks.

Importing this package does not import torch.
"""

from kvtiers.pool.cpu_pool import (
    DEFAULT_CHUNK_BYTES,
    CpuPool,
    PinError,
    PoolAttachError,
    PoolError,
    PoolSizeError,
    ProgressFn,
    pool_shape,
)
from kvtiers.pool.groups import CpuPools, PoolPlan, plan_pools

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "CpuPool",
    "CpuPools",
    "PinError",
    "PoolAttachError",
    "PoolError",
    "PoolPlan",
    "PoolSizeError",
    "ProgressFn",
    "plan_pools",
    "pool_shape",
]
