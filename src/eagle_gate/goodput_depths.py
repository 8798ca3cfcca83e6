"""``goodput-depths``: :class:`~eagle_gate.goodput.Goodput` that also chooses
the SPEC depth per batch (issue #33, a first version; docs/goodput.md).

On a server with one SPEC depth (``view.depths == (configured,)``, every
server today) it *is* ``goodput``: ``decide`` and ``observe`` go straight to
it, so it decides exactly as ``goodput`` does.

With several depths, ``goodput``'s rule still chooses between PLAIN and SPEC,
where SPEC means the *home depth*; this layer chooses the home depth:

* acceptance per position: from ``StepOutcome.accepted_at_least``, per
  position ``j`` the share of the requests that reached ``j - 1`` accepted
  drafts and accepted the ``j``-th (forgetting by the position's own
  samples); a depth's expected tokens per request are
  ``1 + q1 + q1 q2 + ...``, positions never seen extrapolated with the last
  one seen, every position scaled by one factor so that the home depth's
  matches ``goodput``'s own acceptance (which follows changes quickly). On
  a detected change, positions beyond the home depth are forgotten;
* step time: one line in the batch size per depth, as ``goodput`` keeps one
  per mode (far from the batches a depth ran at: the home depth's time
  times the two depths' ratio where it did run);
* every ``_CHECK_EVERY`` steps the timed depth with the highest expected
  tokens per second becomes the home depth where it beats the home depth by
  ``_DEPTH_MARGIN`` (from PLAIN only where that turns the decision); its
  acceptance restarts from the prediction;
* depth probes (``probe_steps``, one more from PLAIN for the resync, whose
  step goes untimed): each depth once, nearest the home depth first
  (shallower first from PLAIN), then a neighbour of the home depth not run
  for ``stale_steps``; paid from ``goodput``'s budget, and only while it is
  at least ``_DEPTH_CREDIT`` full (``goodput``'s own probes come first).
  Every other probe of SPEC that ``goodput`` takes from PLAIN runs the next
  shallower depth where that one's time is not known at this batch.

Where outcomes carry no per-position counts the layer stays at the
configured depth.
"""

from __future__ import annotations

from eagle_gate.goodput import Goodput
from eagle_gate.goodput_accept import PREDICTED_REQUESTS
from eagle_gate.goodput_estimates import Level, StepTime
from eagle_gate.goodput_settings import GOODPUT_SETTINGS
from eagle_gate.hookspecs import hookimpl
from eagle_gate.policy import Mode, PolicyFactory, StepOutcome, StepView

__all__ = ["GoodputDepths"]

_SPEC = Mode.SPEC
#: the depth choice is looked at every this many steps.
_CHECK_EVERY = 4
#: another depth must beat the home depth's tokens/s by this share.
_DEPTH_MARGIN = 0.05
#: weight of one request in a position's acceptance (forgetting).
_POS_FORGET = 1.0 / 2048.0
#: depth probes only while the probe budget is at least this share full.
_DEPTH_CREDIT = 0.6
#: requests behind a position before its acceptance is used.
_POS_MIN = 8.0


class GoodputDepths(Goodput):
    """``goodput`` over PLAIN and every SPEC depth (see the module doc)."""

    name = "goodput-depths"

    __slots__ = (
        "_depth", "_depths", "_d_times", "_d_acc", "_d_last", "_pos_n",
        "_pos_m", "_dprobe_left", "_dprobe_depth", "_next_depth",
        "_alt", "_bprobe_depth",
    )  # fmt: skip

    def __init__(self, **settings: object) -> None:
        super().__init__(**settings)  # type: ignore[arg-type]
        self._depths: tuple[int, ...] = ()
        self._depth = 0  # the home depth (0: not set up)
        self._d_times: dict[int, StepTime] = {}
        self._d_acc: dict[int, Level] = {}
        self._d_last: dict[int, int] = {}
        self._pos_n: list[float] = []  # per position: accepted (decayed)
        self._pos_m: list[float] = []  # per position: reached (decayed)
        self._dprobe_left = 0
        self._dprobe_depth = 0
        self._next_depth = 0
        self._alt = False
        self._bprobe_depth = 0

    def _setup(self, view: StepView) -> None:
        depths = view.depths
        self._depths = depths
        d = view.configured_depth
        self._depth = d
        self._d_times = {s: StepTime() for s in depths}
        self._d_acc = {s: Level() for s in depths}
        self._d_times[d] = self._times[0]
        self._d_acc[d] = self._acc
        self._d_last = {s: -(1 << 62) for s in depths}
        self._pos_n = [0.0] * (depths[-1] + 1)
        self._pos_m = [0.0] * (depths[-1] + 1)

    # -- deciding -------------------------------------------------------------

    def decide(self, view: StepView) -> Mode:
        if len(view.depths) == 1:
            return Goodput.decide(self, view)
        if not self._depth:
            self._setup(view)
        if self._dprobe_left:
            self._dprobe_left -= 1
            view.depth = self._dprobe_depth
            return _SPEC
        probing = self._probe_left
        mode = Goodput.decide(self, view)
        if mode is _SPEC and self.home is not _SPEC:
            # goodput probes SPEC from PLAIN: every other such probe runs a
            # neighbour of the home depth not known at this batch
            if not probing:
                self._bprobe_depth = self._probe_depth(view.batch_size)
            view.depth = self._bprobe_depth
            return mode
        step = view.step
        if (
            not probing
            and not self._probe_left
            and self._accept > 0.0
            and step >= self._next_depth
        ):
            self._next_depth = step + _CHECK_EVERY
            probe = self._choose(view.batch_size, step, mode)
            if probe:
                mode = self._depth_probe(probe)
                view.depth = probe
                return mode
        if mode is _SPEC:
            view.depth = self._depth
        return mode

    def _expected(self, r: float = 1.0) -> list[float]:
        """Expected tokens per request at each depth 0..deepest from the
        per-position acceptance, each position's scaled by ``r`` (at most
        1); empty where nothing is known."""
        n, m = self._pos_n, self._pos_m
        out = [1.0] * len(n)
        q = 0.0
        tot = 1.0
        reach = 1.0
        for j in range(1, len(n)):
            if m[j] >= _POS_MIN:
                q = n[j] / m[j] * r
                if q > 1.0:
                    q = 1.0
            elif j == 1:
                return []
            reach *= q
            tot += reach
            out[j] = tot
        return out

    def _fitted(self) -> list[float]:
        """:meth:`_expected` with the per-position acceptance scaled so the
        home depth's expected tokens match goodput's acceptance (which
        follows changes; the positions' counts follow them slowly)."""
        home = self._depth
        target = self._accept
        lo, hi = 0.0, 4.0
        exp = self._expected()
        if not exp:
            return exp
        for _ in range(16):
            mid = 0.5 * (lo + hi)
            if self._expected(mid)[home] < target:
                lo = mid
            else:
                hi = mid
        return self._expected(0.5 * (lo + hi))

    def _choose(self, b: int, step: int, mode: Mode) -> int:
        """Move the home depth to the best measured one; return a depth to
        probe (0: none)."""
        exp = self._fitted()
        home = self._depth
        if not exp:
            return 0
        fit_h = self._d_times[home]
        if fit_h.w == 0.0:
            return 0
        t_h = fit_h.predict(b)
        best_rate = self._accept / t_h
        best = home
        times = self._d_times
        for d in self._depths:
            fit = times[d]
            if d == home or fit.w == 0.0:
                continue
            t = fit.predict(b)
            if not -fit.reach <= b - fit.mb <= fit.reach:
                mb = round(fit.mb)
                t = t_h * fit.predict(mb) / fit_h.predict(mb)
            rate = exp[d] / t
            if rate > best_rate * (1.0 + _DEPTH_MARGIN):
                best_rate, best = rate, d
        if best != home:
            # from PLAIN only where the move turns the decision (the depths'
            # estimates lean on PLAIN-side predictions there: a shallow depth
            # chosen at low acceptance sees a rise too dimly to leave it)
            fit_p = self._times[1]
            if self.home is _SPEC or (
                fit_p.w
                and best_rate * fit_p.predict(b) > 1.0
                and self._accept * fit_p.predict(b) < t_h
            ):
                self._set_depth(best, exp[best])
            return 0
        if (
            mode is not self.home
            or self._times[1].w == 0.0
            or self._acc.n < 2.0 * PREDICTED_REQUESTS
        ):
            return 0  # (goodput probes, or it has not settled)
        # a depth never timed first (nearest the home depth), else a
        # neighbour of the home depth not timed for stale_steps
        depths = self._depths
        i = depths.index(home)
        # (from PLAIN the shallower first: cheaper, and nearer to PLAIN)
        shallow = mode is not _SPEC
        order = sorted(depths, key=lambda d: (abs(d - home), shallow and d > home))
        cand = 0
        for d in order:
            if times[d].w == 0.0:
                cand = d
                break
        first = cand != 0
        if not cand:
            for d in depths[max(0, i - 1) : i + 2]:
                if d != home and step - self._d_last[d] >= self.stale_steps:
                    cand = d
                    break
        if not cand:
            return 0
        n = self.probe_steps
        t = t_h * max(1.0, (cand + 1.0) / (home + 1.0))
        if mode is not _SPEC:  # from PLAIN: one more for the resync
            n += 1
            t = self._d_times[home].predict(b) * max(1.0, (cand + 1.0) / (home + 1.0))
        long_cost = 4 * n * t
        # only from a budget goodput leaves mostly unspent (its own probes
        # come first: depth looks that drained it at the start left it in
        # PLAIN on an early low acceptance)
        if self._credit < _DEPTH_CREDIT * self._credit_cap:
            return 0
        reserve = (0.0 if first else 1.0) * n * t
        if not self._afford(n * t, reserve, long_cost):
            return 0
        return cand

    def _probe_depth(self, b: int) -> int:
        """The depth of a probe of SPEC from PLAIN (see decide): every other
        one, the next shallower depth where it is not known at this batch
        (SPEC lost at the home depth; a shallower one may win)."""
        home = self._depth
        self._alt = not self._alt
        i = self._depths.index(home)
        if not self._alt or not i or self._pos_m[1] < _POS_MIN:
            return home  # (no per-position counts: the configured depth)
        d = self._depths[i - 1]
        fit = self._d_times[d]
        if fit.w == 0.0 or not -fit.reach <= b - fit.mb <= fit.reach:
            return d
        return home

    def _depth_probe(self, depth: int) -> Mode:
        n = self.probe_steps + (self.home is not _SPEC)
        self._dprobe_depth = depth
        self._dprobe_left = n - 1
        self._probed += n
        self._d_last[depth] = self._decided
        return _SPEC

    def _set_depth(self, d: int, accept: float) -> None:
        """Make ``d`` the home depth: goodput's SPEC line and acceptance are
        now that depth's."""
        self._depth = d
        self._times = (self._d_times[d], self._times[1])
        acc = self._d_acc[d]
        # its own samples are probes' (few, maybe old): it restarts from the
        # prediction, as goodput's acceptance does from a PLAIN-side one
        acc.restart(accept, PREDICTED_REQUESTS)
        self._acc = acc
        self._accept = accept
        self._s = d
        self.switches += 1

    # -- learning -------------------------------------------------------------

    def depth_rates(self) -> dict[int, float]:
        """Expected output tokens/s per timed depth at the home depth's mean
        batch, as :meth:`_choose` compares them (empty before any is known)."""
        exp = self._fitted() if self._depth else []
        home = self._d_times.get(self._depth)
        if not exp or home is None or home.w == 0.0:
            return {}
        b = max(1, round(home.mb))
        return {
            d: exp[d] / fit.predict(b)
            for d, fit in self._d_times.items()
            if fit.w > 0.0 and fit.predict(b) > 0.0
        }

    def estimates(self) -> dict[str, float]:
        """``goodput``'s, and with several depths the home depth and each
        timed depth's expected tokens/s (read by the ops thread, off the hot
        path)."""
        out = Goodput.estimates(self)
        if self._depth:
            out["home_depth"] = float(self._depth)
            for d, rate in self.depth_rates().items():
                out[f"depth_{d}_tokens_per_s"] = float(rate)
        return out

    def observe(self, outcome: StepOutcome) -> None:
        if not self._depth or outcome.batch_size <= 0:
            Goodput.observe(self, outcome)
            return
        at_least = outcome.accepted_at_least
        if at_least is not None:
            self._count_positions(outcome.batch_size, at_least)
        d = outcome.depth
        if outcome.mode is not _SPEC or d is None or d == self._depth:
            Goodput.observe(self, outcome)
            return
        if d not in self._d_times:
            return  # (a depth this layer did not ask for)
        b = outcome.batch_size
        resync = self._prev_mode is not _SPEC
        self._prev_mode = _SPEC
        self._d_acc[d].add(outcome.tokens / b, b)
        self._d_last[d] = outcome.step
        dt = outcome.interval_s
        if dt is not None and dt > 0.0 and not resync:
            self._d_times[d].add(b, dt)
            credit = self._credit + self.max_explore_share * dt
            cap = self._credit_cap
            self._credit = credit if credit < cap else cap

    def _changed(self, step: int) -> None:
        """An acceptance change: positions beyond the home depth (seen only
        by probes) are forgotten, the others keep a few requests' weight."""
        Goodput._changed(self, step)
        if not self._depth:
            return
        n, m = self._pos_n, self._pos_m
        home = self._depth
        for j in range(1, len(n)):
            if j > home:
                n[j] = m[j] = 0.0
            elif m[j] > 4.0 * _POS_MIN:
                f = 4.0 * _POS_MIN / m[j]
                n[j] *= f
                m[j] *= f

    def _count_positions(self, b: int, at_least: tuple[int, ...]) -> None:
        n, m = self._pos_n, self._pos_m
        reached = b
        for j, got in enumerate(at_least, 1):
            if j >= len(n) or reached <= 0:
                break
            f = 1.0 - _POS_FORGET * reached
            if f < 0.5:
                f = 0.5
            n[j] = n[j] * f + got
            m[j] = m[j] * f + reached
            reached = got


@hookimpl
def eagle_gate_policies() -> list[PolicyFactory]:
    return [
        PolicyFactory(
            name="goodput-depths",
            create=GoodputDepths,
            description=(
                "goodput over PLAIN and every SPEC depth the server can run "
                "(--gate-depths, SGLang 0.5.23); goodput itself elsewhere"
            ),
            settings=GOODPUT_SETTINGS,
        )
    ]
