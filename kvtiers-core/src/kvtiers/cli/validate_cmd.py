"""`kvtiers validate CONFIG`: check a config before anything starts.

Exit 0 with a short summary of the resolved stack on stdout (`--show`: every
option; `--json`: the kvtiers document), warnings and notes (what the tiers'
machine checks found, a capacity derived for a vLLM config) on stderr; exit 2 with
one `error: <path>: <message>` line per problem (printed by `kvtiers.cli.main`),
the warnings and notes too. Imports no torch and no tier code. Options a tier's
schema marks `"writeOnly": true` (credentials) print as `***`, in every form.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any

from kvtiers.config import KvtiersConfig, TierSection
from kvtiers.config.model import thaw
from kvtiers.config.redact import redact, redact_config
from kvtiers.config.schema import properties
from kvtiers.config.vllm import TIERING_SPEC
from kvtiers.errors import ConfigError
from kvtiers.humanize import format_bytes
from kvtiers.plugins.registry import Registry

STDIN = "standard input"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        metavar="CONFIG",
        help="a JSON file, an inline JSON object, or - for standard input; a kvtiers "
        "config or vLLM's kv_transfer_config",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the resolved config (defaults filled, vLLM names mapped) as a "
        "kvtiers JSON document",
    )
    parser.add_argument(
        "--show",
        action="store_true",
        help="print every option of the resolved stack, defaults filled in and marked",
    )
    parser.add_argument(
        "--skip-machine-checks",
        action="store_true",
        help="do not check the config against this machine (its memory, each tier's "
        "directories and their filesystems), for a config meant for another machine",
    )


def run(args: argparse.Namespace) -> int:
    from kvtiers.config import load_config
    from kvtiers.config.loader import ConfigRejected
    from kvtiers.config.messages import found
    from kvtiers.config.source import parse_json
    from kvtiers.plugins import get_registry

    source: Any = args.config
    if args.config == "-":
        # Always JSON: a path-looking line on stdin must not be opened as a file.
        source = parse_json(sys.stdin.read(), STDIN)
        if not isinstance(source, dict):
            raise ConfigError(f"expected a JSON object on {STDIN}, found {found(source)}")
    registry = get_registry()
    try:
        config = load_config(source, registry, check_machine=not args.skip_machine_checks)
    except ConfigRejected as exc:
        _warn(exc.warnings)  # an ignored key may be why a required one is missing
        _note(exc.notes)
        raise
    if args.config == "-":
        config = dataclasses.replace(config, source=STDIN)
    _warn(config.warnings)
    _note(config.notes)
    if args.json:
        print(json.dumps(redact_config(config.to_dict(), registry), indent=2))
    elif args.show:
        from kvtiers.cli import show

        fmt = _FORMATS.get(config.source_format, config.source_format)
        print(f"valid: {config.source} ({fmt})\n{show.render(config, registry)}")
    else:
        print(summary(config, registry))
    return 0


_FORMATS = {
    "kvtiers": "kvtiers config",
    "vllm_kv_transfer_config": "vLLM kv_transfer_config",
    "vllm_extra_config": "vLLM kv_connector_extra_config",
    "sglang_extra_config": "SGLang HiCache storage extra config",
}


def _warn(warnings: tuple[str, ...]) -> None:
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def _note(notes: tuple[str, ...]) -> None:
    for note in notes:
        print(f"note: {note}", file=sys.stderr)


def summary(config: KvtiersConfig, registry: Registry) -> str:
    """A few lines a person can check the stack against."""
    fmt = _FORMATS.get(config.source_format, config.source_format)
    b = config.breaker
    lines = [
        f"valid: {config.source} ({fmt})",
        "  cpu pool         SGLang's host pool (--hicache-size / --hicache-ratio)"
        if config.source_format == "sglang_extra_config" else
        f"  cpu pool         {format_bytes(config.cpu_bytes_to_use)} "
        f"({config.cpu_bytes_to_use} bytes), eviction {config.eviction_policy}, "
        f"{config.write_policy}",
        f"  keys             hash seed {config.hash_seed}, model "
        f"{config.model if config.model is not None else '(from the engine)'}",
        f"  failures         jobs time out after {_num(config.job_timeout_s)} s; a tier is "
        f"skipped for {_num(b.cooldown_s)} s after {b.failures} failures in a row",
        f"  cascades         {_queue(config.cascade_queue_blocks)}"
        + ("; only verifying tiers" if config.require_verified_tiers else ""),
    ]
    if config.vllm_spec == TIERING_SPEC:
        lines.append(f"  runs under       vLLM's {TIERING_SPEC}: vLLM's own CPU tier, and "
                     + ("vLLM's own tiers where marked below (kvtiers' reading of their "
                        "options is not what vLLM enforces: see the note)"
                        if config.vllm_runs else "kvtiers' tiers below it"))
    elif config.vllm_spec is not None:
        lines.append(f"  runs under       vLLM's {config.vllm_spec}: kvtiers runs the CPU "
                     "pool and every tier")
    if not config.secondary_tiers:
        lines.append("  secondary tiers  none (the CPU pool only)")
    else:
        lines.append(f"  secondary tiers  {len(config.secondary_tiers)}, searched in this order:")
        for i, tier in enumerate(config.secondary_tiers):
            tier_lines = _tier_lines(tier, registry, f"    {i}. ", "       ")
            if i in config.vllm_runs:
                tier_lines.insert(1, f"       vLLM runs its own {tier.type!r} tier here, not "
                                     "kvtiers': the options above are kvtiers' reading")
            elif config.vllm_spec == TIERING_SPEC:
                tier_lines.insert(1, "       kvtiers runs this tier, below vLLM's CPU tier")
            lines.extend(tier_lines)
            if tier.admission != "all" or tier.admission_options:
                lines.append(f"       admission: {_admission(tier, registry)}")
    return "\n".join(lines)


def _tier_lines(tier: TierSection, registry: Registry, lead: str, indent: str) -> list[str]:
    reg = registry.tiers.get(tier.type)
    schema = reg.record.schema if reg is not None else {}
    origin = f"{reg.distribution} {reg.version}" if reg is not None else "?"
    plain: list[str] = []
    nested: list[tuple[str, TierSection]] = []
    for key, value in tier.options.items():
        if isinstance(value, TierSection):
            nested.append((key, value))
        elif _worth_showing(key, value, properties(schema)):
            shown = redact(thaw(value), properties(schema).get(key), registry)
            plain.append(f"{key}={_show(key, shown)}")
    head = f"{lead}{tier.type} ({origin})"
    lines = [head + (": " + ", ".join(plain) if plain else "")]
    for key, inner in nested:
        lines.extend(_tier_lines(inner, registry, f"{indent}{key}: ", indent + "  "))
    return lines


def _admission(tier: TierSection, registry: Registry) -> str:
    """The policy's name, and its options that differ from their defaults."""
    reg = registry.admissions.get(tier.admission)
    props = properties(reg.record.schema) if reg is not None else {}
    options = {k: v for k, v in thaw(tier.admission_options).items()
               if _worth_showing(k, v, props)}
    if not options:
        return tier.admission
    return f"{tier.admission} " + ", ".join(f"{k}={_show(k, v)}" for k, v in options.items())


def _worth_showing(key: str, value: Any, props: Mapping[str, Any]) -> bool:
    """The options that tell tiers apart: those set to something else than their
    default (every option of a required key has no default, so it shows)."""
    sub = props.get(key)
    if not isinstance(sub, Mapping) or "default" not in sub:
        return True
    return bool(thaw(value) != sub["default"])


def _show(key: str, value: Any) -> str:
    if key.endswith("_bytes") and isinstance(value, int) and not isinstance(value, bool):
        return format_bytes(value)
    return json.dumps(thaw(value), separators=(",", ":"))


def _queue(blocks: int | None) -> str:
    if blocks is None:
        return "queue per tier sized from the pool"
    return f"at most {blocks} blocks queued per tier"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
