"""The puller side: this engine's sessions with peers' servers, and what the
tier asks of them.

`session` (`PeerSession`: one peer's session kept up - connect, handshake,
keep-alive, reconnect, replies matched to their requests), `link` (`PeerLink`:
the request verbs on a session - lookup, fetch, push, touch - and the pin budget
they share), `leases` (what lookups leased on a NIXL peer), `nixl_reads` (the
NIXL READs of a link's fetches, batched on the copier threads), `verdicts` (the
outcome per key of a fetch and its verification), `prefills` (the requests whose
remote prefiller holds their blocks), `pushes` (the store hooks with `push`:
blocks cascaded into a cache node).
"""
