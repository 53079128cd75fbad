"""kvtiers-p2p: the `p2p` tier. Engines pull KV-cache blocks from each other's CPU
pools (or from a standalone cache node): a ZeroMQ control plane with a msgspec
protocol (`kvtiers_p2p.protocol`), blocks with checksums over ZeroMQ frames, peers
authenticated with CURVE.

Importing the package imports no tier code; the tier is
`kvtiers_p2p.tier:P2PTier`, found by kvtiers through the `kvtiers` entry point.
"""

__version__ = "0.1.0"
