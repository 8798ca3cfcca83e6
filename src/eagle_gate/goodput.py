"""The ``goodput`` policy: pick the mode with more expected output tokens/second.

Per decode-batch bucket (batch size in half-octaves x mean context length in
coarse octaves) the policy keeps an online estimate (EMA) of

* the PLAIN step interval ``tp``,
* the steady SPEC step interval ``ts`` (first SPEC steps after PLAIN excluded),

and, across buckets, an EMA of the tokens one SPEC step emits per request
(``acc``, the mean accept length, bonus token included). SPEC emits
``acc / ts`` tokens per request and second, PLAIN ``1 / tp``; the policy runs the
mode with the larger rate.

Switching: evidence, not a single estimate, and the same rule both ways.
Every probe step (see Exploration) gives a *paired* sample of the step-time
ratio ``log(ts / tp)`` in its bucket: the probe's interval against the current
EMA of the mode being run, so drifts of batch and context cancel. That EMA must
be fresh: a probe starts in a bucket only if the mode being run ran there
within the last 16 steps, and a step is paired only with an EMA updated within
48 (else all its pairs would share the EMA's old error). Per bucket
the policy keeps the mean and variance of these samples (weight ``1/n`` down to
1/128, so up to ~255 samples count; a bucket's variance is shrunk towards the
variance pooled over all buckets while it has few samples); acceptance has a
second, slow estimate (a window of 8192 requests, with its per-request
variance) that jumps to the fast EMA when the two differ by more than 4
standard errors (the acceptance changed, not noise). SPEC's log gain in
tokens/second is ``g = log(acc_slow) - mean(log(ts / tp))``, with a standard
error from both variances. From either mode the policy switches when the
other mode is ahead by more than the measured resync spread over the stay a
switch expects (``stale_steps``: a bucket's decision is not re-examined by a
probe sooner), by more than 2.5 standard errors. Until a bucket has 8 paired
samples it goes by the two interval EMAs: a switch needs a gain beyond
``switch_overhead`` and beyond the pooled noise of the EMAs' samples. A
bucket whose winner is not clear keeps probing (4x longer probes, so a resync
buys more samples) until it is.

Dwell: the extra interval of the first SPEC step after PLAIN steps (the draft
resync / catch-up) is measured and kept relative to the steady SPEC interval
(``resync_rel``). After a switch the policy stays in the new mode for
``dwell = ceil(resync_rel / switch_overhead)`` steps, so resyncs cost at most
``switch_overhead`` of the time spent speculating. No hand-tuned step counts:
it follows from the measured resync.

Exploration: the mode not being run gets no fresh measurements. Where a bucket
has no estimate for a mode, or that estimate is older than its staleness
horizon, the policy runs a short probe of the other mode (``probe_steps``
steps, ``4 * probe_steps`` while the bucket has no clear winner, extended by
up to ``3 * probe_steps`` while none of them gave a usable interval). Probes
are limited to ``max_explore_share`` of the decided steps (plus a start credit
of ``2 * probe_steps`` steps for the cold start and at most one probe's length
of overdraft; unused budget is capped at ``4 * probe_steps``), except probes
of a mode that the bucket's evidence already puts ahead, not yet beyond the
noise (its paired samples; before it has 8, its interval EMAs, within
``switch_overhead``): those are expected to gain, not to cost, so only the
``explore_cost`` bound below limits them, and a close call is resolved in
hundreds of steps instead of the thousands the budget would take. A bucket's
horizon doubles each time it is probed while its winner is clear (and is
reset while it is not), and is at least long enough that the time a probe is
expected to lose (from the current estimates, resync included) is at most
``explore_cost`` of the time between probes; a cold bucket's first probe waits
the same way when the nearest measured bucket predicts a costly probe. The
horizon resets when the bucket's decision flips, so a clear winner is
re-checked ever more rarely. ``explored_share`` reports the share of steps.

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

Reporting: ``estimates()`` (the runtime's optional contract, no arguments)
returns a small fixed set of floats: ``accept_length``, ``resync_rel``,
``explored_share`` (probe steps / decided steps), ``leading_probe_share`` (the
part of it that probed a mode the evidence put ahead, not charged to
``max_explore_share``), ``dwell_steps``, ``switches``, ``spec_home`` and, for the
last decided bucket, ``batch_size``, ``plain_tok_s`` / ``spec_tok_s`` (when
that bucket has an estimate of the mode) and ``spec_log_gain`` /
``paired_samples`` (once it has paired samples). ``bucket_estimates(batch,
mean_ctx)`` gives one bucket's raw estimates. ``predicted_plain_rate(view)``
(for the runtime's shadow mode, on steps where the policy would run PLAIN):
the expected output tokens/s of ONE PLAIN step for a batch like ``view``,
i.e. its batch size over its bucket's PLAIN interval (or a neighbouring batch
bucket's), None when none has one; O(1), allocation-free, never raises.

Cost: O(1) per call, preallocated flat arrays, no allocation in ``decide`` or
``observe`` (beyond Python floats). ``decide`` keeps each bucket's verdict of
the paired test until one of its inputs changes (an acceptance fold, the
bucket's pairs, the resync, the home mode), so on most steps it only looks
up the bucket and compares two integers. About 340 bytecodes per
decide+observe on a steady stream, 390 when the batch jumps between buckets
every step (``examples/bench_policy_overhead.py --count-bytecodes``); about
1.5-1.9 microseconds in CPython 3.11 on a 2-core machine.
"""

from __future__ import annotations

import math

from eagle_gate.hookspecs import hookimpl
from eagle_gate.policy import Mode, PolicyFactory, StepOutcome, StepView
from eagle_gate.settings import Setting

__all__ = ["Goodput", "GOODPUT_SETTINGS", "batch_bucket", "context_bucket"]

_SPEC = Mode.SPEC
_PLAIN = Mode.PLAIN
_log = math.log

#: batch-size buckets (half octaves: 1, 2, 3, 4-5, 6-7, 8-11, 12-15, ...).
N_BATCH_BUCKETS = 26
#: mean-context buckets: <1k, 1k-4k, 4k-16k, 16k-64k, >=64k tokens.
N_CONTEXT_BUCKETS = 5
_NB = N_BATCH_BUCKETS
_NBUCKETS = N_BATCH_BUCKETS * N_CONTEXT_BUCKETS
#: outcomes arrive at most a few steps late; the ring remembers 16 decisions.
_RING = 16
_RING_MASK = _RING - 1
#: a ring entry is the bucket index, with this bit set for a probe step.
_PROBE_BIT = 1 << 10
_IDX_MASK = _PROBE_BIT - 1
#: at least this many steps between switches: the outcome of a decision is
#: known two steps later, plus the step that acts on it.
_MIN_DWELL = 3
#: resync cost (relative to one SPEC step) assumed until one was measured.
_RESYNC_PRIOR = 1.0
#: smallest weight of a new paired sample in a bucket's log-ratio mean: the
#: ratio of the two modes' step times in one bucket hardly drifts, so the
#: evidence keeps up to ~255 samples.
_LR_ALPHA_MIN = 1.0 / 128.0
_LR_NEFF_MAX = 2.0 / _LR_ALPHA_MIN - 1.0
#: variance floor of one paired log-ratio sample (1% noise).
_LR_VAR_FLOOR = 1e-4
#: a switch needs the gain beyond this many standard errors (squared): 2.5,
#: as the test is repeated every step (at 2, false switches in close calls
#: cost more than the later true ones it let through sooner).
_Z2 = 2.5 * 2.5
#: a clear bucket's probe horizon doubles up to this many stale_steps (or
#: the explore_cost bound, when that is longer).
_HORIZON_CAP = 4
#: variance of one request's accept length assumed until it is measured
#: (about that of alpha 0.7 over 4 draft tokens).
_ACC_VAR_PRIOR = 1.0
#: a clear winner's horizon cap grows by _HORIZON_CAP x stale_steps for
#: every this much log gain it leads by (about 40%).
_WIDE_GAIN = 0.35
#: paired samples a bucket needs before they decide (before: the EMAs).
_LN_MIN = 8
#: probes of a bucket without a clear winner are this many times longer.
_LONG_PROBE = 4
#: SPEC outcomes folded into the slow acceptance estimate at once (probe
#: steps at once).
_ACC_CHUNK = 8
#: a probe starts in a bucket only if the home mode ran there within this
#: many steps, and a probe step is paired only with an EMA updated within
#: _PAIR_FRESH steps (more than a probe can last, started fresh): pairs
#: against a stale EMA all carry its error, which their spread does not show.
#: A batch that sits at a bucket's edge (say 31, sometimes 32) probes the rare
#: bucket without running home there; its pairs, all against a PLAIN EMA
#: 2,000 steps old, were 8% off and put a 3% loser 4% ahead, and the policy
#: flapped between the two buckets' decisions.
_PROBE_FRESH = 16
_PAIR_FRESH = 48
#: requests behind the slow acceptance estimate (at most).
_ACC_WINDOW = 8192.0
#: the slow acceptance follows the fast one when they differ by more than
#: this many standard errors (squared): a change, not noise.
_ACC_DRIFT_Z2 = 16.0


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


def _bucket_index(batch_size: int, mean_ctx: int) -> int:
    """The flat index of a (context, batch) bucket in the per-bucket arrays
    (``decide`` looks the two up instead, for speed)."""
    return context_bucket(mean_ctx) * _NB + batch_bucket(batch_size)


#: batch buckets of batch sizes up to 4095, and the index offsets
#: (context_bucket x N_BATCH_BUCKETS) of mean contexts up to 64k tokens in
#: units of 1024: ``decide`` (the hot path) looks them up
_BATCH_BUCKET = tuple(batch_bucket(b) for b in range(4096))
_CONTEXT_OFFSET = tuple(context_bucket(k << 10) * _NB for k in range(64))


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
        "_explored_free",
        "_credit",
        "_credit_cap",
        "_last_obs_mode",
        "_weak",
        "_starve",
        "_starve_limit",
        "_seen",
        "_lr",
        "_lv",
        "_ln",
        "_clear",
        "_am",
        "_aw",
        "_av",
        "_log_am",
        "_chunk_tok",
        "_chunk_n0",
        "_chunk_n",
        "_probe_tok",
        "_probe_req",
        "_last_b",
        "_cur_r",
        "_lz",
        "_acc_z2se2",
        "_resync_c",
        "_vpool",
        "_npool",
        "_probe_len",
        "_probe_free",
        "_vgen",
        "_vseen",
        "_warm",
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
        self._explored_free = 0  # of which probes of a leading mode (not charged)
        # start credit: two probes, so the cold start does not wait for budget.
        self._credit = 2.0 * self.probe_steps
        # unused budget does not pile up into long runs of probes later
        self._credit_cap = 4.0 * self.probe_steps
        self._last_obs_mode = self._home
        self._weak = [False] * n  # bucket's ts comes from a resync step only
        self._starve = 0
        self._starve_limit = 4 * self.probe_steps
        self._seen = [0] * n  # cold-path visits per bucket
        # paired evidence per bucket: log(ts / tp) from probe steps, each
        # probe interval against the mode being run's current EMA
        self._lr = [0.0] * n  # mean of the paired log ratios
        self._lv = [0.0] * n  # their variance (EMA, 1/n normalised)
        self._ln = [0] * n  # paired samples
        self._lz = [0.0] * n  # (z * standard error of _lr)^2
        self._acc_z2se2 = 0.0  # (z * standard error of log(acc_slow))^2
        # the resync spread over the stay a switch expects (stale_steps)
        self._resync_c = self._resync_rel / self.stale_steps
        self._clear = [False] * n  # last decision was beyond the noise
        # slow acceptance (requests-weighted, window _ACC_WINDOW requests; reset
        # to the fast EMA when the two differ by more than their noise)
        self._am = 0.0
        self._aw = 0.0
        self._av = 0.0  # per-request variance of the accept length
        self._log_am = 0.0
        # SPEC outcomes not yet in the slow acceptance estimate
        # (the chunk's requests are _n_acc - _chunk_n0)
        self._chunk_tok = 0
        self._chunk_n0 = 0
        self._chunk_n = 0
        # tokens and requests of recent probes' SPEC steps (see
        # _slow_acceptance)
        self._probe_tok = 0
        self._probe_req = 0
        self._last_b = 0
        self._cur_r = 0
        # pooled variance of paired samples over all buckets: the prior a
        # bucket's own variance is shrunk towards while it has few samples
        self._vpool = 0.0
        self._npool = 0
        self._probe_len = self.probe_steps
        self._probe_free = False  # the running probe is not charged to the budget
        # the paired test's verdict "stay" per bucket holds while its inputs
        # (acceptance, the bucket's pairs, the resync, the home mode) do not
        # change: a bucket whose _vseen equals _vgen skips the test
        self._vgen = 0
        self._vseen = [-1] * n
        self._warm = [False] * n  # the bucket has samples of both modes (_cold)
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

    def bucket_estimates(self, batch_size: int, mean_ctx: int = 0) -> tuple:
        """(tp, ts, acc, n_plain, n_spec) of a bucket, for tests and reports."""
        i = _bucket_index(batch_size, mean_ctx)
        return (self._tp[i], self._ts[i], self._acc, self._np[i], self._ns[i])

    def estimates(self) -> dict[str, float]:
        """The runtime's optional contract (status, ``eagle_gate_policy_estimate``):
        a small fixed set of floats. ``plain_tok_s`` / ``spec_tok_s`` are the
        last decided bucket's expected output tokens/s per mode, present only
        when that bucket has an estimate of the mode."""
        out = {
            "accept_length": self._acc,
            "resync_rel": self._resync_rel,
            "explored_share": self.explored_share,
            "leading_probe_share": (
                self._explored_free / self._decided if self._decided else 0.0
            ),
            "dwell_steps": float(self._dwell),
            "switches": float(self.switches),
            "spec_home": 1.0 if self._home is _SPEC else 0.0,
        }
        i = self._ring_idx[self._cur_r] & _IDX_MASK
        b = self._last_b
        if b > 0:
            out["batch_size"] = float(b)
            if self._np[i] and self._tp[i] > 0.0:
                out["plain_tok_s"] = b / self._tp[i]
            if self._ns[i] and self._n_acc and self._ts[i] > 0.0:
                out["spec_tok_s"] = b * self._acc / self._ts[i]
            if self._ln[i] >= 2:
                out["spec_log_gain"] = self._log_am - self._lr[i]
                out["paired_samples"] = float(self._ln[i])
        return out

    def predicted_plain_rate(self, view: StepView) -> float | None:
        """Expected output tokens/s of ONE PLAIN step for a batch like
        ``view``: its batch size over the PLAIN interval of its bucket (or of
        the next batch bucket either side, same context), None when none of
        them has a PLAIN estimate. O(1), no allocation beyond the float,
        never raises."""
        try:
            b = view.batch_size
            if b <= 0:
                return None
            total = view.seq_len_sum
            k = _bucket_index(b, total // b if total is not None else 0)
            bi = k % _NB
            np_ = self._np
            tp = self._tp
            if np_[k] and tp[k] > 0.0:
                return b / tp[k]
            if bi > 0 and np_[k - 1] and tp[k - 1] > 0.0:
                return b / tp[k - 1]
            if bi + 1 < _NB and np_[k + 1] and tp[k + 1] > 0.0:
                return b / tp[k + 1]
            return None
        except Exception:
            return None

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
        # bucket: context_bucket(mean context) * _NB + batch_bucket(b), looked
        # up for speed (sizes and lengths are never negative)
        # unknown lengths (StepView contract): the shortest context bucket
        total = view.seq_len_sum
        mc = total // b if total is not None and b > 0 else 0
        k = mc >> 10
        idx = _CONTEXT_OFFSET[k] if k < 64 else context_bucket(mc) * _NB
        idx += _BATCH_BUCKET[b] if b < 4096 else batch_bucket(b)
        r = step & _RING_MASK
        self._ring_step[r] = step
        self._ring_idx[r] = idx
        self._cur_r = r
        self._last_b = b

        if self._probe_left > 0:  # inside an exploration probe
            # at least probe_steps steps; longer (up to 4x) while none of its
            # steps has given a usable interval yet
            done = self._probe_done + 1
            if done < self._probe_len or (
                self._probe_got == 0 and done < self._probe_left
            ):
                self._probe_done = done
                if self._probe_free:
                    self._explored_free += 1
                else:
                    self._credit -= 1.0
                self._explored += 1
                self._ring_idx[r] = idx | _PROBE_BIT
                return self._probe_mode
            self._probe_left = 0

        home = self._home
        if not self._warm[idx] and self._cold(idx):
            # cold bucket: first the home mode gets its sample (for free), then
            # a probe measures the other one
            np_ = self._np[idx]
            ns = self._ns[idx]
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
            k = self._neighbor(idx)
            if k >= 0 and self._evidence(k, home):
                return self._switch(_PLAIN if home is _SPEC else _SPEC, step, idx)
            return home
        other_last = self._last_s[idx] if home is _PLAIN else self._last_p[idx]
        # a probe's steps are paired with the home mode's interval EMA in the
        # bucket, so that must be fresh (home ran here lately), or every pair
        # would share its old error; else home runs, and the probe comes later
        if (
            step - other_last > self._horizon[idx]
            and step - (self._last_p[idx] if home is _PLAIN else self._last_s[idx])
            <= _PROBE_FRESH
            and (self._credit >= self.probe_steps or self._leading(idx, home))
        ):
            if self._probe_due(idx, home, step - other_last):
                return self._start_probe(_SPEC if home is _PLAIN else _PLAIN, idx)
        if step - self._switch_step < self._dwell:
            return home
        gen = self._vgen
        if self._vseen[idx] == gen:  # the test's inputs unchanged: stay
            return home
        if self._ln[idx] < _LN_MIN:
            if self._evidence(idx, home):
                return self._switch(_PLAIN if home is _SPEC else _SPEC, step, idx)
            return home
        # the paired test of _evidence, inlined (the hot path; _stay_gain)
        g = self._log_am - self._lr[idx]
        if home is _PLAIN:
            g = -g  # the gain of staying
        z2se2 = self._lz[idx] + self._acc_z2se2
        c = self._resync_c
        d = -g - c
        if d > 0.0 and d * d > z2se2:
            self._clear[idx] = True
            return self._switch(_PLAIN if home is _SPEC else _SPEC, step, idx)
        d = g + c
        if d > 0.0 and d * d > z2se2:
            self._clear[idx] = True
        elif self._clear[idx]:  # no longer clear: probe again when affordable
            self._clear[idx] = False
            self._horizon[idx] = 0
        self._vseen[idx] = gen
        return home

    def _cold(self, idx: int) -> bool:
        """Whether bucket ``idx`` still lacks a sample of either mode (or
        acceptance has none); once it has all three it stays warm (sample
        counts only grow), and ``decide`` checks only the flag."""
        if self._np[idx] and self._ns[idx] and self._n_acc:
            self._warm[idx] = True
            return False
        return True

    def _evidence(self, k: int, home: Mode) -> bool:
        """Whether bucket ``k`` says: leave ``home``. With paired samples, the
        log gain of SPEC over PLAIN in tokens/s (paired step-time ratios and
        the slow acceptance) must exceed the resync spread over the stay a
        switch expects (``stale_steps``) by 2.5 standard errors, the same test
        in both directions; before ``_LN_MIN`` paired samples, the two
        interval EMAs must differ by ``switch_overhead`` and by 2.5 standard
        errors of the pooled noise. Sets the bucket's ``clear`` flag (either
        mode ahead beyond the noise). ``decide`` inlines the paired test."""
        ln = self._ln[k]
        if ln < _LN_MIN or self._aw <= 0.0:
            acc = self._acc
            gain = acc * self._tp[k] / self._ts[k] - 1.0
            if home is _PLAIN:
                gain = -gain
            m = self.switch_overhead
            self._vseen[k] = -1  # (decide's kept verdict is the paired test's)
            if -m <= gain <= m:  # within the margin either way: no switch,
                self._clear[k] = False  # not clear, whatever the noise
                return False
            # the noise of one interval (pooled) over the EMAs' samples
            se2 = self._ema_noise(k)
            if self._aw <= 0.0:
                # no acceptance estimate beyond a few SPEC steps yet: its
                # spread (a prior per request) counts too, so that a few
                # batch-1 steps do not decide against speculation
                se2 += self._acc_prior_noise(acc)
                lg = _log(gain + 1.0 if home is _SPEC else 1.0 - gain)
                beyond = lg * lg > _Z2 * se2
            else:
                beyond = self._npool < 2 or gain * gain > _Z2 * se2
            self._clear[k] = gain > m and beyond
            return gain < -m and beyond
        g = self._stay_gain(k, home, self._log_am)
        # (z * standard error)^2: the paired ratios' part is kept up to date
        # by _pair, the acceptance's by observe
        z2se2 = self._lz[k] + self._acc_z2se2
        c = self._resync_c
        # leave: the other mode ahead by more than the resync, beyond the noise
        d = -g - c
        if d > 0.0 and d * d > z2se2:
            self._clear[k] = True
            return True
        d = g + c
        if d > 0.0 and d * d > z2se2:
            self._clear[k] = True
        elif self._clear[k]:  # no longer clear: probe again when affordable
            self._clear[k] = False
            self._horizon[k] = 0
        return False

    def _stay_gain(self, k: int, home: Mode, log_acc: float) -> float:
        """Log gain in tokens/s of staying in ``home`` over the other mode in
        bucket ``k``, from its paired step-time ratios and acceptance
        ``exp(log_acc)`` (``decide`` inlines it for ``_log_am``)."""
        g = log_acc - self._lr[k]  # SPEC's gain over PLAIN
        return -g if home is _PLAIN else g

    def _leading(self, k: int, home: Mode) -> bool:
        """Whether bucket ``k``'s paired evidence puts the mode not being
        run ahead (by more than the resync spread over a stay), but not yet
        beyond the noise (else the policy would have switched). Probing
        that mode is then expected to gain, not to cost: such probes run as
        often as the ``explore_cost`` bound allows, beyond the exploration
        budget, so a close call is resolved in hundreds of steps rather than
        the thousands the budget would take."""
        if self._ln[k] < _LN_MIN:
            return self._leading_ema(k, home)
        lz = self._lz[k]
        az = self._acc_z2se2
        if home is _SPEC and lz < az:
            # (PLAIN probes tell nothing of acceptance: from SPEC they help
            # only while the step-time ratio is the larger uncertainty)
            return False
        d = -self._stay_gain(k, home, self._log_am) - self._resync_c  # its lead
        return d > 0.0 and d * d <= lz + az

    def _leading_ema(self, k: int, home: Mode) -> bool:
        """``_leading`` before a bucket has paired samples: its interval EMAs
        put the other mode ahead, by no more than ``switch_overhead`` (the
        margin a switch needs then). Its probes are the paired samples that
        decide, so they come sooner too."""
        if not (self._np[k] and self._ns[k]) or self._aw <= 0.0:
            return False
        tp = self._tp[k]
        ts = self._ts[k]
        acc = self._acc
        if tp <= 0.0 or ts <= 0.0 or acc <= 0.0:
            return False
        if home is _SPEC and _Z2 * self._ema_noise(k) < self._acc_z2se2:
            return False  # (see _leading)
        gain = acc * tp / ts - 1.0
        if home is _PLAIN:
            gain = -gain  # the gain of staying
        return 0.0 < -gain <= self.switch_overhead

    def _stands(self, k: int, acc: float) -> bool:
        """Whether bucket ``k``'s decision would stay clear (beyond 2.5
        standard errors, paired evidence) with acceptance ``acc``: recent
        probes' acceptance that moved, but not by enough to change the
        decision, is no reason to re-probe a clear winner sooner."""
        if self._ln[k] < _LN_MIN or acc <= 0.0:
            return False
        d = self._stay_gain(k, self._home, _log(acc)) + self._resync_c
        return d > 0.0 and d * d > self._lz[k] + self._acc_z2se2

    def _ema_noise(self, k: int) -> float:
        """Variance (log units) of bucket ``k``'s interval-EMA ratio: the
        pooled noise of one paired sample over each EMA's samples (up to 19,
        the EMA's memory). Zero before two paired samples were pooled."""
        np_ = self._np[k]
        ns = self._ns[k]
        return self._vpool * (
            1.0 / (np_ if np_ < 19 else 19) + 1.0 / (ns if ns < 19 else 19)
        )

    def _acc_prior_noise(self, acc: float) -> float:
        """Variance (log units) of the fast acceptance ``acc`` before the slow
        estimate has one: the prior spread of one request's accept length over
        the requests seen."""
        n_acc = self._n_acc
        return _ACC_VAR_PRIOR / ((n_acc if n_acc > 1 else 1) * acc * acc)

    def _neighbor(self, idx: int) -> int:
        """The nearest batch bucket (same context) measured in both modes, or
        -1; a bounded scan, only while a bucket is cold."""
        if self._n_acc == 0:
            return -1
        row = idx - idx % _NB
        bi = idx - row
        np_ = self._np
        ns = self._ns
        for d in range(1, _NB):
            k = row + bi - d
            if bi - d >= 0 and np_[k] and ns[k]:
                return k
            k = row + bi + d
            if bi + d < _NB and np_[k] and ns[k]:
                return k
        return -1

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
        if self._ln[idx] >= _LN_MIN and not self._clear[idx]:
            n = _LONG_PROBE * n
        if self._credit < n and not self._leading(idx, home):
            return False
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
        if self._clear[idx]:  # decided beyond the noise: re-check later,
            # up to _HORIZON_CAP x stale_steps (a change must show up), and
            # that again for every _WIDE_GAIN the winner leads by beyond 2
            # standard errors: a mode twice as fast does not lose its lead
            # between two re-checks as easily, and each re-check costs more
            cap = _HORIZON_CAP * self.stale_steps
            if self._ln[idx] >= _LN_MIN:
                g = self._log_am - self._lr[idx]
                se2 = (self._lz[idx] + self._acc_z2se2) / _Z2
            elif acc > 0.0 and tp > 0.0 and ts > 0.0:
                g = _log(acc * tp / ts)
                se2 = self._ema_noise(idx) + (
                    self._acc_z2se2 / _Z2
                    if self._aw > 0.0
                    else self._acc_prior_noise(acc)
                )
            else:
                g = se2 = 0.0
            g = (g if g > 0.0 else -g) - 2.0 * math.sqrt(se2)
            if g > 0.0:
                cap *= 1 + int(g / _WIDE_GAIN)
            if h < cap:
                h = h + h if h + h < cap else cap
        else:  # not yet: probe again as soon as cost and budget allow
            h = 0
        self._horizon[idx] = h
        return True

    def _cold_probe_due(self, idx: int, home: Mode) -> bool:
        """A cold bucket's first probe, unless the nearest measured bucket
        says it would lose more than ``explore_cost`` of the steps this bucket
        has run so far (then it waits, like a stale probe). A bucket of a
        batch more than two half-octaves larger predicts nothing."""
        seen = self._seen[idx] + 1
        self._seen[idx] = seen
        k = self._neighbor(idx)
        if k < 0 or k - idx > 2:
            # nothing measured, or only much larger batches, whose probes
            # cost more (verify grows with the batch): no prediction
            return True
        g = self._acc * self._tp[k] / self._ts[k] - 1.0
        if g < -0.99:
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
        self._probe_mode = mode
        # a bucket with evidence but no clear winner gets long probes: more
        # paired samples per resync
        n = self.probe_steps
        if self._ln[idx] >= _LN_MIN and not self._clear[idx]:
            n = _LONG_PROBE * n
        # a probe the budget cannot pay is one of a mode the evidence puts
        # ahead (see _leading): it is expected to gain, not charged
        free = self._credit < n
        self._probe_free = free
        if free:
            self._explored_free += 1
        else:
            self._credit -= 1.0
        self._probe_len = n
        self._probe_left = n + 3 * self.probe_steps  # the longest a probe may run
        self._probe_done = 0
        self._probe_got = 0
        self._explored += 1
        self._ring_idx[self._cur_r] |= _PROBE_BIT
        return mode

    def _switch(self, mode: Mode, step: int, idx: int) -> Mode:
        self._home = mode
        self._switch_step = step
        self._vgen += 1
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
            probe = idx >= _PROBE_BIT
            if probe:
                idx &= _IDX_MASK
        else:  # unknown step (should not happen): batch bucket, context 0
            idx = batch_bucket(b)
            probe = False
        alpha = self.ema_alpha
        dt = outcome.interval_s
        if mode is _SPEC or mode == 0:
            # weight by the requests behind the sample: a step of a small batch
            # says less about acceptance than one of a large batch
            n = self._n_acc + b
            self._n_acc = n
            if b >= 8 and n * alpha >= b:  # the usual case, first
                a = alpha
            else:
                a = b / n if n * alpha < b else alpha * b * 0.125
            tokens = outcome.tokens
            acc = self._acc
            acc += a * (tokens / b - acc)
            self._acc = acc
            # the slow estimate, in chunks of a few SPEC steps (cheaper)
            t = self._chunk_tok + tokens
            m = self._chunk_n + 1
            if m < _ACC_CHUNK and not probe:
                self._chunk_tok = t
                self._chunk_n = m
            else:
                self._chunk_tok = self._chunk_n = 0
                q = n - self._chunk_n0
                self._chunk_n0 = n
                self._slow_acceptance(t, q, acc, a, b, idx, probe)
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
            if probe and self._np[idx] and step - self._last_p[idx] <= _PAIR_FRESH:
                self._pair(idx, math.log(dt / self._tp[idx]))
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
            if (
                probe
                and self._ns[idx]
                and not self._weak[idx]
                and step - self._last_s[idx] <= _PAIR_FRESH
            ):
                self._pair(idx, math.log(self._ts[idx] / dt))

    def _slow_acceptance(
        self, tokens: int, req: int, acc: float, a: float, b: int, idx: int, probe: bool
    ) -> None:
        """Fold ``tokens`` over ``req`` requests into the slow acceptance
        estimate (a window of requests, with its per-request variance); jump
        to the fast EMA ``acc`` (weight ``a`` at batch ``b``) when the two
        differ beyond their noise."""
        w = self._aw + req
        if w > _ACC_WINDOW:
            w = _ACC_WINDOW
        f = req / w
        am = self._am
        d = tokens / req - am
        am += f * d
        av = (1.0 - f) * (self._av + f * req * d * d)
        d = acc - am
        v = av * (a / ((2.0 - a) * b) + 1.0 / w)
        if d * d > _ACC_DRIFT_Z2 * v:
            # the fast EMA moved beyond the noise: acceptance changed
            am = acc
            w = b * (2.0 - a) / a
        elif probe:
            # the mean of recent probes' SPEC steps against the slow
            # estimate: from PLAIN, probes are all the policy sees of
            # acceptance, too few steps to move the fast EMA (1/80 per step at
            # batch 1); they add up while they disagree with the estimate
            pt = self._probe_tok + tokens
            pq = self._probe_req + req
            self._probe_tok = pt
            self._probe_req = pq
            d = pt / pq - am
            v = av * (1.0 / pq + 1.0 / w)
            if d * d > _ACC_DRIFT_Z2 * v:  # changed: restart from the probes
                am = pt / pq
                w = float(pq)
                self._probe_tok = self._probe_req = 0
            elif d * d > 4.0 * v:
                # it may be changing: unless the bucket's decision would stand
                # with the probes' acceptance, the bucket is not clear any
                # more, so it is probed again (longer) as soon as the cost
                # bound allows, and the next probes' steps add to these
                if self._clear[idx] and not self._stands(idx, pt / pq):
                    self._clear[idx] = False
                    self._horizon[idx] = 0
            elif d * d < v:  # in line with the estimate: start afresh
                self._probe_tok = self._probe_req = 0
        self._am = am
        self._aw = w
        self._av = av
        if am > 0.0:  # (always, once a SPEC step was folded)
            self._log_am = _log(am)
            self._acc_z2se2 = _Z2 * av / (w * am * am)
            # a new generation: the paired test's acceptance moved, and a
            # bucket's clear flag may have been reset above
            self._vgen += 1

    def _pair(self, idx: int, x: float) -> None:
        """One paired sample of log(ts / tp) in a bucket: a probe's interval
        against the current EMA of the mode being run."""
        n = self._ln[idx] + 1
        self._ln[idx] = n
        a = 1.0 / n
        if a < _LR_ALPHA_MIN:
            a = _LR_ALPHA_MIN
        m = self._lr[idx]
        d = x - m
        self._lr[idx] = m + a * d
        self._vseen[idx] = -1
        self._lv[idx] = (1.0 - a) * (self._lv[idx] + a * d * d)
        if n > 1:  # the pooled variance of a sample around its bucket's mean
            k = self._npool + 1
            self._npool = k
            a = 1.0 / k if k < 256 else 1.0 / 256
            vp = self._vpool + a * (d * d * (n - 1) / n - self._vpool)
            self._vpool = vp
            # the bucket's variance, shrunk towards the pooled one (4
            # samples' worth), as (z * standard error of the mean)^2
            v = (n * self._lv[idx] + 4.0 * vp) / (n + 4)
            if v < _LR_VAR_FLOOR:
                v = _LR_VAR_FLOOR
            self._lz[idx] = _Z2 * v / (n - 1 if n <= _LR_NEFF_MAX else _LR_NEFF_MAX)

    def _note_resync(self, first_dt: float, ts: float) -> None:
        rel = (first_dt - ts) / ts
        if rel < 0.0:
            rel = 0.0
        n = self._n_resync + 1
        self._n_resync = n
        alpha = self.ema_alpha
        a = 1.0 / n if n * alpha < 1.0 else alpha
        self._resync_rel += a * (rel - self._resync_rel)
        self._resync_c = self._resync_rel / self.stale_steps
        self._dwell = self._compute_dwell()
        self._vgen += 1


GOODPUT_SETTINGS = {
    "max_explore_share": Setting(
        float,
        0.03,
        "largest share of decode steps spent probing the mode not chosen (a "
        "bucket with a clear winner probes far less: see explore_cost); probes "
        "of a mode the evidence already puts ahead are not counted",
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
        "dwell from the measured resync cost, and the margin a switch needs "
        "(either way) until a bucket has 8 paired samples",
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
