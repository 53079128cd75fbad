"""What the tier holds: the objects it counts against `capacity_bytes`, and what is
stored under its namespace prefix.

- `index`: `Holdings` - the held objects in a `BoundedIndex` (the unit of capacity
  and eviction is the object), and which object holds each block key;
  `StoredObject` and `Member` describe one object and one record in it.
- `catalog`: what the prefix holds, found by listing it (start-up, rescans, the
  probes), each segment's index read back; `NAMESPACE.json` and the recency manifest.
- `verdicts`: objects that failed verification, remembered by their ETag, size and
  time, so that probes and listings leave them out until they change.
"""
