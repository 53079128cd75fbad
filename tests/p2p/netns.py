"""Two network namespaces joined by a veth pair, made and removed by a test.

Traffic goes only between the namespaces: the addresses live inside them, and
nothing in the root namespace is configured to reach them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    a: str  # namespace names
    b: str
    addr_a: str
    addr_b: str

    def prefix(self, ns: str) -> list[str]:
        """Command prefix that runs a command inside namespace `ns`."""
        return ["ip", "netns", "exec", ns]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def available() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


@contextmanager
def veth_pair() -> Iterator[Pair]:
    tag = uuid.uuid4().hex[:6]
    a, b = f"kvt-p2p-a-{tag}", f"kvt-p2p-b-{tag}"
    va, vb = f"kva{tag}", f"kvb{tag}"
    # 10.213.x.y/30: a private range, inside the namespaces only
    x = int(tag[:2], 16)
    pair = Pair(a, b, f"10.213.{x}.1", f"10.213.{x}.2")
    made: list[str] = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a)
        _ip("link", "set", vb, "netns", b)
        for ns, dev, addr in ((a, va, pair.addr_a), (b, vb, pair.addr_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth, and the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
