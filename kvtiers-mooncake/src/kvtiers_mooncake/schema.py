"""The config schema of the `mooncake` tier, and the names vLLM's
MooncakeStoreConnector gives the same options.

Imported by the plugin module, so it imports nothing but the standard library and
`kvtiers.plugins`: `kvtiers plugins` and `kvtiers validate` stay fast and work
without Mooncake's native library. What the options mean once resolved is
`settings.py`.
"""

from __future__ import annotations

from typing import Any

from kvtiers.plugins import CAPACITY_BYTES, EVICTION_POLICY

MiB = 1 << 20
PROTOCOLS = ("tcp", "rdma")
#: P2PHANDSHAKE: clients exchange their segment descriptors directly, no metadata
#: server (Mooncake's own word for it)
P2P = "P2PHANDSHAKE"

#: vLLM's MooncakeStoreConnector JSON key -> the option it means here (applied when
#: the config is a vLLM kv_transfer_config)
VLLM_ALIASES: dict[str, str] = {
    "master_server_address": "master_address",
    "global_segment_size": "segment_bytes",
    "local_buffer_size": "buffer_bytes",
    "device_name": "rdma_devices",
}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "master_address": {
            "type": "string",
            "minLength": 3,
            "description": "the Mooncake master's RPC address, host:port (vLLM: "
                           "master_server_address)",
        },
        "metadata_server": {
            "type": "string",
            "minLength": 1,
            "default": P2P,
            "description": (
                f'"{P2P}" (no metadata server: clients exchange segment descriptors '
                "directly), or the metadata server's URL (http://host:port/metadata, "
                "etcd://host:port)"
            ),
        },
        "local_hostname": {
            "type": "string",
            "minLength": 1,
            "default": "127.0.0.1",
            "description": (
                "the address other Mooncake clients reach this one at (its segment and "
                "transfer endpoint); a routable address on a fleet"
            ),
        },
        "protocol": {
            "enum": list(PROTOCOLS),
            "default": "tcp",
            "description": "Mooncake's transport: tcp, or rdma (then name rdma_devices)",
        },
        "rdma_devices": {
            "type": "string",
            "default": "",
            "description": "RDMA devices for protocol rdma, comma-separated (vLLM: "
                           "device_name)",
        },
        "segment_bytes": {
            "type": ["integer", "null"],
            "minimum": 0,
            "default": None,
            "description": (
                "memory this engine contributes to the store (Mooncake's global segment; "
                "vLLM: global_segment_size), at least 16 MiB. Null: capacity_bytes plus a "
                "quarter and 4 MiB (headers, the master's 90% eviction watermark), so the "
                "fleet's memory follows its quotas; 0: none (the store lives on other "
                "nodes). Objects in it are lost when this engine stops"
            ),
        },
        "buffer_bytes": {
            "type": "integer",
            "minimum": MiB,
            "default": 16 * MiB,
            "description": (
                "Mooncake's local transfer buffer (vLLM: local_buffer_size); blocks move "
                "zero-copy from the pool, so it only serves checks and tools"
            ),
        },
        "capacity_bytes": {
            **CAPACITY_BYTES,
            "description": (
                "Block bytes this engine may keep in the store (its quota of what it "
                "put); kvtiers evicts by eviction_policy and removes objects once "
                "their lease allows. The master evicts on its own too"
            ),
        },
        "eviction_policy": {**EVICTION_POLICY},
        "prefix": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100,
            "pattern": "^[A-Za-z0-9._-]+$",
            "default": "kvtiers",
            "description": "start of every object name: <prefix>/<namespace>/<key as hex>",
        },
        "tenant": {
            "type": "string",
            "minLength": 1,
            "maxLength": 100,
            "default": "default",
            "description": (
                "Mooncake's tenant_id; the master separates tenants only when it runs "
                "with --enable_multi_tenants (and refuses tenants its quota policy "
                "file does not list)"
            ),
        },
        "replicas": {
            "type": "integer",
            "minimum": 1,
            "maximum": 16,
            "default": 1,
            "description": "copies the master keeps of each block, in distinct segments",
        },
        "prefer_local_segment": {
            "type": "boolean",
            "default": True,
            "description": (
                "ask the master to place a block's first copy in this engine's own "
                "segment (a local memory copy; it falls back elsewhere when full)"
            ),
        },
        "threads": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "load": {"type": "integer", "minimum": 1, "maximum": 64, "default": 2},
                "store": {"type": "integer", "minimum": 1, "maximum": 64, "default": 2},
            },
            "default": {},
            "description": "threads making Mooncake's batch calls, for loads and stores",
        },
        "timeout_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 3600,
            "default": 5.0,
            "description": (
                "longest wait for the master at start-up, for a lookup's probe and at "
                "close, and Mooncake's RPC time-out (MC_RPC_TIMEOUT_MS unless set); jobs "
                "are bounded by their deadlines"
            ),
        },
        "retry_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 600,
            "default": 1.0,
            "description": (
                "after a call fails (master or a segment owner gone), the tier fails "
                "fast for this long, then tries one call again"
            ),
        },
        "admin_address": {
            "type": ["string", "null"],
            "default": None,
            "description": (
                "the master's HTTP admin/metrics address (its --metrics_host:"
                "--metrics_port), for `kvtiers inspect` and to notice blocks the master "
                "evicted; null: not used"
            ),
        },
        "refresh_s": {
            "type": "number",
            "minimum": 0,
            "default": 30.0,
            "description": (
                "with admin_address, list the store's keys this often and forget the "
                "blocks the master evicted (usage stays true); 0: never"
            ),
        },
    },
    "required": ["master_address", "capacity_bytes"],
    "additionalProperties": False,
}
