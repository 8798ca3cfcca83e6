"""One row of the policy suite (``eagle_gate.sim.workloads.policy_suite``,
full length) on one seed, seeded as ``examples/sim_seeds.py --suite`` seeds
it, so a seed a test names is the seed that script reports."""

from __future__ import annotations

from eagle_gate.policy import Policy
from eagle_gate.sim import Simulator
from eagle_gate.sim.workloads import policy_suite

#: ``examples/sim_seeds.py``'s SEED_STRIDE: seed k runs scenario(k * this)
#: (tests/unit/test_policy_tools.py checks they agree).
SEED_STRIDE = 10007


def suite_row_ratio(row: str, seed: int, policy: Policy, baseline: Policy) -> float:
    """``policy``'s tok/s over ``baseline``'s on the suite's ``row``."""
    ((prof, scenario_of),) = [(p, s) for name, p, s in policy_suite() if name == row]
    sc = scenario_of(seed * SEED_STRIDE)
    tok_s = Simulator(prof, sc).run(policy).tok_s
    return tok_s / Simulator(prof, sc).run(baseline).tok_s
