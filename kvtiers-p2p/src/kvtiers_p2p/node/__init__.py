"""`kvtiers serve`: the standalone cache node - an application, not tier code
(it builds a pool and a manager through the engine face `kvtiers`).

`cache_node` (`CacheNode`: the node's pool, manager and tiers, serving engines
through a p2p tier that takes their pushed blocks), `commands` (the `kvtiers
serve` and `kvtiers p2p keygen` command lines, registered by
`kvtiers_p2p.plugin` and imported only to run).
"""
