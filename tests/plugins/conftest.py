"""Fake plugin distributions for registry tests.

`FakePlugins` writes real `*.dist-info` directories and plugin modules into a tmp
directory on `sys.path`, so the registry gets genuine `importlib.metadata.EntryPoint`
objects (with `.dist` bound) — the same objects an installed plugin produces — without
installing anything.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import re
import sys
import textwrap
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from kvtiers.contract import CONTRACT_VERSION
from kvtiers.plugins import Registry, load_registry
from kvtiers.plugins.registry import ENTRY_POINT_GROUP


def tier_module(*names: str, contract_version: int = CONTRACT_VERSION) -> str:
    """Source of a plugin module registering tiers `names` (lazy, never-imported classes)."""
    records = ", ".join(
        f'TierRecord({n!r}, "kvtiers_fake_tiers:{n.title()}Tier", {{"type": "object"}}, '
        f'"fake tier {n}", {contract_version})'
        for n in names
    )
    return textwrap.dedent(
        f"""
        from kvtiers.plugins import TierRecord, hookimpl

        @hookimpl
        def kvtiers_register_tiers():
            return [{records}]
        """
    )


class FakePlugins:
    """Distributions made on the fly; `entry_points()` lists them in the order added."""

    def __init__(self, root: Path):
        self.root = root
        self._prefix = f"kvt_fake_{uuid.uuid4().hex[:8]}_"
        self._order: list[tuple[str, str]] = []  # (distribution, entry-point name)
        self.modules: list[str] = []

    def add(self, dist: str, plugins: Mapping[str, str], version: str = "1.0") -> None:
        """Distribution `dist` with one entry point per `plugins` item: name -> module source."""
        lines = [f"[{ENTRY_POINT_GROUP}]"]
        for ep_name, source in plugins.items():
            module = self._prefix + re.sub(r"\W", "_", f"{dist}_{ep_name}")
            (self.root / f"{module}.py").write_text(source)
            self.modules.append(module)
            lines.append(f"{ep_name} = {module}")
            self._order.append((dist, ep_name))
        info = self.root / f"{re.sub(r'[-.]+', '_', dist)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
        )
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")

    def entry_points(self) -> list[md.EntryPoint]:
        found = {
            (ep.dist.name, ep.name): ep
            for dist in md.distributions(path=[str(self.root)])
            for ep in dist.entry_points
            if ep.group == ENTRY_POINT_GROUP and ep.dist is not None
        }
        return [found[key] for key in self._order]

    def load(self, environ: Mapping[str, str] | None = None) -> Registry:
        """The registry over the built-ins and these plugins only; the real process
        environment never leaks in (`environ` defaults to empty)."""
        return load_registry(self.entry_points(), environ=environ or {})


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakePlugins]:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    fakes = FakePlugins(root)
    yield fakes
    for module in fakes.modules:
        sys.modules.pop(module, None)
    importlib.invalidate_caches()
