"""Configuration: one JSON document, parsed and validated into typed objects before
anything starts."""

from kvtiers.config.model import TierSection

__all__ = ["TierSection"]
