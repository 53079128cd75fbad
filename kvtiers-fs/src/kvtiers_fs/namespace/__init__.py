"""One model's namespace on a root directory, shared by every process that opens it.

- `store`: `RootStore` - the namespace on one root: its index, its capacity bound
  across processes, the locks and the reserve / write / commit protocol.
- `write_verdict`: `WriteVerdict` - what a store job learns about each of its
  blocks when it reserves them or stops waiting for another writer.
- `waits`: `IntentWaits` - store jobs waiting for another writer's write of the
  same block.
- `listing`: `NAMESPACE.json` (written at open) and `list_namespaces`, the
  namespaces under a root (`kvtiers validate`, the start-up log).
"""
