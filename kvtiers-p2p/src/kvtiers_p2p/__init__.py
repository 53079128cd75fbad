"""kvtiers-p2p: the `p2p` tier. Engines pull KV-cache blocks from each other's CPU
pools (or from a standalone cache node): a ZeroMQ control plane with a msgspec
protocol (`kvtiers_p2p.wire.protocol`), blocks with checksums over ZeroMQ frames,
peers authenticated with CURVE.

Importing the package imports no tier code; the tier is
`kvtiers_p2p.tier:P2PTier`, found by kvtiers through the `kvtiers` entry point.

Layout: `plugin` (the entry point's records), `schema` (the config schema),
`tier` (`P2PTier`); `wire/` (the messages between peers and their checks, CURVE,
the NIXL data plane), `pull/` (the puller side: sessions with peers' servers and
the requests made on them), `serve/` (the server side: this pool served to
peers), `node/` (the `kvtiers serve` cache node, an application).
"""

__version__ = "0.1.0"
