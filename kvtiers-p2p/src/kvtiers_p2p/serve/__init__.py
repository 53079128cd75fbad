"""The serving side: this engine's CPU pool answered to peers.

`server` (`PeerServer`: the ROUTER thread - handshakes, lookups, leases,
fetches, stores, pins through `ParentManager`), `sessions` (what it keeps per
peer and the limits it serves under; a cache node's `StoreSink`), `sums` (the
checksums it ships, one per block while the block stays in the pool).
"""
