"""The module the `kvtiers` entry point names: registers the `p2p` tier.

Thin on purpose: `kvtiers plugins` and `kvtiers validate` import it, so the tier
class is named as a "module:Class" string and imported only when a config uses it.
"""

from __future__ import annotations

from kvtiers.plugins import CONTRACT_VERSION, CommandRecord, TierRecord, hookimpl

from kvtiers_p2p.schema import P2P_SCHEMA


@hookimpl
def kvtiers_register_tiers() -> list[TierRecord]:
    return [
        TierRecord(
            name="p2p",
            cls="kvtiers_p2p.tier:P2PTier",
            schema=P2P_SCHEMA,
            description=(
                "peers: pull blocks from other engines' CPU pools (or a cache node) over "
                "ZeroMQ, verified by checksum; serve this engine's pool to them"
            ),
            contract_version=CONTRACT_VERSION,
        )
    ]


@hookimpl
def kvtiers_register_commands() -> list[CommandRecord]:
    return [
        CommandRecord("serve", "run a standalone cache node that p2p peers pull from and "
                      "cascade into", "kvtiers_p2p.node.commands:add_serve_arguments",
                      "kvtiers_p2p.node.commands:run_serve", CONTRACT_VERSION),
        CommandRecord("p2p", "p2p tier tools: keygen (CURVE key pairs)",
                      "kvtiers_p2p.node.commands:add_p2p_arguments",
                      "kvtiers_p2p.node.commands:run_p2p", CONTRACT_VERSION),
    ]
