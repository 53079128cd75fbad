"""What travels between peers, and its checks - both sides use it.

`protocol` (every message, a msgspec Struct, and the protocol's limits), `codec`
(encoding and the checked decoders: nothing a peer sends is used before it is
within those limits), `handshake` (who a side is; why a peer is refused),
`security` (CURVE key pairs and allow-lists for the ZeroMQ sessions), and
`nixl_plane` (the NIXL data plane: agents, registered pools, READs of a peer's
slots), `ucx_modules` (which UCX modules NIXL may load: a process must survive its
exit). Nothing here knows a tier, a link or a server.
"""
