"""Which of UCX's transport modules NIXL's UCX backend may load in this process:
every one but EFA's, unless this host has an EFA device or the user has chosen
(`UCX_MODULES` is set).

Why: the NIXL wheels (nixl-cu12 1.5.1) bring UCX with their own copies of
rdma-core's libraries (libibverbs, libmlx5, libnl-3, libnl-route-3, under renamed
file names) for UCX's InfiniBand modules - all but `libuct_ib_efa`, which links
the host's `libefa.so.1`. Where the host has that library (Debian's
`ibverbs-providers`, present on most hosts that run NIXL or Mooncake, with or
without an RDMA device), UCX's module loader opens the EFA module at the first
agent, and with it the host's libibverbs, libnl-3 and libnl-route-3 beside the
wheel's copies. The two libnl-route copies export the same versioned symbols: at
process exit, after the last line of Python, the host copy's destructor calls
the wheel copy's `rtnl_tc_unregister` on an entry that copy never registered,
and the process dies with SIGSEGV (rc 139) - a node after saving its snapshot, a
test runner after its summary. Which transports UCX then uses (`UCX_TLS`) does
not matter: the module is loaded either way.

`UCX_MODULES=^efa` makes UCX's module loader skip the EFA module, so none of the
host's rdma-core is loaded. UCX reads it once, when its library is loaded (the
first NIXL agent), so it is set before NIXL is imported. It is safe where no EFA
device exists: the module drives AWS's Elastic Fabric Adapter only, and without
one it offers no transport; every other module (shared memory, TCP, cross-memory
attach, the InfiniBand ones on the wheel's own libraries) loads as before. It is
an environment variable: processes started later inherit it, on the same host.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["UCX_MODULES", "WITHOUT_EFA", "efa_devices", "keep_efa_module_out"]

UCX_MODULES = "UCX_MODULES"
WITHOUT_EFA = "^efa"  # UCX's allow-list syntax: every module but "efa"
#: one entry per RDMA device; `<device>/device/driver` links to its kernel driver
RDMA_DEVICES = Path("/sys/class/infiniband")

_log = logging.getLogger(__name__)


def efa_devices(sysfs: Path = RDMA_DEVICES) -> list[str]:
    """The RDMA devices under `sysfs` driven by EFA's kernel driver ("efa"),
    sorted; none where `sysfs` is missing or unreadable (UCX finds its devices
    there too: what it cannot see, it cannot use)."""
    try:
        names = sorted(os.listdir(sysfs))
    except OSError:
        return []
    found = []
    for name in names:
        try:
            driver = os.readlink(sysfs / name / "device" / "driver")
        except OSError:
            continue
        if os.path.basename(driver) == "efa":
            found.append(name)
    return found


def keep_efa_module_out(environ: MutableMapping[str, str] | None = None,
                        sysfs: Path = RDMA_DEVICES) -> bool:
    """Set `UCX_MODULES=^efa` in `environ` (the process's environment) unless it
    is set already (the user's choice stands) or this host has an EFA device;
    whether it was set. Call it before NIXL loads UCX: later it changes nothing."""
    env = os.environ if environ is None else environ
    if UCX_MODULES in env:
        return False
    devices = efa_devices(sysfs)
    if devices:
        _log.debug("EFA devices %s: UCX may load its EFA module", ", ".join(devices))
        return False
    env[UCX_MODULES] = WITHOUT_EFA
    return True
