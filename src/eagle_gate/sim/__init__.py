"""Step-level serving simulator for eagle_gate policies.

Run ``python -m eagle_gate.sim --help``. See :mod:`eagle_gate.sim.engine` for
the simulation model and :mod:`eagle_gate.sim.profiles` for cost profiles and
the user profile file format.
"""

from eagle_gate.sim.engine import Scenario, Segment, SimResult, Simulator, run_policy
from eagle_gate.sim.profile_files import load_profile_file
from eagle_gate.sim.profiles import (
    BUILTIN_PROFILES,
    Profile,
    get_profile,
)

__all__ = [
    "BUILTIN_PROFILES",
    "Profile",
    "Scenario",
    "Segment",
    "SimResult",
    "Simulator",
    "get_profile",
    "load_profile_file",
    "run_policy",
]
