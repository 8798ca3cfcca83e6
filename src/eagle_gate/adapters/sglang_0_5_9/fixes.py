"""Fixes for SGLang 0.5.9 bugs that gated servers meet, applied only where the
installed code has the defect.

Why a plugin carries them: 0.5.9 is the version of the reference
measurements, a gated server sits in front of production traffic, and one
request must not kill it. Each fix is judged by behaviour, not by version
string: a probe calls the installed function on a few CPU tensors and sees
whether the defect shows. Where it shows, the fix is wrapped on through the
gate's own patch machinery (:class:`~eagle_gate.adapters.patching.Instrumentor`)
and the probe runs again and must pass; a fix that cannot be judged or does
not cure stops the launch (:class:`GatePatchError`), like every other patch.
Where the installed code is sound (a patched 0.5.9, or 0.5.23's code under
``--gate-allow-untested-sglang``) nothing is wrapped.

The fix here:

``logprob-aux-hidden-states``
    ``LogitsProcessor._get_pruned_states`` has three branches. Decode/verify
    and prefill-without-input-logprobs prune EAGLE-3's auxiliary hidden
    states along with the hidden states; the third, prefill WITH input
    logprobs (``return_logprob`` and ``logprob_start_len``), returns
    ``aux_pruned_states = None``. With hidden-state capture LAST, which the
    EAGLE-3 draft's extend after prefill uses
    (``EAGLEWorkerV2._draft_extend_for_prefill``), ``_get_hidden_states_to_store``
    then calls ``torch.cat(None)``: ``TypeError``, and the scheduler, so the
    server, dies. Upstream fixed it after 0.5.9 (sglang PRs 20555 and 21827;
    0.5.23's ``_get_pruned_states`` prunes the aux states in that branch too).
    The fix fills ``aux_pruned_states`` in that branch with the rows the
    branch keeps for ``pruned_states`` (per request, from its logprob start
    to its end; the start steps back one token when a chunk has no logprob
    token, as the branch itself does), sliced and concatenated the same way.
    It is exact: the hidden state stored for each request is then the aux
    state of its last prompt token, which is what the branch without input
    logprobs stores, so the draft sees the same inputs whether or not a
    request asks for logprobs. It does work only on prefill batches with
    input logprobs (the branch returns ``input_logprob_indices`` only
    there); on every other call it costs the wrapper (measured: about 7 us
    per logits-processor call on the loaded two-core CI machine, a few calls
    per decode step, no tensor allocated).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from eagle_gate.adapters.patching import GatePatchError, Instrumentor, PatchTarget

__all__ = ["Fix", "FIXES", "apply_fixes", "applied", "judge"]

logger = logging.getLogger("eagle_gate")

LOGITS_MODULE = "sglang.srt.layers.logits_processor"
PRUNED_STATES_TARGET = PatchTarget(
    LOGITS_MODULE,
    "LogitsProcessor._get_pruned_states",
    (
        "self",
        "hidden_states",
        "hidden_states_before_norm",
        "aux_hidden_states",
        "logits_metadata",
    ),
)


@dataclass(frozen=True)
class Fix:
    """One version-scoped fix: what it cures, where, and how it is judged."""

    name: str
    #: one line for the log, status and doctor.
    summary: str
    target: PatchTarget
    wrapper: Callable
    #: ``(module) -> bool``: True where the installed code has the defect;
    #: raises GatePatchError when it cannot tell.
    has_defect: Callable[[Any], bool]

    def instrumentor(self) -> Instrumentor:
        return _INSTRUMENTORS.setdefault(
            self.name, Instrumentor([(self.target, self.wrapper)])
        )


# -- logprob-aux-hidden-states ------------------------------------------------------
def _kept_rows(metadata: Any) -> list[tuple[int, int]]:
    """The ``[start, end)`` rows of the flat prefill that the input-logprob
    branch keeps, per request (the branch's own rule)."""
    rows, pt = [], 0
    for logprob_start, extend_len in zip(
        metadata.extend_logprob_start_lens_cpu,
        metadata.extend_seq_lens_cpu,
        strict=True,
    ):
        start = logprob_start - 1 if extend_len == logprob_start else logprob_start
        rows.append((pt + start, pt + extend_len))
        pt += extend_len
    return rows


def fill_aux_pruned_states(wrapped, instance, args, kwargs):
    """Wrapper of ``_get_pruned_states``: the aux states of the input-logprob
    branch, pruned like the hidden states (see the module doc)."""
    result = wrapped(*args, **kwargs)
    pruned, before_norm, aux_pruned, sample_idx, logprob_idx, seq_idx = result
    if aux_pruned is not None or logprob_idx is None:
        return result  # another branch, or the branch already did it
    # called on an instance: (hidden, before_norm, aux, metadata); called
    # through the class, wrapt passes instance=None and self comes first
    shift = instance is None
    aux = (
        kwargs["aux_hidden_states"]
        if "aux_hidden_states" in kwargs
        else args[2 + shift]
    )
    if aux is None:
        return result
    meta = kwargs["logits_metadata"] if "logits_metadata" in kwargs else args[3 + shift]
    import torch

    rows = _kept_rows(meta)
    aux_pruned = [torch.cat([h[s:e] for s, e in rows]) for h in aux]
    return pruned, before_norm, aux_pruned, sample_idx, logprob_idx, seq_idx


def _probe_aux_pruning(module: Any) -> bool:
    """Call the installed ``_get_pruned_states`` on a two-request prefill with
    input logprobs and two aux tensors: True if it drops the aux states.

    The second request's logprob start equals its length (a chunk without a
    logprob token), so the probe also checks the step-back rule."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    hidden = torch.arange(14, dtype=torch.float32).view(7, 2)
    aux = [hidden * 10, hidden * 100]
    meta = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        extend_return_logprob=True,
        extend_logprob_start_lens_cpu=[1, 4],
        extend_seq_lens_cpu=[3, 4],
        extend_seq_lens=torch.tensor([3, 4]),
        padded_static_len=-1,
    )
    keep = torch.tensor([1, 2, 6])  # request 0 rows 1-2; request 1 steps back to 6
    try:
        out = module.LogitsProcessor._get_pruned_states(
            SimpleNamespace(), hidden, None, aux, meta
        )
        pruned, aux_pruned = out[0], out[2]
    except Exception as exc:
        raise GatePatchError(
            f"{PRUNED_STATES_TARGET.dotted}: the probe for the input-logprob "
            f"aux-state defect failed: {exc!r}"
        ) from exc
    if not torch.equal(pruned, hidden[keep]):
        raise GatePatchError(
            f"{PRUNED_STATES_TARGET.dotted} keeps other rows than SGLang 0.5.9's "
            "input-logprob branch; the logprob fix cannot be judged"
        )
    if aux_pruned is None:
        return True
    if isinstance(aux_pruned, torch.Tensor):  # a packed layout (newer SGLang)
        aux_pruned = [aux_pruned]
        want = [torch.cat(aux, dim=-1)[keep]]
    else:
        want = [a[keep] for a in aux]
    if len(aux_pruned) != len(want) or not all(
        torch.equal(a, b) for a, b in zip(aux_pruned, want, strict=True)
    ):
        raise GatePatchError(
            f"{PRUNED_STATES_TARGET.dotted} prunes the aux hidden states to other "
            "rows than the hidden states in the input-logprob branch"
        )
    return False


LOGPROB_AUX_FIX = Fix(
    name="logprob-aux-hidden-states",
    summary=(
        "EAGLE-3 prefill with input logprobs: fill aux_pruned_states in "
        "LogitsProcessor._get_pruned_states (0.5.9 leaves it None and the "
        "scheduler dies in torch.cat; fixed upstream by sglang PRs 20555/21827)"
    ),
    target=PRUNED_STATES_TARGET,
    wrapper=fill_aux_pruned_states,
    has_defect=_probe_aux_pruning,
)

#: every fix this adapter carries, in the order they are judged.
FIXES: tuple[Fix, ...] = (LOGPROB_AUX_FIX,)

_INSTRUMENTORS: dict[str, Instrumentor] = {}
_APPLIED: list[str] = []


def _module(fix: Fix) -> Any:
    try:
        module = importlib.import_module(fix.target.module)
    except Exception as exc:
        raise GatePatchError(
            f"fix {fix.name}: module {fix.target.module!r} does not import: {exc!r}"
        ) from exc
    fix.target.check(module)
    return module


def judge() -> dict[str, bool]:
    """Whether the installed SGLang has each fix's defect (nothing applied;
    ``eagle-gate doctor``). Raises GatePatchError when one cannot be judged."""
    return {fix.name: fix.has_defect(_module(fix)) for fix in FIXES}


def apply_fixes() -> list[str]:
    """Judge every fix in this process and wrap on those whose defect the
    installed code has; return their names. Idempotent. Raises
    GatePatchError (the launch stops) when a fix cannot be judged, applied,
    or does not cure the probe."""
    for fix in FIXES:
        module = _module(fix)
        if not fix.has_defect(module):
            continue
        instrumentor = fix.instrumentor()
        instrumentor.instrument()
        instrumentor.require_applied()
        if fix.has_defect(module):
            raise GatePatchError(f"fix {fix.name} is applied but the defect remains")
        if fix.name not in _APPLIED:
            _APPLIED.append(fix.name)
            logger.info("eagle_gate: SGLang fix applied: %s: %s", fix.name, fix.summary)
    return applied()


def applied() -> list[str]:
    """The fixes applied in this process (status, startup log)."""
    return list(_APPLIED)
