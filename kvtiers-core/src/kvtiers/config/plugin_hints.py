"""Why a name may be unknown although its plugin is installed: the environment
(`KVTIERS_PLUGINS_DISABLE`, `KVTIERS_PLUGINS_ALLOW`) skipped that plugin.

The registry never imports a skipped plugin, so it cannot know what the plugin
would have registered; the hint names the skipped entry points that plausibly
provide the name (same name, or one of our own distributions for it), and
otherwise every skipped one.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
from collections.abc import Mapping

from kvtiers.plugins.registry import (
    _KNOWN_DISTRIBUTIONS,
    ENTRY_POINT_GROUP,
    ENV_ALLOW,
    ENV_DISABLE,
)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(value: str | None) -> set[str]:
    return {_canonical(v.strip()) for v in (value or "").split(",") if v.strip()}


def disabled_hint(kind: str, name: str, environ: Mapping[str, str] | None = None) -> str:
    """`; ...` naming the skipped plugins that may provide `name`, or ``."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_DISABLE) is None and environ.get(ENV_ALLOW) is None:
        return ""
    disabled = _names(environ.get(ENV_DISABLE))
    allowed = _names(environ.get(ENV_ALLOW)) if environ.get(ENV_ALLOW) is not None else None
    skipped: list[tuple[str, str, str]] = []  # (entry point, distribution, which variable)
    try:
        entry_points = list(md.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # noqa: BLE001 - broken metadata must not break a message
        return ""
    for ep in entry_points:
        dist = ep.dist.name if ep.dist is not None else "?"
        names = {_canonical(ep.name), _canonical(dist)}
        if names & disabled:
            skipped.append((ep.name, dist, ENV_DISABLE))
        elif allowed is not None and not names & allowed:
            skipped.append((ep.name, dist, ENV_ALLOW))
    likely = [
        s for s in skipped
        if _canonical(s[0]) == _canonical(name)
        or (kind == "tier" and _canonical(s[1]) == _KNOWN_DISTRIBUTIONS.get(name))
    ]
    if likely:
        plugin, dist, var = likely[0]
        how = "lists it" if var == ENV_DISABLE else "does not list it"
        return (
            f"; the plugin {plugin!r} of {dist}, which provides {kind} {name!r}, is installed "
            f"but skipped: {var} {how}"
        )
    if skipped:
        listed = ", ".join(f"{plugin!r} ({dist})" for plugin, dist, _ in skipped)
        return f"; plugins skipped by {ENV_DISABLE}/{ENV_ALLOW}, one may provide it: {listed}"
    return ""
