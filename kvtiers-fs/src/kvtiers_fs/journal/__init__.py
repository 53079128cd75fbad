"""A namespace's index as its processes share it: the journal and snapshots on
disk, the fold of them in memory, and what the journal's writers leave behind.

- `records`: the on-disk formats - journal records and frames, snapshots, the
  names of their generations.
- `files`: `Journal` (the open `journal.<gen>` a process reads and appends) and
  the `snapshot.<gen>` files (written in pieces, read whole, old ones removed).
- `index`: `BlockIndex` - the journal's fold (committed blocks in the core's
  `BoundedIndex`, intents in flight, touches, removals).
- `indexfiles`: `IndexFiles` - keeps a `BlockIndex` equal to the snapshot and the
  journal (load, catch up, follow and finish rotations, rebuild, next snapshot).
- `writers`: `WriterRegistry` - which writers are alive (a flock per writer).
- `recovery`: `Settlement` of what a dead writer left, and `rebuild_records` from
  a scan of the block files.
"""
