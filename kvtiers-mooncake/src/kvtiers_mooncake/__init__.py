"""kvtiers-mooncake: a kvtiers secondary tier on Mooncake Store.

Deliberately empty: the entry point loads `kvtiers_mooncake.plugin`, and the tier
itself (`kvtiers_mooncake.tier`, which loads Mooncake's native library) only when a
config selects it.
"""
