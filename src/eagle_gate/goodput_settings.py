"""The ``goodput`` policy's settings, as it declares them to the plugin
registry (validated at launch, before a model loads; docs/goodput.md#settings
says what each does). Kept apart from :mod:`eagle_gate.goodput`, which
decides with them."""

from __future__ import annotations

from eagle_gate.settings import Setting

__all__ = ["GOODPUT_SETTINGS"]

_S = Setting
# fmt: off
GOODPUT_SETTINGS = {
    "max_explore_share": _S(float, 0.03, "largest share of the decode time spent "
                            "probing the mode not chosen (a change detected "
                            "while PLAIN runs refills it)", 0.0, 0.5),
    "explore_cost": _S(float, 0.01, "re-probe a clear decision only when the "
                       "probe's expected loss is at most this share of the time "
                       "since the other mode was measured", 0.0001, 0.5),
    "stale_steps": _S(int, 256, "steps after which the other mode's estimate is "
                      "stale; a switch must gain its resync back over this many "
                      "steps", 1),
    "switch_overhead": _S(float, 0.05, "largest share of the time spent on draft "
                          "resyncs: SPEC is entered at most once per measured "
                          "resync over this", 0.001, 1.0),
    "switch_cost": _S(float, 0.0, "a switch costs at least this many SPEC steps "
                      "(the draft's resync; the measured one when larger). Beyond "
                      "the probe budget (from about 10) the policy never probes "
                      "and stays in its mode", 0.0, 1e9),
    "probe_steps": _S(int, 3, "steps in one probe (4x while uncertain)", 2, 64),
    "initial_mode": _S(str, "spec", "mode before anything was measured",
                       choices=("spec", "plain")),
    "ema_alpha": _S(float, None, "deprecated, ignored (warns): step times are "
                    "fitted over the last ~256 samples per mode, acceptance "
                    "follows changes by itself", 0.001, 1.0),
}
# fmt: on
