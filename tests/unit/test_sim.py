"""Simulator accounting, calibration and policy behaviour (simulated time only)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.suite_rows import SEED_STRIDE, suite_row_ratio

from eagle_gate.goodput import Goodput
from eagle_gate.policies import AlwaysSpec, NeverSpec
from eagle_gate.policy import Mode
from eagle_gate.sim import Scenario, Segment, Simulator, get_profile, load_profile_file
from eagle_gate.sim.__main__ import main as sim_main
from eagle_gate.sim.baselines import EmaTier, Oracle, OracleMean
from eagle_gate.sim.profiles import CLOSE_PROFILES
from eagle_gate.sim.workloads import close_scenarios, grid_scenarios, policy_suite

# a copy of shared/data/seed-pcie-tp8.json, the reference measurements
SEED_JSON = Path(__file__).resolve().parents[1] / "data" / "seed-pcie-tp8.json"


def small_scenario(closed=True, level=6.0, dur=3.0):
    return Scenario(
        name="t", segments=(Segment(dur, level),), closed_loop=closed, seed=3
    )


@pytest.mark.parametrize(
    "policy", [AlwaysSpec, NeverSpec, Goodput, EmaTier, Oracle, OracleMean]
)
@pytest.mark.parametrize("closed", [True, False])
def test_token_and_time_accounting(policy, closed):
    prof = get_profile("single-gpu-8b")
    sim = Simulator(prof, small_scenario(closed, 6.0 if closed else 40.0), record=True)
    res = sim.run(policy())
    acct = sim.request_accounting()
    assert res.completed > 0
    emitted = 0
    for target, got, done in acct:
        assert got <= target
        if done:
            assert got == target  # a finished request got exactly its tokens
        emitted += got
    assert emitted == res.total_tokens
    assert res.busy_s == pytest.approx(res.clock_s)  # every second is accounted
    assert res.clock_s >= 3.0


def test_outcomes_arrive_one_step_late():
    prof = get_profile("seed-pcie-tp8")
    sim = Simulator(prof, small_scenario(level=4.0, dur=2.0), record=True)
    res = sim.run(Goodput())
    decided = [s for kind, s in sim.events if kind == "decide"]
    observed = [s for kind, s in sim.events if kind == "observe"]
    assert decided == list(range(res.decode_steps))
    assert observed == decided  # each outcome exactly once, in order
    pos = {ev: i for i, ev in enumerate(sim.events)}
    for s in decided[:-1]:
        # outcome of step s is delivered after the decision of step s+1
        assert pos[("observe", s)] > pos[("decide", s + 1)]


def test_views_are_reused_and_outcomes_follow_contract():
    prof = get_profile("single-gpu-8b")
    seen_views = set()
    outcomes = []

    class Spy:
        name = "spy"

        def decide(self, view):
            seen_views.add(id(view))
            assert view.batch_size > 0
            assert view.seq_len_max >= view.seq_len_sum // view.batch_size
            return AlwaysSpec().decide(view)

        def observe(self, outcome):
            outcomes.append(outcome)

    Simulator(prof, small_scenario()).run(Spy())
    assert len(seen_views) == 1
    assert any(o.interval_s is None for o in outcomes)  # after prefills
    for o in outcomes:
        assert o.tokens == sum(o.accept_lens)
        assert len(o.accept_lens) == o.batch_size
        assert all(1 <= a <= prof.num_draft_tokens for a in o.accept_lens)


def test_seed_profile_calibrated_within_5_percent():
    data = json.loads(SEED_JSON.read_text())
    prof = get_profile("seed-pcie-tp8")
    scen = dict(grid_scenarios(prof))
    for c, base, eagle in zip(
        data["concurrency"], data["baseline_tok_s"], data["eagle3_tok_s"], strict=True
    ):
        never = Simulator(prof, scen[c]).run(NeverSpec()).tok_s
        always = Simulator(prof, scen[c]).run(AlwaysSpec()).tok_s
        assert abs(never / base - 1) < 0.05, (c, never, base)
        assert abs(always / eagle - 1) < 0.05, (c, always, eagle)


@pytest.mark.parametrize(
    "name",
    [
        "seed-pcie-tp8",
        "single-gpu-8b",
        "long-context",
    ],
)
def test_goodput_close_to_better_fixed_mode(name):
    prof = get_profile(name)
    for c, sc in grid_scenarios(prof, quick=True):
        if c not in (1, 30, 250):
            continue
        gp = Simulator(prof, sc).run(Goodput()).tok_s
        best = max(
            Simulator(prof, sc).run(AlwaysSpec()).tok_s,
            Simulator(prof, sc).run(NeverSpec()).tok_s,
        )
        assert gp >= 0.95 * best, (name, c, gp, best)


@pytest.mark.parametrize("name", ["single-gpu-8b", "seed-pcie-tp8"])
def test_goodput_at_c250_where_spec_steps_go_untimed(name):
    """C=250 (quick, 300 steps): SPEC finishes requests at every step, so
    the next step comes after a prefill and is untimed (single-gpu-8b: 2 of
    73 always-SPEC steps timed). Running SPEC until one was timed (33 steps,
    4.8x a PLAIN step) reached 0.907 of the better fixed mode; a look at
    PLAIN, and the SPEC step after it standing in for SPEC's time, 0.997."""
    prof = get_profile(name)
    sc = dict(grid_scenarios(prof, quick=True))[250]
    gp = Simulator(prof, sc).run(Goodput()).tok_s
    best = max(
        Simulator(prof, sc).run(AlwaysSpec()).tok_s,
        Simulator(prof, sc).run(NeverSpec()).tok_s,
    )
    assert gp >= 0.98 * best, (gp / best, gp, best)


def test_profile_files(tmp_path):
    js = tmp_path / "p.json"
    js.write_text(
        json.dumps(
            {
                "name": "mine",
                "plain_fixed": 0.01,
                "classes": {"code": 0.8, "chat": 0.4},
                "prompt_len": [100, 200],
                "spec_table": [[1, 0.02], [64, 0.05]],
            }
        )
    )
    prof = load_profile_file(js)
    assert prof.name == "mine" and prof.prompt_len == (100, 200)
    assert prof.spec_time(32, 0) == pytest.approx(0.02 + 0.03 * 31 / 63)
    if sys.version_info >= (3, 11):
        tm = tmp_path / "p.toml"
        tm.write_text('name = "t"\nverify_fixed = 0.02\n[classes]\ncode = 0.7\n')
        assert load_profile_file(tm).verify_fixed == 0.02
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "bogus": 1}))
    with pytest.raises(ValueError, match="bogus"):
        load_profile_file(bad)


@pytest.mark.slow  # a whole --quick simulator run: about 7 s on an idle core
def test_cli_quick(tmp_path, capsys):
    rc = sim_main(
        [
            "--profile",
            "single-gpu-8b",
            "--workload",
            "ramp",
            "--quick",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "profile single-gpu-8b / workload ramp" in out
    assert "goodput" in out and "oracle" in out
    assert (tmp_path / "single-gpu-8b.txt").exists()


class _Recorded(Goodput):
    """goodput, recording the mode of every step."""

    __slots__ = ("modes",)

    def __init__(self) -> None:
        super().__init__()
        self.modes: list[Mode] = []

    def decide(self, view):
        mode = super().decide(view)
        self.modes.append(mode)
        return mode


@pytest.mark.parametrize("name", ["close-spec-3", "close-plain-3"])
def test_close_call_profiles_are_close_and_goodput_follows(name):
    """#25 finding 6: the worse fixed mode alone scores 0.972-0.976 of the
    better one here, so ">= 0.98 x best" said little. goodput must run the
    better mode on 90% of the second half's steps and come within 1% of the
    better fixed mode; a policy stuck in the worse mode fails both, one that
    flaps the switch count."""
    prof = CLOSE_PROFILES[name]
    rows = dict(close_scenarios(prof, quick=True))
    assert set(rows) == {"C=8", "C=32", "C=4..64"}
    sc = rows["C=32"]
    always = Simulator(prof, sc).run(AlwaysSpec()).tok_s
    never = Simulator(prof, sc).run(NeverSpec()).tok_s
    gap = always / never - 1
    if name.startswith("close-spec"):
        assert 0.01 < gap < 0.05, gap
    else:
        assert -0.05 < gap < -0.01, gap
    pol = _Recorded()
    gp = Simulator(prof, sc).run(pol)
    want = Mode.SPEC if name.startswith("close-spec") else Mode.PLAIN
    late = pol.modes[len(pol.modes) // 2 :]
    assert sum(m is want for m in late) / len(late) >= 0.9
    assert gp.tok_s >= 0.99 * max(always, never), gp.tok_s / max(always, never)
    assert gp.switches is not None and gp.switches <= 60  # flapping: hundreds
    om = Simulator(prof, sc).run(OracleMean()).tok_s
    assert om >= 0.995 * max(always, never)


def test_plain_outcomes_carry_draft_matches_under_eager_sync_only():
    prof = get_profile("single-gpu-8b")  # default class: alpha 0.75
    seen = {}
    for sync in ("eager", "lazy"):
        got = []

        class Spy(NeverSpec):
            def observe(self, outcome, got=got):
                got.append(outcome)

        sc = Scenario("t", (Segment(3.0, 4.0),), seed=3, draft_sync=sync)
        Simulator(prof, sc).run(Spy())
        seen[sync] = got
    eager = [o.draft_matches for o in seen["eager"]]
    assert all(
        m is not None and 0 <= m <= o.batch_size
        for m, o in zip(eager, seen["eager"], strict=True)
    )
    rate = sum(eager) / sum(o.batch_size for o in seen["eager"])
    assert rate == pytest.approx(0.75, abs=0.03)  # first-position acceptance
    assert all(o.draft_matches is None for o in seen["lazy"])
    spec = []

    class SpecSpy(AlwaysSpec):
        def observe(self, outcome):
            spec.append(outcome.draft_matches)

    Simulator(prof, small_scenario()).run(SpecSpy())
    assert spec and all(m is None for m in spec)


def test_outcomes_arrive_one_or_two_steps_late_in_order():
    prof = get_profile("seed-pcie-tp8")
    sc = Scenario("t", (Segment(2.0, 4.0),), seed=3, max_delay=2)
    sim = Simulator(prof, sc, record=True)
    res = sim.run(Goodput())
    observed = [s for kind, s in sim.events if kind == "observe"]
    assert observed == list(range(res.decode_steps))  # each once, in order
    pos = {ev: i for i, ev in enumerate(sim.events)}
    lags = set()
    for s in observed[:-2]:
        assert pos[("observe", s)] > pos[("decide", s + 1)]
        lags.add(1 if pos[("observe", s)] < pos[("decide", s + 2)] else 2)
    assert lags == {1, 2}


@pytest.mark.parametrize("row", ["acc-down b1", "acc-up b1", "jitter b~16"])
def test_goodput_on_policy_suite_rows(row):
    """A few rows of the #23 suite (quick, 2 seeds): within 2% of the
    expected-acceptance oracle on average, no seed below 0.95. A policy that
    does not follow the acceptance (always the initial mode) fails the
    acceptance rows."""
    ((name, prof, scenario),) = [r for r in policy_suite(quick=True) if r[0] == row]
    ratios = []
    for seed in range(2):
        sc = scenario(seed * SEED_STRIDE)
        om = Simulator(prof, sc).run(OracleMean()).tok_s
        ratios.append(Simulator(prof, sc).run(Goodput()).tok_s / om)
    assert sum(ratios) / len(ratios) >= 0.98, ratios
    assert min(ratios) >= 0.95, ratios


def test_a_plain_side_prediction_never_passes_every_draft_accepted():
    # acc-up b1, seed 8: the PLAIN side's rise (agreement 0.375 -> 0.909,
    # both noisy) scaled the accept length to 4.38 where at most 4 tokens
    # (3 drafts) can come; SPEC's samples (~3.2) then pulled the level down
    # from there, its CUSUM restarted it at 2.15 and goodput sat in PLAIN
    # for ~1,260 steps: 0.949 x oracle-mean. Capped at 4: 0.990
    assert suite_row_ratio("acc-up b1", 8, Goodput(), OracleMean()) >= 0.98


def test_a_spec_side_restart_the_plain_side_contradicts_is_undone():
    # acc-up b1, seed 9: a false restart of SPEC's level at batch 1 (3.26 ->
    # 2.18 on 23 requests) sent goodput to PLAIN; 64 PLAIN requests later the
    # PLAIN side predicts 2.87, 2.0 standard errors from the restart (both
    # sides' noise counted). Taken at 2.5 standard errors, PLAIN held for
    # ~1,200 steps: 0.950 x oracle-mean; at 2.0, 0.998
    assert suite_row_ratio("acc-up b1", 9, Goodput(), OracleMean()) >= 0.98


def test_close_workload_reports_unknown_intervals():
    prof = CLOSE_PROFILES["close-spec-1"]
    seen = []

    class Spy(AlwaysSpec):
        def observe(self, outcome):
            seen.append(outcome.interval_s is None)

    _, sc = close_scenarios(prof, quick=True)[0]
    Simulator(prof, sc).run(Spy())
    assert 0.25 <= sum(seen) / len(seen) < 0.5


@pytest.mark.slow  # a whole --quick simulator run: about 7 s on an idle core
def test_cli_close_workload(tmp_path, capsys):
    rc = sim_main(
        [
            "--profile",
            "close-plain-1",
            "--workload",
            "close",
            "--quick",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "profile close-plain-1 / workload close" in out
    assert "oracle-mean" in out and "gp/or-mean" in out
