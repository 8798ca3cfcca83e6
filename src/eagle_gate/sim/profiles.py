"""Cost profiles: how long decode steps take, and how well drafts are accepted.

A :class:`Profile` models one server. All times are in seconds. With ``b``
requests in a decode batch, ``kv`` the summed sequence lengths of the batch and
``s`` draft steps (``k = s + 1`` tokens verified per request):

* PLAIN step: ``plain_fixed + plain_per_req*b + plain_per_req2*b**2 + per_kv*kv``
* SPEC step: ``verify + s*draft + extend`` with
  ``verify = verify_fixed + verify_per_tok*b*k + verify_per_tok2*(b*k)**2
  + per_kv*kv``, ``draft = draft_fixed + draft_per_req*b`` and
  ``extend = extend_fixed + extend_per_tok*b*k``; the verify part costs at
  least a PLAIN step. Any depth ``s`` (``Profile.spec_depths()``, chosen per
  step through ``StepView.depth``) uses the same terms.
  ``s = 0`` is SGLang 0.5.23's "off" step: a 1-token verify plus the extend
  (the ``sglang-ema`` baseline only; the gate's depth 0 is PLAIN).
* measured tables (``spec_table``) give the SPEC step at the configured
  depth; another depth costs ``plain + (table - plain) * (F(s) - Fp) /
  (F(s0) - Fp)``: the measured excess over a PLAIN step scaled like the
  formula's excess (``F``, ``Fp``: the formula's SPEC and PLAIN steps).
* draft resync: the first SPEC step after ``m`` PLAIN steps additionally costs
  ``resync_fixed + catchup_per_tok*b*min(m, catchup_cap)`` (the draft model
  catches up over the tokens it missed).
* prefill batch: ``prefill_fixed + prefill_per_tok*prompt_tokens``.
* every step duration is multiplied by a noise factor ``exp(N(0, noise))``.
* closed loop: a client sends its next request ``client_gap_s`` after its
  previous one completed (HTTP, detokenization, client-side work).

Acceptance: every request belongs to a class with a per-token acceptance
``alpha``; with ``s`` chained draft tokens a request accepts ``j`` drafts with
probability ``alpha**j * (1-alpha)`` (``j < s``) or ``alpha**s`` (``j = s``),
and emits ``j + 1`` tokens (bonus included).

User profile file (``--profile-file FILE``), JSON or TOML with the same keys
as :class:`Profile` (missing keys take the defaults shown there)::

    name = "my-server"
    description = "..."
    num_draft_tokens = 4          # k of the default SPEC step
    plain_fixed = 0.010
    plain_per_req = 0.0002
    verify_fixed = 0.012
    verify_per_tok = 0.0001
    draft_fixed = 0.001
    resync_fixed = 0.002
    prompt_len = [500, 2500]      # uniform, tokens
    output_len = [200, 600]
    max_running = 256
    [classes]                     # per-token acceptance per request class
    code = 0.75
    chat = 0.45
    default_class = "code"

In JSON the same keys form one object (``"classes": {"code": 0.75, ...}``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Profile",
    "DEFAULT_DEPTHS",
    "BUILTIN_PROFILES",
    "CLOSE_PROFILES",
    "close_call_profile",
    "drift_profile",
    "crossover_profile",
    "alternating_profile",
    "get_profile",
]


#: SPEC depths a simulated server offers by default (with its configured one)
DEFAULT_DEPTHS: tuple[int, ...] = (1, 3, 5, 7)


@dataclass(frozen=True)
class Profile:
    """A server's step-cost model and acceptance model (see the module doc)."""

    name: str
    description: str = ""
    num_draft_tokens: int = 4
    plain_fixed: float = 0.010
    plain_per_req: float = 0.0002
    plain_per_req2: float = 0.0
    per_kv: float = 0.0
    verify_fixed: float = 0.012
    verify_per_tok: float = 0.0001
    verify_per_tok2: float = 0.0
    draft_fixed: float = 0.001
    draft_per_req: float = 0.00001
    extend_fixed: float = 0.001
    extend_per_tok: float = 0.00001
    resync_fixed: float = 0.002
    catchup_per_tok: float = 0.000005
    catchup_cap: int = 64
    prefill_fixed: float = 0.010
    prefill_per_tok: float = 0.00002
    max_prefill_tokens: int = 16384
    max_running: int = 256
    max_kv_tokens: int = 10**9
    noise: float = 0.02
    client_gap_s: float = 0.0
    prompt_len: tuple[int, int] = (500, 2500)
    output_len: tuple[int, int] = (200, 600)
    classes: Mapping[str, float] = field(
        default_factory=lambda: {"code": 0.75, "chat": 0.45}
    )
    default_class: str = "code"
    #: optional measured step-time tables ``((batch, seconds), ...)``, linear
    #: in between and beyond the last two points; they replace the PLAIN
    #: formula / the SPEC formula at ``num_draft_tokens`` (other draft counts
    #: are shifted by the formula's difference). ``per_kv`` still applies.
    plain_table: tuple[tuple[float, float], ...] = ()
    spec_table: tuple[tuple[float, float], ...] = ()
    #: the SPEC depths (draft steps) the simulated server can run, offered to
    #: policies as ``StepView.depths``; empty: :data:`DEFAULT_DEPTHS` plus
    #: the configured ``num_draft_tokens - 1`` (see :meth:`spec_depths`).
    depths: tuple[int, ...] = ()

    # -- the cost model ----------------------------------------------------------

    def plain_time(self, b: int, kv: int) -> float:
        if self.plain_table:
            return _interp(self.plain_table, b) + self.per_kv * kv
        return self._plain_formula(b, kv)

    def spec_time(self, b: int, kv: int, s: int | None = None) -> float:
        default = self.num_draft_tokens - 1
        if s is None:
            s = default
        if self.spec_table:
            t = _interp(self.spec_table, b)
            if s != default:
                # the measured cost over a PLAIN step, scaled like the
                # formula's cost over its PLAIN step (see the module doc)
                tp = self.plain_time(b, 0)
                fp = self._plain_formula(b, 0)
                extra = self._spec_formula(b, 0, default) - fp
                t = tp + (t - tp) * (self._spec_formula(b, 0, s) - fp) / extra
            return t + self.per_kv * kv
        return self._spec_formula(b, kv, s)

    def _plain_formula(self, b: int, kv: int) -> float:
        return (
            self.plain_fixed
            + self.plain_per_req * b
            + self.plain_per_req2 * b * b
            + self.per_kv * kv
        )

    def _spec_formula(self, b: int, kv: int, s: int) -> float:
        tok = b * (s + 1)
        t = (
            self.verify_fixed
            + self.verify_per_tok * tok
            + self.verify_per_tok2 * tok * tok
            + self.per_kv * kv
        )
        # verifying >= 1 token per request costs at least a plain decode
        tp = self._plain_formula(b, kv)
        if t < tp:
            t = tp
        t += s * (self.draft_fixed + self.draft_per_req * b)
        return t + self.extend_fixed + self.extend_per_tok * tok

    def spec_depths(self) -> tuple[int, ...]:
        """The SPEC depths a policy may choose here, ascending: ``depths``,
        else SGLang 0.5.23's adaptive candidates at small batches (1, 3, 5,
        7) up to the deeper of 7 and the configured depth, which is always
        one of them. ``(configured,)`` makes the profile binary."""
        own = self.num_draft_tokens - 1
        if self.depths:
            return tuple(sorted(set(self.depths) | {own}))
        return tuple(sorted({d for d in DEFAULT_DEPTHS if d <= max(7, own)} | {own}))

    def resync_time(self, b: int, missed: int) -> float:
        m = missed if missed < self.catchup_cap else self.catchup_cap
        return self.resync_fixed + self.catchup_per_tok * b * m

    def prefill_time(self, tokens: int) -> float:
        return self.prefill_fixed + self.prefill_per_tok * tokens

    def mean_accept(self, alpha: float, s: int | None = None) -> float:
        """Expected tokens per request of a SPEC step with ``s`` drafts."""
        if s is None:
            s = self.num_draft_tokens - 1
        return sum(alpha**j for j in range(s + 1))

    def mean_context(self) -> float:
        return (self.prompt_len[0] + self.prompt_len[1]) / 2 + (
            self.output_len[0] + self.output_len[1]
        ) / 4


def _interp(table: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear interpolation, linear extrapolation at both ends."""
    n = len(table)
    if n == 1:
        return table[0][1]
    i = 1
    while i < n - 1 and table[i][0] < x:
        i += 1
    (x0, y0), (x1, y1) = table[i - 1], table[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return y if y > 1e-6 else 1e-6


# ---------------------------------------------------------------------------
# Built-in profiles
# ---------------------------------------------------------------------------

#: 8x RTX PRO 6000 Blackwell over PCIe Gen5, TP8, SGLang 0.5.9, EAGLE-3 topk=1,
#: 3 draft tokens (num_draft_tokens=4), coding/agentic prompts
#: (/work/shared/data/seed-pcie-tp8.json).
#:
#: How it was fitted: a parametric model (fixed + per-request + quadratic, with
#: and without a client think time) could not follow the measured curves
#: within 5% (best max error 6.4%: the measurements zig-zag, e.g. C=5 is slow
#: for no-spec but fast for EAGLE-3), so this profile stores measured-style
#: step-time tables instead. Acceptance (alpha 0.6 for the coding class, mean
#: accept length 2.18), prefill, draft/extend/resync costs and the
#: prompt/output lengths were fixed a priori; the table values at batch
#: 1..250 started from ``b / tok_s`` (PLAIN) and ``b * 2.18 / tok_s`` (SPEC)
#: and were refined by fixed-point iteration (value *= simulated / measured
#: throughput, 8 rounds) running this simulator's closed-loop grid (seed 0,
#: full length) with never/always, which absorbs prefill stalls and batches
#: below C. tests/unit/test_sim.py re-checks the 5% agreement. The formula
#: parameters below only shape SPEC steps with other draft counts (the
#: sglang-ema baseline) and the resync.
SEED_PCIE_TP8 = Profile(
    name="seed-pcie-tp8",
    description=(
        "8x PCIe GPUs, TP8: communication-bound verify, no-spec wins everywhere "
        "(calibrated to seed-pcie-tp8.json)"
    ),
    num_draft_tokens=4,
    plain_table=(
        (1, 0.01066),
        (2, 0.01212),
        (5, 0.01624),
        (10, 0.02005),
        (30, 0.03689),
        (70, 0.07569),
        (100, 0.11373),
        (250, 0.27567),
    ),
    spec_table=(
        (1, 0.02747),
        (2, 0.03358),
        (5, 0.05857),
        (10, 0.08641),
        (30, 0.20599),
        (70, 0.42271),
        (100, 0.59830),
        (250, 1.49484),
    ),
    per_kv=0.0,
    verify_fixed=0.012,
    verify_per_tok=0.0011,
    draft_fixed=0.004,
    draft_per_req=0.0003,
    extend_fixed=0.003,
    extend_per_tok=0.0001,
    resync_fixed=0.004,
    catchup_per_tok=0.00001,
    catchup_cap=64,
    prefill_fixed=0.015,
    prefill_per_tok=0.00004,
    max_running=256,
    noise=0.02,
    prompt_len=(500, 2500),
    output_len=(200, 600),
    classes={"code": 0.6, "chat": 0.35},
    default_class="code",
)

#: Llama-3.1-8B on one H100: 158 tok/s no-spec vs 373 tok/s EAGLE-3 at batch 1
#: (plain step 6.3 ms; SPEC step with 5 drafts, alpha 0.75 -> 3.3 tokens in
#: 8.8 ms); EAGLE-3 paper: 1.38x throughput at batch 64 in SGLang. Memory-bound
#: until ~64 requests, then verify of 6 tokens/request turns compute-bound, so
#: no-spec overtakes somewhere above batch ~100.
SINGLE_GPU_8B = Profile(
    name="single-gpu-8b",
    description="Llama-3.1-8B, 1x H100: speculation wins at low concurrency",
    num_draft_tokens=6,
    plain_fixed=0.0062,
    plain_per_req=0.000045,
    plain_per_req2=0.00000012,
    per_kv=0.0000000008,
    verify_fixed=0.0062,
    verify_per_tok=0.000020,
    verify_per_tok2=0.00000003,
    draft_fixed=0.00040,
    draft_per_req=0.000004,
    extend_fixed=0.0004,
    extend_per_tok=0.000002,
    resync_fixed=0.0008,
    catchup_per_tok=0.000002,
    catchup_cap=64,
    prefill_fixed=0.004,
    prefill_per_tok=0.00004 / 8,
    max_running=256,
    noise=0.02,
    prompt_len=(200, 1200),
    output_len=(150, 450),
    classes={"code": 0.75, "chat": 0.5},
    default_class="code",
)

#: Long contexts (8k-32k prompts), memory-bound decoding: the KV read dominates
#: both steps and the verify reads the KV once for all k tokens, so speculation
#: wins more the larger the batch (MagicDec, arXiv 2408.11049); 8x H100 TP8
#: Llama-3.1-70B, KV capacity ~1.6M tokens.
LONG_CONTEXT = Profile(
    name="long-context",
    description="8k-32k contexts, KV-bound decode: speculation wins at large batch",
    num_draft_tokens=4,
    plain_fixed=0.012,
    plain_per_req=0.00006,
    plain_per_req2=0.0,
    per_kv=0.00000005,
    verify_fixed=0.013,
    verify_per_tok=0.00003,
    verify_per_tok2=0.0,
    draft_fixed=0.0012,
    draft_per_req=0.00002,
    extend_fixed=0.0012,
    extend_per_tok=0.00001,
    resync_fixed=0.002,
    catchup_per_tok=0.00002,
    catchup_cap=64,
    prefill_fixed=0.02,
    prefill_per_tok=0.00001,
    max_prefill_tokens=65536,
    max_running=256,
    max_kv_tokens=1_600_000,
    noise=0.02,
    prompt_len=(8000, 32000),
    output_len=(200, 600),
    classes={"code": 0.7, "chat": 0.45},
    default_class="code",
)


#: what the synthetic profiles (close calls, the crossover) share besides
#: their step-time tables and traffic: no KV-length cost, a small measured
#: resync and catch-up, a cheap prefill, room for 256 requests.
_SYNTHETIC_COSTS: dict[str, Any] = {
    "per_kv": 0.0,
    "resync_fixed": 0.002,
    "catchup_per_tok": 0.000002,
    "catchup_cap": 64,
    "prefill_fixed": 0.008,
    "prefill_per_tok": 0.000005,
    "max_running": 256,
}


def close_call_profile(gain: float) -> Profile:
    """A close call: SPEC's expected output rate is ``1 + gain`` times
    PLAIN's at every batch size (``gain`` of a few percent, either sign),
    with noisy step times (``exp(N(0, 0.12))``: about +-12%), a small
    measured resync, and clients that pause between requests so the decode
    batch moves from step to step. SPEC's table is PLAIN's times the mean
    accept length of the default class divided by ``1 + gain``."""
    alpha = 0.6
    s = 3  # num_draft_tokens 4
    acc = sum(alpha**j for j in range(s + 1))
    batches = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    plain = tuple((b, 0.008 + 0.00012 * b) for b in batches)
    spec = tuple((b, t * acc / (1.0 + gain)) for b, t in plain)
    pct = round(abs(gain) * 100)
    ahead = "spec" if gain > 0 else "plain"
    return Profile(
        name=f"close-{ahead}-{pct}",
        description=(
            f"close call: {ahead.upper()} {pct}% ahead at every batch size, "
            "+-12% step-time noise, small resync"
        ),
        num_draft_tokens=s + 1,
        plain_table=plain,
        spec_table=spec,
        **_SYNTHETIC_COSTS,
        noise=0.12,
        client_gap_s=0.3,
        prompt_len=(200, 1200),
        output_len=(100, 400),
        classes={"code": alpha, "chat": 0.4},
        default_class="code",
    )


def drift_profile(ratio: float = 2.58) -> Profile:
    """Acceptance drift: a SPEC step takes ``ratio`` PLAIN steps at every
    batch size (the seed profile's ratio at batch 1, on its PLAIN table), and
    requests come in two classes, ``hi`` (alpha 0.85: SPEC about 23% ahead)
    and ``lo`` (alpha 0.45: PLAIN about 31% ahead). A workload drifts by
    moving its class mix (:func:`eagle_gate.sim.workloads.policy_suite`)."""
    plain = SEED_PCIE_TP8.plain_table
    return dataclasses.replace(
        SEED_PCIE_TP8,
        name="drift",
        description=(
            f"SPEC step = {ratio} PLAIN steps at every batch; acceptance 0.85 "
            "(SPEC ahead) or 0.45 (PLAIN ahead)"
        ),
        spec_table=tuple((b, t * ratio) for b, t in plain),
        classes={"hi": 0.85, "lo": 0.45},
        default_class="hi",
    )


def crossover_profile(crossover: float = 16.0, steep: float = 0.25) -> Profile:
    """A crossover in batch size: SPEC's step time over PLAIN's grows like
    ``(b / crossover) ** steep`` times the mean accept length, so SPEC wins
    below ``crossover`` requests and PLAIN above (about 9% apart at +-40% of
    it). Clients pause about as long as a request decodes, and outputs are
    short, so the batch moves from step to step (binomial in the clients)."""
    alpha = 0.7
    s = 3
    acc = sum(alpha**j for j in range(s + 1))
    batches = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256)
    plain = tuple((b, 0.008 + 0.00012 * b) for b in batches)
    spec = tuple((b, t * acc * (b / crossover) ** steep) for b, t in plain)
    return Profile(
        name=f"crossover-{crossover:g}",
        description=f"SPEC wins below batch {crossover:g}, PLAIN above",
        num_draft_tokens=s + 1,
        plain_table=plain,
        spec_table=spec,
        **_SYNTHETIC_COSTS,
        noise=0.05,
        client_gap_s=1.0,
        prompt_len=(200, 1200),
        output_len=(50, 150),
        classes={"code": alpha, "chat": 0.4},
        default_class="code",
    )


def alternating_profile() -> Profile:
    """Acceptance that takes turns: a 7B target on one A40-like GPU, 4 tokens
    verified per request, requests of class ``hi`` (alpha 0.88, code) or
    ``lo`` (alpha 0.5, chat). A SPEC step costs 2.6 PLAIN steps up to batch
    8 (a draft that is not free next to a 20 ms decode), rising to 4.0 at
    batch 128, where verifying 512 tokens is compute-bound: SPEC is ~28%
    ahead on ``hi`` and ~28% behind on ``lo`` at small batches, and ~17%
    behind even on ``hi`` at batch 128. The workload alternates the class of
    every request (:func:`eagle_gate.sim.workloads.alternating_rows`)."""
    ratio = ((1, 2.6), (4, 2.6), (8, 2.6), (16, 2.7), (32, 3.0), (64, 3.4),
             (128, 4.0), (256, 4.6))  # fmt: skip
    plain = tuple((b, 0.020 + 0.00005 * b) for b, _ in ratio)
    spec = tuple((b, t * r) for (b, t), (_, r) in zip(plain, ratio, strict=True))
    return Profile(
        name="alternating-a40",
        description=(
            "7B on an A40-like GPU: acceptance 0.88 (SPEC ahead below batch "
            "~32) or 0.5 (PLAIN ahead), PLAIN ahead at batch 128 either way"
        ),
        num_draft_tokens=4,
        plain_table=plain,
        spec_table=spec,
        **_SYNTHETIC_COSTS,
        noise=0.03,
        prompt_len=(200, 1500),
        output_len=(200, 800),
        classes={"hi": 0.88, "lo": 0.5},
        default_class="hi",
    )


#: close calls (``--workload close``): one mode 1, 3 or 5% ahead, each way.
CLOSE_PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (close_call_profile(g) for g in (0.01, 0.03, 0.05, -0.01, -0.03, -0.05))
}

BUILTIN_PROFILES: dict[str, Profile] = {
    p.name: p for p in (SEED_PCIE_TP8, SINGLE_GPU_8B, LONG_CONTEXT)
}
BUILTIN_PROFILES.update(CLOSE_PROFILES)


def get_profile(name: str) -> Profile:
    try:
        return BUILTIN_PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown profile {name!r}; built-in: {', '.join(BUILTIN_PROFILES)}"
        ) from None
