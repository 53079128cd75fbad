"""`MooncakeSettings`: the `mooncake` tier's options, resolved and checked once.

`settings_from(config)` validates a section against `schema.SCHEMA` (defaults
filled in, as for a config document) and checks what a schema cannot: the
master's port, rdma_devices given for rdma. Every problem is a `ConfigError`
naming the field. Pure; any thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtiers.errors import ConfigError, ConfigProblem
from kvtiers.sdk import resolve_options

from kvtiers_mooncake.schema import P2P, SCHEMA

__all__ = ["MIN_SEGMENT_BYTES", "MooncakeSettings", "default_segment", "settings_from",
           "split_address"]

#: Mooncake refuses a smaller global segment
MIN_SEGMENT_BYTES = 16 << 20


def default_segment(capacity_bytes: int) -> int:
    """The segment an engine contributes when the config does not say: its quota,
    plus room for headers and for the master's high watermark (it evicts above 90%
    of the segments), and at least Mooncake's minimum."""
    return max(MIN_SEGMENT_BYTES, capacity_bytes * 5 // 4 + (4 << 20))


@dataclass(frozen=True)
class MooncakeSettings:
    master_address: str
    metadata_server: str
    local_hostname: str
    protocol: str
    rdma_devices: str
    segment_bytes: int
    buffer_bytes: int
    capacity_bytes: int
    eviction_policy: str
    prefix: str
    tenant: str
    replicas: int
    prefer_local_segment: bool
    load_threads: int
    store_threads: int
    timeout_s: float
    retry_s: float
    admin_address: str | None
    refresh_s: float

    @property
    def p2p(self) -> bool:
        return self.metadata_server == P2P

    def where(self) -> str:
        """The store, for logs and reports: master, tenant and prefix."""
        return f"mooncake://{self.master_address} tenant={self.tenant} prefix={self.prefix}"


def split_address(text: str, path: str) -> tuple[str, int]:
    """(host, port) of "host:port" (IPv6 in brackets); ConfigError at `path` else."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(ConfigProblem(path, (
            f"mooncake tier: {text!r} is not host:port with a port in 1..65535")))
    return host, int(port)


def settings_from(config: Mapping[str, Any]) -> MooncakeSettings:
    options = resolve_options(SCHEMA, config, "mooncake")
    split_address(str(options["master_address"]), "$.master_address")
    admin = options.get("admin_address")
    if admin is not None:
        split_address(str(admin), "$.admin_address")
    if options["protocol"] == "rdma" and not options["rdma_devices"]:
        raise ConfigError(ConfigProblem("$.rdma_devices", (
            "mooncake tier: protocol rdma needs rdma_devices (e.g. \"mlx5_0\"; see "
            "`ibv_devices`), or use protocol tcp")))
    capacity = int(options["capacity_bytes"])
    segment = options.get("segment_bytes")
    if segment is not None and 0 < int(segment) < MIN_SEGMENT_BYTES:
        raise ConfigError(ConfigProblem("$.segment_bytes", (
            f"mooncake tier: a segment is 0 (none) or at least {MIN_SEGMENT_BYTES} bytes "
            f"(Mooncake's minimum), got {segment}")))
    threads = options.get("threads") or {}
    return MooncakeSettings(
        master_address=str(options["master_address"]),
        metadata_server=str(options["metadata_server"]),
        local_hostname=str(options["local_hostname"]),
        protocol=str(options["protocol"]),
        rdma_devices=str(options["rdma_devices"]),
        segment_bytes=default_segment(capacity) if segment is None else int(segment),
        buffer_bytes=int(options["buffer_bytes"]),
        capacity_bytes=capacity,
        eviction_policy=str(options["eviction_policy"]),
        prefix=str(options["prefix"]),
        tenant=str(options["tenant"]),
        replicas=int(options["replicas"]),
        prefer_local_segment=bool(options["prefer_local_segment"]),
        load_threads=int(threads.get("load", 2)),
        store_threads=int(threads.get("store", 2)),
        timeout_s=float(options["timeout_s"]),
        retry_s=float(options["retry_s"]),
        admin_address=None if admin is None else str(admin),
        refresh_s=float(options["refresh_s"]),
    )
