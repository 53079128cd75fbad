"""kvtiers-broken: a plugin that fails on import, for the plugin system's tests."""
