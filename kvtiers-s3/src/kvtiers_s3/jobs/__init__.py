"""The tier's jobs: the `AsyncJobHooks` that store and load blocks, one request per
work item, on the event loop of the core's `AsyncJobEngine`.

- `stores`: store jobs - plan the objects, reserve room, PUT them.
- `loads`: load jobs - group the keys by object, GET them into the slots.
- `placing`: records into slots, each verified against its checksum (off the loop).
- `ranges`: the ranged reads of one segment, coalesced.
- `iocontext`: what every request shares - the store, copier threads, time limits,
  background deletes.
- `latency`: how long each request took, in fixed memory.
"""
