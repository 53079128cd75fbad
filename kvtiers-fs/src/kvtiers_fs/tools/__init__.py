"""What the `kvtiers` commands run on the fs tier, besides the tier itself.

- `survey`: `survey(roots)` - every namespace under the roots, read-only, without
  opening the tier (`kvtiers inspect`; `FsTier.survey`).
- `verify`: `verify_tier` - re-read and re-checksum every committed block of the
  tier's namespace, optionally removing bad ones (`kvtiers verify`;
  `FsTier.verify_blocks`).
"""
