"""The version of the tier contract (`kvtiers.contract`), in a module that imports
nothing.

A plugin record names the version it was written for; the plugin registry compares
it with this one. It lives with the plugin machinery, below the contract: a tier's
context resolves names through the registry (`TierContext.make_policy`,
`build_tier`), so the contract depends on the plugins package and not the other way
round. `kvtiers.contract` and `kvtiers.sdk` re-export it.
"""

# 2: TierContext.make_policy/build_tier/events, on_request_start(request_id, params),
#    4-byte group index in keys (vLLM's OffloadKey), the SDK (kvtiers.sdk);
#    CommandRecord names its functions lazily ("module:function").
#    Later, still 2: SecondaryTier.lookup_in_request(key, request_id) and
#    answers_in_request(), optional with defaults (`lookup(key)`; whether the class
#    overrides it), and ParentManager.watch_removals(listener) (default: False, "I
#    cannot"), so every plugin written for 2 works unchanged: the version is
#    bumped only by a change that breaks one.
CONTRACT_VERSION = 2
