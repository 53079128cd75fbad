"""Benchmarks shipped with the core: the workload generator and `kvtiers bench`."""
