"""kvtiers-sqlite: a kvtiers secondary tier in one SQLite file.

Deliberately empty: the entry point loads `kvtiers_sqlite.plugin`, and the tier
itself (`kvtiers_sqlite.tier`) is imported only when a config selects it.
"""
