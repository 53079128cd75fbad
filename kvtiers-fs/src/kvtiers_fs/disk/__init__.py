"""The tree under a root directory and the block files in it.

- `layout`: where everything lives under a root, the block file format (header,
  idents, names), and the only ways the tier opens, creates and removes paths
  (never following a symlink).
- `blockio`: `BlockIO` - one block between a pool slot and its file (`pwritev` /
  `preadv`, O_DIRECT, checksums, RENAME_NOREPLACE); the batched load path through
  `_readmany`, the optional C helper (`_readmany.c`, built by kvtiers-fs/setup.py).
- `blockdir`: `BlockDir` - metadata operations on a namespace's `blocks/` (shards,
  removing, recycling an evicted block's file, checking a dead writer's file).
- `scan`: the full scan of the block files that a rebuild of the index reads.
"""
