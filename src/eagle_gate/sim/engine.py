"""The step-level serving simulator.

One :class:`Simulator` run serves a :class:`Scenario` (closed-loop concurrency
schedule or open-loop Poisson arrival-rate schedule) on a
:class:`~eagle_gate.sim.profiles.Profile` and drives a policy through the
real contract, like the server does:

* one :class:`~eagle_gate.policy.StepView` is reused; before every decode batch
  the simulator calls ``view.update(...)`` and ``policy.decide(view)``;
* the outcome of step N is handed to ``policy.observe`` only after
  ``decide`` for step N+1 (overlap scheduling: results arrive one step late),
  or, with ``Scenario.max_delay = 2``, after ``decide`` for step N+1 or N+2
  (drawn per step, order kept: a full pipeline);
* PLAIN outcomes carry ``draft_matches`` under eager draft sync
  (``Scenario.draft_sync``): per request a Bernoulli draw with the request's
  first-position acceptance (the same draw a SPEC step would have used for
  its first draft token, so common random numbers hold);
* ``interval_s`` is the simulated duration of the step, or ``None`` when a
  prefill batch ran (or the server idled) since the previous decode step.
* draft depths: the view offers ``Profile.spec_depths()`` (1, 3, 5, 7 and
  the configured depth unless the profile names its own); a SPEC step runs
  ``view.depth`` (the configured depth unless the policy chose another), and
  its outcome carries ``depth`` and ``accepted_at_least`` (from the verify's
  draws, before a finishing request is cut to its length); PLAIN outcomes
  carry depth 0. Depth 0 with ``Mode.SPEC`` is SGLang's 1-token verify, run
  for the ``sglang-ema`` baseline only.

Per-depth cost (:mod:`eagle_gate.sim.profiles`): a SPEC step at depth ``s``
verifies ``s + 1`` tokens per request (a target forward over ``b * (s + 1)``
tokens, at least a PLAIN step's cost), runs ``s`` draft forwards of the
batch and one draft extend over the ``b * (s + 1)`` verified tokens, as
SGLang's EAGLE worker does (draft, verify, then the draft's extend over the
accepted tokens, launched at the full width). So deeper steps pay a draft
forward each and a wider verify and extend, and pay off only while
``alpha ** s`` is large. Depth 0 (SGLang's "off") still pays the extend and
a verify, which is why the gate's depth 0 is a true decode instead. Measured
tables give one depth; the others scale its measured excess over PLAIN like
the formula (an additive shift by the formula's difference, used before, made
depths 0 and 1 cheaper than a PLAIN step, or negative, on table profiles whose
formula terms were not fitted to the table, e.g. close-* and drift).

The scheduler is SGLang-like: waiting requests are prefilled (one batch, up to
``max_prefill_tokens``) before the next decode step; a prefill emits each
request's first token; decode batches hold every running request.

Randomness (lengths, classes, acceptance, noise, arrivals) comes from one seeded
generator and pre-drawn pools, so two policies on the same scenario see the
same requests (common random numbers) and a run is reproducible.

The scenario and result types are in :mod:`eagle_gate.sim.scenario`, the
request table and running batch (with what the oracles peek at) in
:mod:`eagle_gate.sim.requests`; this module keeps the step loop.
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Any

from eagle_gate.policy import Mode, StepOutcome, StepView
from eagle_gate.sim.profiles import Profile
from eagle_gate.sim.requests import MASK, POOL, LazySeqLens, RequestTable
from eagle_gate.sim.scenario import Scenario, Segment, SimResult

__all__ = ["Scenario", "Segment", "SimResult", "Simulator", "run_policy"]

_POOL = POOL
_MASK = MASK
_SPEC = Mode.SPEC
_PLAIN = Mode.PLAIN
#: the deepest SPEC step the simulator runs (the acceptance pools hold at
#: most 64 accepted drafts)
_MAX_DEPTH = 64


class Simulator(RequestTable):
    """Serve one scenario on one profile with one policy (see module doc)."""

    def __init__(
        self,
        profile: Profile,
        scenario: Scenario,
        *,
        record: bool = False,
        cpu_seq_lens: bool = True,
    ) -> None:
        self.profile = profile
        self.scenario = scenario
        self.record = record
        #: False: policies see no sequence lengths (``StepView.seq_len_sum``
        #: and ``seq_len_max`` are None), the strictest case of the contract.
        self.cpu_seq_lens = cpu_seq_lens
        #: when ``record``: ("decide", step) / ("observe", step) events, and
        #: per-request (target, emitted) pairs for the accounting checks.
        self.events: list[tuple[str, int]] = []
        rng = random.Random(scenario.seed * 1_000_003 + 17)
        self._rng = rng
        self._class_names = list(profile.classes)
        # geometric pools per class: number of accepted drafts if unbounded
        self._pools: dict[str, list[int]] = {}
        for name, alpha in profile.classes.items():
            if alpha <= 0.0:
                self._pools[name] = [0] * _POOL
                continue
            la = math.log(alpha)
            pool = []
            for _ in range(_POOL):
                u = 1.0 - rng.random()  # (0, 1]
                pool.append(min(64, int(math.log(u) / la)))
            self._pools[name] = pool
        sigma = profile.noise
        self._noise = [math.exp(rng.gauss(0.0, sigma)) for _ in range(_POOL)]
        #: expected tokens per request of a default SPEC step, per pool
        s_def = profile.num_draft_tokens - 1
        #: per-token acceptance per pool (the depth-aware oracle's means)
        self._pool_alpha = {
            id(self._pools[name]): alpha for name, alpha in profile.classes.items()
        }
        self._pool_mean = {
            id(self._pools[name]): profile.mean_accept(alpha, s_def)
            for name, alpha in profile.classes.items()
        }
        # which decode intervals are unknown (its own generator: common random
        # numbers for everything else)
        u = scenario.unknown_share
        if u > 0.0:
            urng = random.Random(scenario.seed * 104_729 + 11)
            self._unknown = [urng.random() < u for _ in range(_POOL)]
        else:
            self._unknown = None
        self._req_rng = random.Random(scenario.seed * 7_919 + 3)
        # reclassing draws come from their own generator: how many requests
        # run at a segment's start depends on the policy
        self._reclass_rng = random.Random(scenario.seed * 6_007 + 13)

    # -- the run -------------------------------------------------------------------

    def run(self, policy: Any) -> SimResult:
        prof = self.profile
        scen = self.scenario
        rec = self.events if self.record else None
        self._reset_requests()
        waiting: deque[int] = deque()
        thinking: deque[float] = deque()  # closed loop: when clients send again
        gap = prof.client_gap_s

        bind = getattr(policy, "bind", None)
        if bind is not None:
            bind(self)

        segs = list(scen.segments)
        seg_end = []
        t = 0.0
        for sgm in segs:
            t += sgm.duration_s
            seg_end.append(t)
        end = t
        warm = scen.warmup_s
        seg_i = 0

        clock = 0.0
        busy = 0.0
        noise = self._noise
        nptr = 0
        active = 0  # closed loop: clients with a request in the system

        if scen.closed_loop and scen.staggered_start and segs:
            active += self._start_staggered(segs[0], waiting)

        # open loop arrivals: thinning-free piecewise-constant Poisson process
        next_arrival = math.inf
        arr_rng = random.Random(scen.seed * 31 + 5)

        def draw_arrival(now: float) -> float:
            # next arrival after `now` under the piecewise-constant rate
            tt = now
            i = 0
            while i < len(segs) and seg_end[i] <= tt:
                i += 1
            while i < len(segs):
                rate = segs[i].level
                if rate > 0:
                    nxt = tt + arr_rng.expovariate(rate)
                    if nxt < seg_end[i]:
                        return nxt
                tt = seg_end[i]
                i += 1
            return math.inf

        if not scen.closed_loop:
            next_arrival = draw_arrival(0.0)

        view = StepView(
            num_draft_tokens=prof.num_draft_tokens, depths=prof.spec_depths()
        )
        lazy_lens = LazySeqLens(self)
        lengths = self.cpu_seq_lens
        pending: deque[tuple[int, StepOutcome]] = deque()
        max_delay = max(1, int(scen.max_delay))
        delay_rng = random.Random(scen.seed * 7_717 + 29)
        last_release = 0
        eager = scen.draft_sync == "eager"
        has_home = hasattr(policy, "home")
        explored_s = 0.0
        prev_decode = False  # was the previous resolution a decode step
        step = 0
        spec_steps = 0
        win_tokens = 0
        total_tokens = 0
        k = prof.num_draft_tokens
        s_default = k - 1
        max_running = prof.max_running
        max_kv = prof.max_kv_tokens
        run_rem = self._run_rem
        run_pool = self._run_pool
        r_emitted = self._r_emitted
        unknown = self._unknown

        while clock < end:
            while seg_i < len(segs) - 1 and clock >= seg_end[seg_i]:
                seg_i += 1
                if scen.reclass_running:
                    self._reclass_running(segs[seg_i].class_probs)
            seg = segs[seg_i]
            # arrivals
            if scen.closed_loop:
                while thinking and thinking[0] <= clock:
                    thinking.popleft()
                    if active + len(thinking) < int(seg.level):
                        waiting.append(self._new_request(clock, seg.class_probs))
                        active += 1
                target = int(seg.level) - len(thinking)
                while active < target:
                    waiting.append(self._new_request(clock, seg.class_probs))
                    active += 1
            else:
                while next_arrival <= clock:
                    cp = segs[min(seg_i, len(segs) - 1)].class_probs
                    waiting.append(self._new_request(next_arrival, cp))
                    next_arrival = draw_arrival(next_arrival)
            # prefill
            if waiting and len(self._run_id) < max_running:
                toks = 0
                batch: list[int] = []
                while waiting and len(self._run_id) + len(batch) < max_running:
                    rid = waiting[0]
                    p = self._r_prompt[rid]
                    if batch and toks + p > prof.max_prefill_tokens:
                        break
                    if self._reserved + p + self._r_out[rid] > max_kv and (
                        self._run_id or batch
                    ):
                        break
                    waiting.popleft()
                    batch.append(rid)
                    toks += p
                    self._reserved += p + self._r_out[rid]
                if batch:
                    self._reserved -= sum(
                        self._r_prompt[r] + self._r_out[r] for r in batch
                    )
                    dt = prof.prefill_time(toks) * noise[nptr & _MASK]
                    nptr += 1
                    clock += dt
                    busy += dt
                    prev_decode = False
                    for rid in batch:
                        self._r_first[rid] = clock
                        r_emitted[rid] = 1
                        total_tokens += 1
                        if clock > warm:
                            win_tokens += 1
                        o = self._r_target[rid]
                        if o <= 1:
                            self._r_done[rid] = clock
                            active -= 1
                            if gap > 0.0:
                                thinking.append(clock + gap)
                        else:
                            self._admit_running(rid, o - 1, self._r_prompt[rid] + 1)
                    continue
            b = len(run_rem)
            if b == 0:
                # idle until the next arrival (open loop) or the schedule moves
                nxt = next_arrival if not scen.closed_loop else end
                if thinking:
                    nxt = min(nxt, thinking[0])
                if seg_i < len(segs) - 1:
                    nxt = min(nxt, seg_end[seg_i])
                nxt = min(nxt, end)
                if nxt <= clock:
                    break
                busy += nxt - clock
                clock = nxt
                prev_decode = False
                continue

            # ---- one decode step ----
            view.update(
                batch_size=b,
                step=step,
                seq_len_sum=self._kv if lengths else None,
                seq_lens=lazy_lens if lengths else None,
            )
            if rec is not None:
                rec.append(("decide", step))
            mode = policy.decide(view)
            off_home = has_home and mode != policy.home
            while pending and pending[0][0] <= step:
                out = pending.popleft()[1]
                if rec is not None:
                    rec.append(("observe", out.step))
                policy.observe(out)
            if mode is not _PLAIN and mode is not _SPEC:
                mode = _SPEC if mode == 0 else _PLAIN
            kv = self._kv
            fin: list[int] = []
            if mode is _SPEC:
                s = view.depth  # the policy's choice, else the configured depth
                if s != s_default and not (type(s) is int and 0 <= s <= _MAX_DEPTH):
                    raise ValueError(f"{policy!r} chose SPEC depth {s!r}")
                kk = s + 1
                dur = prof.spec_time(b, kv, s)
                if self._plain_run:
                    dur += prof.resync_time(b, self._plain_run)
                    self._plain_run = 0
                p = self._ptr
                accl = [0] * b
                tot = 0
                hist = [0] * kk  # requests per accepted drafts (0..s)
                for i in range(b):
                    g = run_pool[i][(p + i) & _MASK]
                    hist[g if g < s else s] += 1
                    a = g + 1 if g < s else kk
                    r = run_rem[i]
                    if a >= r:
                        a = r
                        fin.append(i)
                    run_rem[i] = r - a
                    accl[i] = a
                    tot += a
                self._ptr = (p + b) & _MASK
                spec_steps += 1
                # accepted at least j drafts, j = 1..s: suffix sums of hist
                at_least = [0] * s
                acc = 0
                for j in range(s, 0, -1):
                    acc += hist[j]
                    at_least[j - 1] = acc
                at_least_t: tuple[int, ...] | None = tuple(at_least)
            else:
                dur = prof.plain_time(b, kv)
                self._plain_run += 1
                # the step's acceptance draws are used up either way (the
                # oracle peeks at them; common random numbers across policies);
                # under eager sync the draft proposed the next token, and it
                # matches exactly when the first draft would have been accepted
                p = self._ptr
                self._ptr = (p + b) & _MASK
                matches = 0
                for i in range(b):
                    if eager:
                        matches += run_pool[i][(p + i) & _MASK] > 0
                    r = run_rem[i] - 1
                    run_rem[i] = r
                    if r == 0:
                        fin.append(i)
                accl = [1] * b
                tot = b
                s = 0
                at_least_t = None
            dur *= noise[nptr & _MASK]
            nptr += 1
            if off_home:
                explored_s += dur
            clock += dur
            busy += dur
            self._kv = kv + tot
            total_tokens += tot
            if clock > warm:
                win_tokens += tot
            run_id = self._run_id
            if rec is not None:
                for i, a in enumerate(accl):
                    r_emitted[run_id[i]] += a
            known = prev_decode and (unknown is None or not unknown[step & _MASK])
            release = step + (1 if max_delay == 1 else delay_rng.randint(1, max_delay))
            if release < last_release:
                release = last_release  # in order, as the scheduler resolves
            last_release = release
            pending.append(
                (
                    release,
                    StepOutcome(
                        mode=mode,
                        batch_size=b,
                        tokens=tot,
                        accept_lens=accl,
                        interval_s=dur if known else None,
                        step=step,
                        draft_matches=(matches if eager and mode is _PLAIN else None),
                        depth=s,
                        accepted_at_least=at_least_t,
                    ),
                )
            )
            prev_decode = True
            step += 1
            if fin:
                active -= self._retire(fin, clock, thinking, gap)
        for _, out in pending:
            if rec is not None:
                rec.append(("observe", out.step))
            policy.observe(out)

        tpot_s, completed = self._tpot_and_completed(warm)
        window = clock - warm
        return SimResult(
            policy=getattr(policy, "name", type(policy).__name__),
            scenario=scen.name,
            tokens=win_tokens,
            time_s=window,
            tpot_s=tpot_s,
            decode_steps=step,
            spec_steps=spec_steps,
            completed=completed,
            total_tokens=total_tokens,
            clock_s=clock,
            busy_s=busy,
            explored_share=getattr(policy, "explored_share", None),
            switches=getattr(policy, "switches", None),
            explored_s=explored_s if has_home else None,
        )


def run_policy(profile: Profile, scenario: Scenario, policy: Any) -> SimResult:
    """Convenience: one run of ``policy`` on ``scenario``."""
    return Simulator(profile, scenario).run(policy)
