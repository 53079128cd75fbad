"""Whether an engine's workers span several nodes, for refusing secondary tiers there.

`KvtiersOffloadingSpec`'s tiers run in the engine core and read vLLM's shared CPU
region on the engine core's node only; a worker on another node fills its own node's
region, so what the tiers stored of its part would be wrong bytes. vLLM 0.34 refuses
secondary tiers under its own tiering spec on such an engine (vllm#54415); the spec
refuses them the same way, on 0.33 as well.

An engine's workers form a grid of TP, PP and PCP groups: they share one node if
every such group does. `workers_span_nodes` is a collective over each group (vLLM's
`in_the_same_node_as`): every worker must call it, at the same point (worker set-up).
"""

from __future__ import annotations


def workers_span_nodes() -> bool:
    """True when a TP, PP or PCP group of this engine has workers on several nodes.
    Collective (see the module docstring); blocks until every worker joined."""
    from vllm.distributed import parallel_state as ps

    # Every group's collective runs on every worker before anyone decides.
    spans = [
        group.world_size > 1 and not all(ps.in_the_same_node_as(group.cpu_group, source_rank=0))
        for group in (ps.get_tp_group(), ps.get_pp_group(), ps.get_pcp_group())
    ]
    return any(spans)
