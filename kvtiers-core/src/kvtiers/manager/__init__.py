"""The scheduler side: `TieringOffloadingManager` and its helpers."""

from kvtiers.manager.events import OffloadEvent, PrefixLookup, PrepareStoreOutput
from kvtiers.manager.manager import TieringOffloadingManager

__all__ = ["OffloadEvent", "PrefixLookup", "PrepareStoreOutput", "TieringOffloadingManager"]
