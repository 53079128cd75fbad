"""Operating persistent tiers: what `kvtiers inspect` and `kvtiers verify` build on.

- `targets`: the persistent tiers of a config, and a tier opened for one of the
  namespaces its store holds;
- `summary`: an inventory as plain data (usage, ages, oldest and newest blocks).
"""
