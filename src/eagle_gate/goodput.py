"""The ``goodput`` policy: pick the mode with more expected output tokens/second.

Per decode-batch bucket (batch size in half-octaves x mean context length in
coarse octaves) the policy keeps an online estimate (EMA) of

* the PLAIN step interval ``tp``,
* the steady SPEC step interval ``ts`` (first SPEC steps after PLAIN excluded),

and, across buckets, an EMA of the tokens one SPEC step emits per request
(``acc``, the mean accept length, bonus token included). SPEC emits
``acc / ts`` tokens per request and second, PLAIN ``1 / tp``; the policy runs the
mode with the larger rate.

Switching cost and dwell: the extra interval of the first SPEC step after PLAIN
steps (the draft resync / catch-up) is measured and kept relative to the steady
SPEC interval (``resync_rel``). After a switch the policy stays in the new mode
for ``dwell = ceil(resync_rel / switch_overhead)`` steps, so resyncs cost at most
``switch_overhead`` of the time spent speculating, and it only enters SPEC when
SPEC's predicted gain exceeds that same share (hysteresis). No hand-tuned step
counts: both follow from the measured resync.

Exploration: the mode not being run gets no fresh measurements. Where a bucket
has no estimate for a mode, or that estimate is older than its staleness
horizon, the policy runs a short probe of the other mode (``probe_steps``
steps, extended up to 4x while none of them gave a usable interval). Probes
are limited to ``max_explore_share`` of the decided steps (plus a start credit
of ``2 * probe_steps`` steps for the cold start and at most one probe's length
of overdraft; unused budget is capped at ``4 * probe_steps``). A bucket's
horizon doubles each time it is probed, and is at least long enough that the
time a probe is expected to lose (from the current estimates, resync included)
is at most ``explore_cost`` of the time between probes; a cold bucket's first
probe waits the same way when the nearest measured bucket predicts a costly
probe. The horizon resets when the bucket's decision flips, so a clear winner
is re-checked ever more rarely. ``explored_share`` reports the share of steps.

Cold start: the policy starts in ``initial_mode`` (SPEC, SGLang's stock
behaviour, by default); in a new bucket it first takes a sample of the mode it
is in, then probes the other one; until a bucket has both, it follows the
nearest bucket that has. Under heavy load most intervals are ``None`` (a
prefill ran in between); when the current mode yields no usable interval for
``4 * probe_steps`` steps the policy moves to the mode that does. A first SPEC
step after PLAIN seeds a bucket's SPEC estimate (less the resync, once one
was measured) until a steady sample replaces it.

Sequence lengths: the context bucket uses ``StepView.seq_len_sum``, exact or
the adapter's estimate (close enough for octave buckets); where it is unknown
(None) every step counts as the shortest context, so buckets differ by batch
size only.

Late outcomes: outcomes arrive 1-2 steps after their decision; the bucket a
decision used is kept in a small ring indexed by step, so ``observe`` attributes
each outcome to the bucket of its own decision. Outcomes with
``interval_s=None`` update only the acceptance estimate.

Tensor parallelism: every rank must take the same decision. The policy is a
deterministic function of its inputs (no clocks, no randomness); batch sizes,
steps and accept lengths agree across ranks, and the timings it is given are
expected to be *agreed* values (the adapter supplies rank 0's measured
intervals to every rank). Given identical inputs every rank holds identical
state and decides identically.

Cost: O(1) per call, preallocated flat arrays, no allocation in ``decide`` or
``observe``; a few microseconds in CPython.
"""

from __future__ import annotations

import math

from eagle_gate.hookspecs import hookimpl
from eagle_gate.policy import Mode, PolicyFactory, StepOutcome, StepView
from eagle_gate.settings import Setting

__all__ = ["Goodput", "GOODPUT_SETTINGS", "batch_bucket", "context_bucket"]

_SPEC = Mode.SPEC
_PLAIN = Mode.PLAIN

#: batch-size buckets (half octaves: 1, 2, 3, 4-5, 6-7, 8-11, 12-15, ...).
N_BATCH_BUCKETS = 26
#: mean-context buckets: <1k, 1k-4k, 4k-16k, 16k-64k, >=64k tokens.
N_CONTEXT_BUCKETS = 5
_NB = N_BATCH_BUCKETS
_NBUCKETS = N_BATCH_BUCKETS * N_CONTEXT_BUCKETS
#: outcomes arrive at most a few steps late; the ring remembers 16 decisions.
_RING = 16
_RING_MASK = _RING - 1
#: at least this many steps between switches: the outcome of a decision is
#: known two steps later, plus the step that acts on it.
_MIN_DWELL = 3
#: resync cost (relative to one SPEC step) assumed until one was measured.
_RESYNC_PRIOR = 1.0


def batch_bucket(b: int) -> int:
    """Half-octave bucket of a batch size (0 for an empty batch)."""
    if b < 4:
        return b if b > 0 else 0
    bl = b.bit_length()
    i = 2 * bl - 2 + ((b >> (bl - 2)) & 1)
    return i if i < _NB else _NB - 1


def context_bucket(mean_ctx: int) -> int:
    """Coarse bucket of the mean sequence length per request."""
    x = (mean_ctx >> 10).bit_length()  # 0: <1k, 1: 1-2k, 2: 2-4k, 3: 4-8k ...
    c = (x + 1) >> 1
    return c if c < N_CONTEXT_BUCKETS else N_CONTEXT_BUCKETS - 1


class Goodput:
    """Run whichever of SPEC and PLAIN is measured to emit more tokens/second."""

    name = "goodput"

    __slots__ = (
        "max_explore_share",
        "explore_cost",
        "stale_steps",
        "switch_overhead",
        "ema_alpha",
        "probe_steps",
        "_tp",
        "_ts",
        "_np",
        "_ns",
        "_last_p",
        "_last_s",
        "_horizon",
        "_ring_step",
        "_ring_idx",
        "_acc",
        "_n_acc",
        "_resync_rel",
        "_n_resync",
        "_pending_first",
        "_pending_idx",
        "_home",
        "_switch_step",
        "_dwell",
        "_probe_left",
        "_probe_mode",
        "_probe_done",
        "_probe_got",
        "_decided",
        "_explored",
        "_credit",
        "_credit_cap",
        "_last_obs_mode",
        "_weak",
        "_starve",
        "_starve_limit",
        "_seen",
        "switches",
    )

    def __init__(
        self,
        max_explore_share: float = 0.03,
        explore_cost: float = 0.01,
        stale_steps: int = 256,
        switch_overhead: float = 0.05,
        ema_alpha: float = 0.1,
        probe_steps: int = 3,
        initial_mode: str = "spec",
    ) -> None:
        self.max_explore_share = float(max_explore_share)
        self.explore_cost = float(explore_cost)
        self.stale_steps = int(stale_steps)
        self.switch_overhead = float(switch_overhead)
        self.ema_alpha = float(ema_alpha)
        self.probe_steps = max(2, int(probe_steps))
        n = _NBUCKETS
        self._tp = [0.0] * n  # PLAIN interval EMA per bucket (s)
        self._ts = [0.0] * n  # steady SPEC interval EMA per bucket (s)
        self._np = [0] * n  # PLAIN samples per bucket
        self._ns = [0] * n  # SPEC samples per bucket
        self._last_p = [0] * n  # step of the last PLAIN sample
        self._last_s = [0] * n  # step of the last SPEC sample
        self._horizon = [self.stale_steps] * n  # staleness horizon per bucket
        self._ring_step = [-1] * _RING
        self._ring_idx = [0] * _RING
        self._acc = 0.0  # tokens per request per SPEC step (EMA)
        self._n_acc = 0
        self._resync_rel = _RESYNC_PRIOR  # resync extra / steady SPEC interval
        self._n_resync = 0
        self._pending_first = -1.0  # interval of a first SPEC step awaiting ts
        self._pending_idx = 0
        self._home = _PLAIN if initial_mode == "plain" else _SPEC
        self._switch_step = -(1 << 62)
        self._dwell = self._compute_dwell()
        self._probe_left = 0
        self._probe_mode = _SPEC
        self._probe_done = 0
        self._probe_got = 0
        self._decided = 0
        self._explored = 0
        # start credit: two probes, so the cold start does not wait for budget.
        self._credit = 2.0 * self.probe_steps
        # unused budget does not pile up into long runs of probes later
        self._credit_cap = 4.0 * self.probe_steps
        self._last_obs_mode = self._home
        self._weak = [False] * n  # bucket's ts comes from a resync step only
        self._starve = 0
        self._starve_limit = 4 * self.probe_steps
        self._seen = [0] * n  # cold-path visits per bucket
        #: number of home-mode switches so far (for reporting).
        self.switches = 0

    # -- reporting -------------------------------------------------------------

    @property
    def explored_share(self) -> float:
        """Share of decided steps that were exploration probes."""
        return self._explored / self._decided if self._decided else 0.0

    @property
    def dwell_steps(self) -> int:
        """Current minimum dwell after a switch (derived from the resync cost)."""
        return self._dwell

    @property
    def resync_rel(self) -> float:
        """Measured resync extra interval relative to a steady SPEC step."""
        return self._resync_rel

    def estimates(self, batch_size: int, mean_ctx: int = 0) -> tuple:
        """(tp, ts, acc, n_plain, n_spec) of a bucket, for tests and reports."""
        i = context_bucket(mean_ctx) * _NB + batch_bucket(batch_size)
        return (self._tp[i], self._ts[i], self._acc, self._np[i], self._ns[i])

    # -- internals -------------------------------------------------------------

    def _compute_dwell(self) -> int:
        d = math.ceil(self._resync_rel / self.switch_overhead)
        return d if d > _MIN_DWELL else _MIN_DWELL

    # -- the contract ------------------------------------------------------------

    def decide(self, view: StepView) -> Mode:
        b = view.batch_size
        step = view.step
        self._decided += 1
        if self._credit < self._credit_cap:
            self._credit += self.max_explore_share
        # bucket (inlined batch_bucket / context_bucket for speed)
        if b < 4:
            bi = b if b > 0 else 0
        else:
            bl = b.bit_length()
            bi = 2 * bl - 2 + ((b >> (bl - 2)) & 1)
            if bi >= _NB:
                bi = _NB - 1
        # unknown lengths (StepView contract): the shortest context bucket
        total = view.seq_len_sum
        mc = total // b if total is not None and b > 0 else 0
        c = ((mc >> 10).bit_length() + 1) >> 1
        if c >= N_CONTEXT_BUCKETS:
            c = N_CONTEXT_BUCKETS - 1
        idx = c * _NB + bi
        r = step & _RING_MASK
        self._ring_step[r] = step
        self._ring_idx[r] = idx

        if self._probe_left > 0:  # inside an exploration probe
            # at least probe_steps steps; longer (up to 4x) while none of its
            # steps has given a usable interval yet
            done = self._probe_done + 1
            if done < self.probe_steps or (
                self._probe_got == 0 and done < self._probe_left
            ):
                self._probe_done = done
                self._credit -= 1.0
                self._explored += 1
                return self._probe_mode
            self._probe_left = 0

        home = self._home
        np_ = self._np[idx]
        ns = self._ns[idx]
        if np_ == 0 or ns == 0 or self._n_acc == 0:
            # cold bucket: first the home mode gets its sample (for free), then
            # a probe measures the other one
            home_n = ns if home is _SPEC else np_
            if home_n == 0 or (home is _SPEC and self._n_acc == 0):
                # under heavy load prefills between steps void most intervals;
                # if home yields none for a while, go with the mode that does
                self._starve += 1
                if self._starve <= self._starve_limit:
                    return home
                self._starve = 0
                if (np_ if home is _SPEC else ns) > 0:
                    return self._switch(_PLAIN if home is _SPEC else _SPEC, step, idx)
                if self._credit >= self.probe_steps:
                    return self._start_probe(_PLAIN if home is _SPEC else _SPEC, idx)
                return home
            self._starve = 0
            if self._credit >= self.probe_steps and self._cold_probe_due(idx, home):
                return self._start_probe(_PLAIN if home is _SPEC else _SPEC, idx)
            if step - self._switch_step < self._dwell:
                return home
            # meanwhile, go by the nearest bucket with both estimates
            gain = self._neighbor_gain(idx)
            if gain is None:
                return home
        else:
            other_last = self._last_s[idx] if home is _PLAIN else self._last_p[idx]
            if step - other_last > self._horizon[idx] and (
                self._credit >= self.probe_steps
            ):
                if self._probe_due(idx, home, step - other_last):
                    return self._start_probe(_SPEC if home is _PLAIN else _PLAIN, idx)
            if step - self._switch_step < self._dwell:
                return home
            # relative gain of SPEC over PLAIN in tokens per second
            gain = self._acc * self._tp[idx] / self._ts[idx] - 1.0
        if home is _SPEC:
            if gain < 0.0:
                return self._switch(_PLAIN, step, idx)
        elif gain > self.switch_overhead:
            return self._switch(_SPEC, step, idx)
        return home

    def _neighbor_gain(self, idx: int) -> float | None:
        """SPEC's gain in the nearest batch bucket (same context) measured in
        both modes; bounded scan, only while a bucket is cold."""
        if self._n_acc == 0:
            return None
        row = idx - idx % _NB
        bi = idx - row
        np_ = self._np
        ns = self._ns
        for d in range(1, _NB):
            k = row + bi - d
            if bi - d >= 0 and np_[k] and ns[k]:
                return self._acc * self._tp[k] / self._ts[k] - 1.0
            k = row + bi + d
            if bi + d < _NB and np_[k] and ns[k]:
                return self._acc * self._tp[k] / self._ts[k] - 1.0
        return None

    def _probe_due(self, idx: int, home: Mode, age: int) -> bool:
        """Called once the bucket's horizon has passed. A probe is due when the
        time it is expected to lose (from the current estimates, resync
        included) is at most ``explore_cost`` of the time since the last
        sample; otherwise the horizon is moved to that point. After a probe the
        horizon doubles."""
        tp = self._tp[idx]
        ts = self._ts[idx]
        acc = self._acc
        n = self.probe_steps
        if home is _PLAIN:  # a SPEC probe: its steps beyond PLAIN's, plus a resync
            lost = (n * (ts - acc * tp) + self._resync_rel * ts) / tp
        else:  # a PLAIN probe: its tokens made slower, plus the resync after it
            lost = (n * (tp - ts / acc) + self._resync_rel * ts) / ts
        cost = self.explore_cost
        need = lost / cost if cost > 0.0 else float(1 << 30)
        h = self._horizon[idx]
        if age < need:
            self._horizon[idx] = int(need) + 1 if need < (1 << 30) else 1 << 30
            return False
        h = h + h if h < (1 << 29) else h
        self._horizon[idx] = h
        return True

    def _cold_probe_due(self, idx: int, home: Mode) -> bool:
        """A cold bucket's first probe, unless the nearest measured bucket
        says it would lose more than ``explore_cost`` of the steps this bucket
        has run so far (then it waits, like a stale probe)."""
        seen = self._seen[idx] + 1
        self._seen[idx] = seen
        g = self._neighbor_gain(idx)
        if g is None or g < -0.99:
            return True
        acc = self._acc
        n = self.probe_steps
        rr = self._resync_rel
        if home is _PLAIN:  # SPEC probe, in PLAIN steps: ts/tp = acc/(1+g)
            lost = n * (acc / (1.0 + g) - 1.0) + rr * acc / (1.0 + g)
        else:  # PLAIN probe, in SPEC steps: tp/ts = (1+g)/acc
            lost = n * ((1.0 + g) - 1.0) / acc + rr
        return seen * self.explore_cost >= lost

    def _start_probe(self, mode: Mode, idx: int) -> Mode:
        self._credit -= 1.0
        self._probe_mode = mode
        self._probe_left = 4 * self.probe_steps  # the longest a probe may run
        self._probe_done = 0
        self._probe_got = 0
        self._explored += 1
        return mode

    def _switch(self, mode: Mode, step: int, idx: int) -> Mode:
        self._home = mode
        self._switch_step = step
        self._horizon[idx] = self.stale_steps
        self.switches += 1
        return mode

    def observe(self, outcome: StepOutcome) -> None:
        mode = outcome.mode
        prev = self._last_obs_mode
        self._last_obs_mode = mode
        b = outcome.batch_size
        if b <= 0:
            return
        step = outcome.step
        r = step & _RING_MASK
        if self._ring_step[r] == step:
            idx = self._ring_idx[r]
        else:  # unknown step (should not happen): batch bucket, context 0
            idx = batch_bucket(b)
        alpha = self.ema_alpha
        dt = outcome.interval_s
        if mode is _SPEC or mode == 0:
            # weight by the requests behind the sample: a step of a small batch
            # says less about acceptance than one of a large batch
            n = self._n_acc + b
            self._n_acc = n
            a = b / n if n * alpha < b else alpha * (b if b < 8 else 8) * 0.125
            self._acc += a * (outcome.tokens / b - self._acc)
            if dt is None or dt <= 0.0:
                return
            if prev is not _SPEC and prev != 0:
                # first SPEC step after PLAIN: carries the draft resync
                if self._ns[idx] > 0:
                    self._note_resync(dt, self._ts[idx])
                    return
                # no steady sample yet: keep it for the resync estimate, and
                # start the bucket from it, less the resync measured so far
                self._pending_first = dt
                self._pending_idx = idx
                self._ns[idx] = 1
                # (an upper bound while no resync was measured: errs to PLAIN)
                rr = self._resync_rel if self._n_resync else 0.0
                self._ts[idx] = dt / (1.0 + rr)
                self._last_s[idx] = step
                self._weak[idx] = True
                return
            if self._weak[idx]:  # replace the start value by a real sample
                self._weak[idx] = False
                self._ns[idx] = 0
            n = self._ns[idx] + 1
            self._ns[idx] = n
            self._last_s[idx] = step
            if self._probe_left and self._probe_mode is _SPEC:
                self._probe_got += 1
            a = 1.0 / n if n * alpha < 1.0 else alpha
            ts = self._ts[idx]
            ts += a * (dt - ts)
            self._ts[idx] = ts
            if self._pending_first >= 0.0 and self._pending_idx == idx:
                self._note_resync(self._pending_first, ts)
                self._pending_first = -1.0
        else:
            if dt is None or dt <= 0.0:
                return
            n = self._np[idx] + 1
            self._np[idx] = n
            self._last_p[idx] = step
            if self._probe_left and self._probe_mode is _PLAIN:
                self._probe_got += 1
            a = 1.0 / n if n * alpha < 1.0 else alpha
            self._tp[idx] += a * (dt - self._tp[idx])

    def _note_resync(self, first_dt: float, ts: float) -> None:
        rel = (first_dt - ts) / ts
        if rel < 0.0:
            rel = 0.0
        n = self._n_resync + 1
        self._n_resync = n
        alpha = self.ema_alpha
        a = 1.0 / n if n * alpha < 1.0 else alpha
        self._resync_rel += a * (rel - self._resync_rel)
        self._dwell = self._compute_dwell()


GOODPUT_SETTINGS = {
    "max_explore_share": Setting(
        float,
        0.03,
        "largest share of decode steps spent probing the mode not chosen",
        0.0,
        0.5,
    ),
    "explore_cost": Setting(
        float,
        0.01,
        "re-probe a decided bucket only when the probe's expected loss (time) is "
        "at most this share of the time since the last probe",
        0.0001,
        0.5,
    ),
    "stale_steps": Setting(
        int,
        256,
        "steps after which the other mode's estimate in a bucket is re-probed "
        "(doubles per probe while the decision stands)",
        1,
    ),
    "switch_overhead": Setting(
        float,
        0.05,
        "largest share of SPEC time to spend on draft resyncs; sets the minimum "
        "dwell from the measured resync cost and the gain needed to enter SPEC",
        0.001,
        1.0,
    ),
    "ema_alpha": Setting(
        float, 0.1, "weight of a new sample in the interval/acceptance EMAs", 0.001, 1.0
    ),
    "probe_steps": Setting(int, 3, "steps in one exploration probe", 2, 64),
    "initial_mode": Setting(
        str, "spec", "mode before anything was measured", choices=("spec", "plain")
    ),
}


@hookimpl
def eagle_gate_policies() -> list[PolicyFactory]:
    return [
        PolicyFactory(
            name="goodput",
            create=Goodput,
            description=(
                "measure step intervals and acceptance per batch-size bucket; run "
                "the mode with more tokens/second"
            ),
            settings=GOODPUT_SETTINGS,
        )
    ]
