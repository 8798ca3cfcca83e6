"""What the ``goodput`` policy reports of itself: its estimates (status,
metrics, the decision log's replay) and the PLAIN rate shadow mode compares
against. A mix-in of :class:`eagle_gate.goodput.Goodput`, kept apart from the
decision flow; it reads the policy's state and changes nothing."""

from __future__ import annotations

from typing import Any

from eagle_gate.policy import Mode, StepView

__all__ = ["GoodputReport"]

_SPEC = Mode.SPEC


class GoodputReport:
    """Reporting for :class:`eagle_gate.goodput.Goodput` (its state is
    declared there)."""

    __slots__ = ()
    _probed: int
    _decided: int
    _times: Any
    _accept: float
    _acc: Any
    _p1: Any
    _resync_rel: float
    _switch_rel: float
    _dwell: int
    switches: int
    home: Mode

    @property
    def explored_share(self) -> float:
        """Share of the decided steps that were probes."""
        return self._probed / self._decided if self._decided else 0.0

    def estimates(self) -> dict[str, float]:
        """What the policy believes (the runtime's optional contract)."""
        sp, pl = self._times
        out = {
            "accept_length": float(self._accept),
            "accept_length_spec": float(self._acc.slow),
            "first_accept_plain_now": float(self._p1.slow),
            "acceptance_restarts": float(self._acc.restarts + self._p1.restarts),
            "resync_rel": float(self._resync_rel),
            "switch_rel": float(self._switch_rel),
            "dwell_steps": float(self._dwell),
            "explored_share": float(self.explored_share),
            "switches": float(self.switches),
            "spec_home": float(self.home is _SPEC),
        }
        for name, fit in (("spec", sp), ("plain", pl)):
            if fit.w > 0.0:
                out[f"{name}_step_s_at_mean_batch"] = float(fit.predict(round(fit.mb)))
                out[f"{name}_mean_batch"] = float(fit.mb)
        return out

    def predicted_plain_rate(self, view: StepView) -> float | None:
        """Output tokens/s of one PLAIN step for a batch like ``view`` (for
        shadow mode); None while PLAIN was never timed. Never raises."""
        try:
            fit = self._times[1]
            b = view.batch_size
            if fit.w == 0.0 or b <= 0:
                return None
            return b / fit.predict(b)
        except Exception:
            return None
