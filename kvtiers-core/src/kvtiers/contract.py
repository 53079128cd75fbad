"""The version of the plugin contract, in a module that imports nothing.

A plugin record names the version it was written for; the plugin registry compares
it with this one. It lives apart from `kvtiers.tier` (which re-exports it, and which
needs the registry to resolve names) so that the plugin machinery depends on no
module that depends on it.
"""

# 2: TierContext.make_policy/build_tier/events, on_request_start(request_id, params),
#    4-byte group index in keys (vLLM's OffloadKey), the SDK (kvtiers.sdk);
#    CommandRecord names its functions lazily ("module:function").
CONTRACT_VERSION = 2
