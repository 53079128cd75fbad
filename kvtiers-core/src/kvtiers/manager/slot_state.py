"""Per-slot state and flag values of the CPU pool, as the manager keeps them (one
byte each per slot)."""

# Slot states.
FREE, READY, STORING, PROMOTING, QUARANTINED = 0, 1, 2, 3, 4
# Slot flags.
DIRTY = 1  # write_back: not yet copied to the secondary tiers
LEAVING = 2  # write_back: evicted, freed once its cascades end
