"""Eviction policies. Each one is a small class behind `EvictionPolicy`, registered
by name through the plugin registry (the core's built-ins are registered in
`kvtiers.default_plugins.policies`)."""

from kvtiers.contract.eviction import EvictionPolicy
from kvtiers.policies.arc import ARCPolicy
from kvtiers.policies.lru import LRUPolicy
from kvtiers.policies.sieve import SievePolicy

__all__ = ["ARCPolicy", "EvictionPolicy", "LRUPolicy", "SievePolicy"]
