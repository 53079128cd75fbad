"""The `p2p` tier's config schema (JSON Schema draft 2020-12, the section without
its "type" key).

It accepts vLLM's p2p tier keys verbatim (`host`, `port`, `backends`,
`num_threads`, `unbound_store_timeout_s`) plus kvtiers' own (`peers`, `role`,
`data_plane`, `hash_seed`, `keepalive`, `limits`, ...). Unknown keys are refused
by name (additionalProperties: false; the config layer names them). Imported by
the plugin record, so it imports no tier code (only `kvtiers.plugins`' schema
fragments).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.plugins import DRAFT, THREADS

__all__ = ["P2P_SCHEMA", "ROLES"]

#: per-tier roles, as vLLM's p2p tier names them (a request's own role, in its
#: kv_transfer_params, wins)
ROLES = ("remote_kv_source", "remote_prefiller", "remote_decoder")


def _seconds(default: float, description: str, maximum: float = 3600) -> dict[str, Any]:
    return {"type": "number", "exclusiveMinimum": 0, "maximum": maximum,
            "default": default, "description": description}


_ENDPOINT = {
    "type": "string",
    "pattern": "^tcp://[^\\s/]+:[0-9]{1,5}$",
    "title": "a ZeroMQ endpoint, tcp://HOST:PORT",
}

P2P_SCHEMA: Mapping[str, Any] = {
    "$schema": DRAFT,
    "title": "p2p tier",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "host": {
            "type": "string",
            "minLength": 1,
            "default": "127.0.0.1",
            "description": "address this engine serves its CPU pool on (vLLM: host)",
        },
        "port": {
            "type": ["integer", "null"],
            "minimum": 0,
            "maximum": 65535,
            "default": None,
            "description": (
                "TCP port to serve peers on (vLLM: port); 0 picks a free one; null "
                "(the default): this engine only pulls and serves nobody"
            ),
        },
        "data_parallel_rank": {
            "type": "integer",
            "minimum": 0,
            "maximum": 4096,
            "default": 0,
            "description": (
                "this engine's data-parallel rank: a non-zero port is offset by it, so "
                "the replicas on one host do not collide (as vLLM's p2p tier does)"
            ),
        },
        "peers": {
            "type": "array",
            "items": _ENDPOINT,
            "uniqueItems": True,
            "maxItems": 256,
            "default": [],
            "description": (
                "servers to pull from (engines or `kvtiers serve` cache nodes), in order "
                "of preference; a request may name more in its kv_transfer_params"
            ),
        },
        "role": {
            "enum": [*ROLES, None],
            "default": None,
            "description": (
                "the tier's role for requests whose kv_transfer_params name none: "
                "remote_kv_source (probe the peers, pull what they hold), "
                "remote_prefiller (P/D decode side), remote_decoder (P/D prefill "
                "side: serve only); null: remote_kv_source when peers are set"
            ),
        },
        "push": {
            "type": "boolean",
            "default": False,
            "description": (
                "cascade stores into the first ready peer that takes them (a `kvtiers "
                "serve` cache node), with checksums it verifies; false: a store copies "
                "nothing, peers pull from this engine's pool while it holds the block"
            ),
        },
        "data_plane": {
            "enum": ["auto", "nixl", "zmq"],
            "default": "auto",
            "description": (
                '"auto": NIXL when it imports, else ZeroMQ frames; "nixl": require it; '
                '"zmq": always ZeroMQ frames (the fallback)'
            ),
        },
        "backends": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "default": ["UCX"],
            "description": "NIXL backends (vLLM: backends); unused by the ZeroMQ plane",
        },
        "num_threads": {
            **THREADS,
            "default": 4,
            "description": "transfers a puller runs at once (vLLM: num_threads)",
        },
        "transfer_streams": {
            "type": "integer",
            "minimum": 1,
            "maximum": 16,
            "default": 2,
            "description": (
                "NIXL READs a puller moves at once, each on a NIXL agent and copier "
                "thread of its own, each verifying what it moved (at most num_threads; "
                "a copy within one host is CPU work: two streams use two cores)"
            ),
        },
        "unbound_store_timeout_s": _seconds(
            30.0,
            "longest a peer's pins on this engine's pool are held while its blocks "
            "ship (vLLM: unbound_store_timeout_s); past it they are released, and a "
            "block still in flight fails its checksum on the peer (a miss)"),
        "hash_seed": {
            "type": "string",
            "default": "0",
            "description": (
                "the seed this engine's block hashes were made with: peers with another "
                "seed are refused at the handshake (only a digest travels)"
            ),
        },
        "peer_id": {
            "type": "string",
            "maxLength": 200,
            "default": "",
            "description": "this side's name in peers' logs (default: host:pid)",
        },
        "lookup_timeout_s": _seconds(1.0, "longest a peer's lookup answer is awaited"),
        "pending_wait_s": _seconds(
            0.05, "how long a probe asks again for blocks a peer is still writing into "
                  "its pool (a promotion from its own tiers) before calling them misses"),
        "fetch_timeout_s": _seconds(
            10.0, "longest one transfer is awaited (a job's deadline, when sooner, wins)"),
        "lease_s": {
            "type": "number", "minimum": 0, "maximum": 3600, "default": 2.0,
            "description": (
                "NIXL: how long a peer holds the blocks a lookup found, pinned for this "
                "engine's load (which then READs them with no fetch round trip; at most "
                "the peer's unbound_store_timeout_s); 0: no leases, every load fetches"),
        },
        "hit_ttl_s": _seconds(2.0, "how long a peer's yes is believed without asking again"),
        "miss_ttl_s": _seconds(0.5, "how long a peer's no is believed without asking again"),
        "keepalive": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "interval_s": _seconds(1.0, "a keep-alive is sent this often", 600),
                "timeout_s": _seconds(
                    5.0, "a peer silent this long is dropped (its pins released; a "
                         "puller fails its transfers and reconnects)", 3600),
            },
            "default": {"interval_s": 1.0, "timeout_s": 5.0},
            "description": "liveness of sessions, both ways",
        },
        "reconnect": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "min_s": _seconds(0.1, "first wait before reconnecting", 600),
                "max_s": _seconds(10.0, "the wait doubles up to this", 3600),
            },
            "default": {"min_s": 0.1, "max_s": 10.0},
            "description": "backoff of a puller reconnecting to a peer",
        },
        "curve": {
            "type": ["object", "null"],
            "additionalProperties": False,
            "required": ["secret_key_file"],
            "properties": {
                "secret_key_file": {
                    "type": "string", "minLength": 1,
                    "description": "this side's key pair (`kvtiers p2p keygen`; mode 0600)",
                },
                "allowed_keys_dir": {
                    "type": "string", "minLength": 1,
                    "description": (
                        "serving side: a directory of the public key files of the "
                        "peers it accepts; everyone else gets nothing"),
                },
                "server_public_key_file": {
                    "type": "string", "minLength": 1,
                    "description": "pulling side: the public key file of the peers' servers",
                },
            },
            "default": None,
            "description": (
                "ZeroMQ CURVE: encrypted, authenticated sessions with an allow-list of "
                "public keys; null (the default): plain TCP, for trusted networks only"
            ),
        },
        "limits": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_pinned_share": {
                    "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 0.25,
                    "description": "share of this pool one peer may hold pinned at once",
                },
                "max_sessions": {
                    "type": "integer", "minimum": 1, "maximum": 4096, "default": 64,
                    "description": "peers served at once; more are refused",
                },
            },
            "default": {"max_pinned_share": 0.25, "max_sessions": 64},
            "description": "what peers may take of this engine",
        },
    },
}
