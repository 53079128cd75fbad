"""kvtiers-scratch: a kvtiers tier that keeps KV-cache blocks as files in a scratch
directory. The tier is `kvtiers_scratch.tier.ScratchTier`; `kvtiers_scratch.plugin`
registers it."""
