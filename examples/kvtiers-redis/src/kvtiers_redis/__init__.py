"""kvtiers-redis: a kvtiers secondary tier that keeps KV-cache blocks in Redis.

Deliberately empty: the entry point loads `kvtiers_redis.plugin`, and the tier
itself (`kvtiers_redis.tier`, which imports redis-py) only when a config selects it.
"""
