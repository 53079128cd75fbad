"""Admission policies: which blocks the manager cascades to a secondary tier.

Every tier section may name one (`"admission": "second_touch"`); the default,
`all`, cascades every block, as before. Each policy is a small class behind
`AdmissionPolicy`, registered by name through the plugin registry like eviction
policies (the core's built-ins in `kvtiers.default_plugins.admission`);
`kvtiers.admission.build.build_admission` makes one for a tier section.
"""

from kvtiers.admission.base import AdmissionPolicy, AdmitAll
from kvtiers.admission.second_touch import SecondTouch

__all__ = ["AdmissionPolicy", "AdmitAll", "SecondTouch"]
