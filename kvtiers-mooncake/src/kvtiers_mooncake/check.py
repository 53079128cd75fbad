"""The machine checks of `kvtiers validate` (the tier record's `check`): what a
schema cannot say about a `mooncake` section.

In order, stopping at the first that fails: Mooncake's module loads on this
machine (the wheel is installed; `libibverbs.so.1`, Debian's libibverbs1, is
there - both builds need it even over TCP); the master's RPC port takes a
connection (a 2 s connect timeout: validate never hangs); with `admin_address`,
the master's admin listener answers. Each failure is one `ConfigProblem` at the
JSON path of the option to change (`$.type` for what to install). Facts that
refuse nothing come back as `ConfigNote`s. Runs in the `kvtiers` CLI; blocks for
a few round trips, no more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtiers.errors import ConfigError, ConfigNote, ConfigProblem

from kvtiers_mooncake import admin
from kvtiers_mooncake.native import MooncakeMissing, load_store_module
from kvtiers_mooncake.settings import settings_from

__all__ = ["check_mooncake"]

CONNECT_TIMEOUT_S = 2.0


def check_mooncake(options: Mapping[str, Any]) -> list[ConfigProblem | ConfigNote]:
    from kvtiers_mooncake.tier import master_answers  # the tier module loads no native code

    try:
        settings = settings_from(options)
    except ConfigError as exc:
        return list(exc.problems)
    try:
        load_store_module()
    except MooncakeMissing as exc:
        return [ConfigProblem("$.type", f"mooncake tier: {exc}")]
    why = master_answers(settings.master_address, CONNECT_TIMEOUT_S)
    if why is not None:
        return [ConfigProblem("$.master_address", (
            f"mooncake tier: the master at {settings.master_address} does not answer "
            f"({why}); start mooncake_master (--rpc_address/--rpc_port) or correct the "
            "address"))]
    remarks: list[ConfigProblem | ConfigNote] = []
    if settings.admin_address is not None:
        try:
            view = admin.master_view(settings.admin_address, CONNECT_TIMEOUT_S)
        except OSError as exc:
            return [ConfigProblem("$.admin_address", (
                f"mooncake tier: the master's admin listener at {settings.admin_address} "
                f"does not answer ({exc}); it is mooncake_master's --metrics_host:"
                "--metrics_port"))]
        remarks.append(ConfigNote("$.admin_address", (
            f"mooncake tier: the master holds {view.key_count} objects, "
            f"{view.allocated_bytes} of {view.capacity_bytes} bytes of segments allocated")))
    if settings.p2p:
        remarks.append(ConfigNote("$.metadata_server", (
            "mooncake tier: P2PHANDSHAKE - no metadata server; clients exchange segment "
            "descriptors directly")))
    return remarks
