"""Built-in workloads: concurrency grid, load ramp, two-class mix, open-loop ramp,
close calls."""

from __future__ import annotations

import math
from collections.abc import Callable

from eagle_gate.sim.engine import Scenario, Segment
from eagle_gate.sim.profiles import (
    Profile,
    alternating_profile,
    close_call_profile,
    crossover_profile,
    drift_profile,
)

__all__ = [
    "GRID",
    "WORKLOADS",
    "grid_scenarios",
    "ramp_scenario",
    "mix_scenarios",
    "open_ramp_scenario",
    "close_scenarios",
    "policy_suite",
    "SuiteRow",
    "alternating_rows",
    "ALTERNATING_TARGETS",
]

#: closed-loop concurrencies of the grid (those of seed-pcie-tp8.json).
GRID: tuple[int, ...] = (1, 2, 5, 10, 30, 70, 100, 250)
#: concurrencies at which the two-class mix runs.
MIX_LEVELS: tuple[int, ...] = (2, 10, 30, 100)
#: the ramp: closed-loop clients, up and down.
RAMP_LEVELS: tuple[int, ...] = (1, 2, 5, 10, 30, 70, 100, 250, 100, 70, 30, 10, 5, 2, 1)

WORKLOADS: tuple[str, ...] = ("grid", "ramp", "mix", "open-ramp", "close")
#: the close-call workload: steady concurrencies, then one that moves.
CLOSE_LEVELS: tuple[int, ...] = (8, 32)
CLOSE_MOVING: tuple[int, ...] = (4, 16, 48, 8, 32, 64, 12, 24)
#: share of decode intervals the close-call workload reports as unknown.
CLOSE_UNKNOWN_SHARE = 0.25


def _step_time(profile: Profile, c: int) -> float:
    """Rough duration of a PLAIN decode step (plus amortized prefill) at c."""
    b = min(c, profile.max_running)
    if profile.max_kv_tokens < 10**9:
        b = max(1, min(b, int(profile.max_kv_tokens / profile.mean_context() / 1.5)))
    t = profile.plain_time(b, int(b * profile.mean_context()))
    mean_p = sum(profile.prompt_len) / 2
    mean_o = sum(profile.output_len) / 2
    return t + b / mean_o * profile.prefill_time(int(mean_p))


def grid_steps(c: int, quick: bool) -> int:
    """Decode steps (approximately) simulated per grid point."""
    if quick:
        return max(300, min(800, 12000 // c))
    return max(500, min(2400, 40000 // c))


def grid_scenarios(
    profile: Profile, quick: bool = False, seed: int = 0
) -> list[tuple[int, Scenario]]:
    out = []
    for c in GRID:
        dur = grid_steps(c, quick) * _step_time(profile, c)
        out.append(
            (
                c,
                Scenario(
                    name=f"grid-c{c}",
                    segments=(Segment(dur, c),),
                    closed_loop=True,
                    warmup_s=0.1 * dur,
                    seed=seed + c,
                ),
            )
        )
    return out


def ramp_scenario(profile: Profile, quick: bool = False, seed: int = 0) -> Scenario:
    steps = 120 if quick else 300
    segs = tuple(Segment(steps * _step_time(profile, c), c) for c in RAMP_LEVELS)
    return Scenario(
        name="ramp", segments=segs, closed_loop=True, warmup_s=0.0, seed=seed + 1000
    )


def mix_scenarios(
    profile: Profile, quick: bool = False, seed: int = 0
) -> list[tuple[int, Scenario]]:
    """Closed loop with a high- and a low-acceptance class whose shares swap
    every quarter of the run (90/10, 10/90, 90/10, 10/90)."""
    names = list(profile.classes)
    hi = max(names, key=lambda n: profile.classes[n])
    lo = min(names, key=lambda n: profile.classes[n])
    code_heavy = {hi: 0.9, lo: 0.1}
    chat_heavy = {hi: 0.1, lo: 0.9}
    out = []
    for c in MIX_LEVELS:
        dur = grid_steps(c, quick) * 2 * _step_time(profile, c) / 4
        segs = tuple(
            Segment(dur, c, code_heavy if i % 2 == 0 else chat_heavy) for i in range(4)
        )
        out.append(
            (
                c,
                Scenario(
                    name=f"mix-c{c}",
                    segments=segs,
                    closed_loop=True,
                    warmup_s=0.05 * 4 * dur,
                    seed=seed + 2000 + c,
                ),
            )
        )
    return out


def open_ramp_scenario(
    profile: Profile, quick: bool = False, seed: int = 0
) -> Scenario:
    """Open loop: Poisson arrivals whose rate ramps from 5% to 90% of the
    PLAIN capacity at max_running and back."""
    b = profile.max_running
    cap_tok_s = b / _step_time(profile, b)
    mean_o = sum(profile.output_len) / 2
    cap = cap_tok_s / mean_o  # requests/s
    fracs = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 0.7, 0.5, 0.35, 0.2, 0.1, 0.05)
    per = (40 if quick else 100) * mean_o / cap / 10
    segs = tuple(Segment(per, f * cap) for f in fracs)
    return Scenario(
        name="open-ramp",
        segments=segs,
        closed_loop=False,
        warmup_s=0.0,
        seed=seed + 3000,
    )


def close_scenarios(
    profile: Profile, quick: bool = False, seed: int = 0
) -> list[tuple[str, Scenario]]:
    """Long closed-loop runs for close calls (``close-*`` profiles, but any
    profile works): steady concurrencies and one that moves every few hundred
    steps; a quarter of the decode intervals are unknown on top of those
    after prefills. Batch sizes move from step to step with the clients'
    pauses (the profile's ``client_gap_s``)."""
    steps = 4000 if quick else 12000
    out = []
    for c in CLOSE_LEVELS:
        dur = steps * _step_time(profile, c)
        out.append(
            (
                f"C={c}",
                Scenario(
                    name=f"close-c{c}",
                    segments=(Segment(dur, c),),
                    closed_loop=True,
                    warmup_s=0.05 * dur,
                    seed=seed + 4000 + c,
                    unknown_share=CLOSE_UNKNOWN_SHARE,
                ),
            )
        )
    per = steps // (2 * len(CLOSE_MOVING))
    segs = []
    for _ in range(2):
        for c in CLOSE_MOVING:
            segs.append(Segment(per * _step_time(profile, c), c))
    out.append(
        (
            "C=4..64",
            Scenario(
                name="close-moving",
                segments=tuple(segs),
                closed_loop=True,
                warmup_s=0.0,
                seed=seed + 4999,
                unknown_share=CLOSE_UNKNOWN_SHARE,
            ),
        )
    )
    return out


#: a row of the policy suite: (name, profile, seed -> scenario)
SuiteRow = tuple[str, Profile, Callable[[int], Scenario]]
#: outcomes of the suite arrive 1-2 steps late, as in serving.
SUITE_DELAY = 2
#: the suite's load ramp through the crossover profile's crossover.
SUITE_RAMP: tuple[int, ...] = (4, 8, 16, 24, 32, 48, 64, 48, 32, 24, 16, 8, 4)


def policy_suite(quick: bool = False) -> list[SuiteRow]:
    """The rows a policy is judged on (docs/goodput.md): acceptance drift down and up at
    batch 1 and 8; a close call each way (3%) at batch 1, 4 and 8; batch
    jitter (about +-40% around the crossover, from clients that pause) with a
    quarter of the intervals unknown; a load ramp through the crossover.
    Outcomes arrive 1-2 steps late. Each row builds its scenario from a seed,
    so a row runs over as many seeds as wanted."""
    steps = 2500 if quick else 6000
    drift = drift_profile()
    hi, lo = {"hi": 1.0}, {"lo": 1.0}
    rows: list[SuiteRow] = []

    def drift_row(c: int, first: dict, second: dict, off: int) -> Callable:
        dur = steps / 2 * _step_time(drift, c)
        segs = (Segment(dur, c, first), Segment(dur, c, second))
        return lambda seed: Scenario(
            name=f"drift-c{c}",
            segments=segs,
            seed=seed + off,
            max_delay=SUITE_DELAY,
        )

    for c in (1, 8):
        rows.append((f"acc-down b{c}", drift, drift_row(c, hi, lo, 5000 + c)))
        rows.append((f"acc-up b{c}", drift, drift_row(c, lo, hi, 5100 + c)))
    for gain in (0.03, -0.03):
        prof = close_call_profile(gain)
        for c in (1, 4, 8):
            dur = steps * _step_time(prof, c)

            def make(seed: int, dur=dur, c=c, off=5200 + c + (gain > 0) * 50):
                return Scenario(
                    name=f"close-c{c}",
                    segments=(Segment(dur, c),),
                    warmup_s=0.05 * dur,
                    seed=seed + off,
                    unknown_share=CLOSE_UNKNOWN_SHARE,
                    max_delay=SUITE_DELAY,
                )

            rows.append((f"{prof.name} b{c}", prof, make))
    cross = crossover_profile()
    dur = steps * _step_time(cross, 32)
    rows.append(
        (
            "jitter b~16",
            cross,
            lambda seed: Scenario(
                name="jitter",
                segments=(Segment(dur, 32),),
                warmup_s=0.05 * dur,
                seed=seed + 5300,
                unknown_share=CLOSE_UNKNOWN_SHARE,
                max_delay=SUITE_DELAY,
            ),
        )
    )
    per = steps // len(SUITE_RAMP)
    ramp = tuple(Segment(per * _step_time(cross, c), c) for c in SUITE_RAMP)
    rows.append(
        (
            "ramp b2..32",
            cross,
            lambda seed: Scenario(
                name="ramp-crossover",
                segments=ramp,
                seed=seed + 5400,
                max_delay=SUITE_DELAY,
            ),
        )
    )
    return rows


#: periods of the alternating-acceptance rows (decode steps per phase).
ALTERNATING_PERIODS: tuple[int, ...] = (300, 1000, 3000)
#: batches (closed-loop clients) of the alternating-acceptance rows.
ALTERNATING_BATCHES: tuple[int, ...] = (1, 4, 16, 128)
#: goodput / oracle-mean each alternating row must reach, by draft sync
#: (lazy: no PLAIN-side acceptance samples, a rise is seen by probes only).
ALTERNATING_TARGETS: dict[str, float] = {"eager": 0.97, "lazy": 0.93}


def alternating_rows(
    quick: bool = False,
    syncs: tuple[str, ...] = ("eager", "lazy"),
    periods: tuple[int, ...] = ALTERNATING_PERIODS,
    batches: tuple[int, ...] = ALTERNATING_BATCHES,
) -> list[SuiteRow]:
    """Acceptance that takes turns (:func:`alternating_profile`): every
    request's class flips between ``hi`` (alpha 0.88) and ``lo`` (0.5) every
    ``period`` decode steps (each phase lasts ``period`` steps of the mode
    the oracle runs in it), as when tenants with code and chat traffic take
    turns and the content changes mid-request. At batch 1-16 the better mode
    flips with the phase; at 128 PLAIN wins both. At least 4 phases and
    6,000 steps (3,000 quick); outcomes 1-2 steps late; ``syncs`` picks
    eager (PLAIN outcomes carry ``draft_matches``) and lazy (they do not)."""
    prof = alternating_profile()
    total = 3000 if quick else 6000
    s = prof.num_draft_tokens - 1
    rows: list[SuiteRow] = []
    for sync in syncs:
        for period in periods:
            n = max(4, math.ceil(total / period))
            for c in batches:
                segs = []
                for i in range(n):
                    cls = "hi" if i % 2 == 0 else "lo"
                    acc = prof.mean_accept(prof.classes[cls], s)
                    tp = prof.plain_time(c, 0)
                    ts = prof.spec_time(c, 0)
                    t = ts if acc / ts > 1.0 / tp else tp
                    segs.append(Segment(period * t, c, {cls: 1.0}))
                segs_t = tuple(segs)

                def make(seed: int, segs=segs_t, c=c, sync=sync, p=period) -> Scenario:
                    return Scenario(
                        name=f"alternating-p{p}-c{c}",
                        segments=segs,
                        warmup_s=0.02 * sum(x.duration_s for x in segs),
                        seed=seed + 5500 + c + p,
                        max_delay=SUITE_DELAY,
                        draft_sync=sync,
                        reclass_running=True,
                    )

                rows.append((f"alt p{period} b{c} {sync}", prof, make))
    return rows
