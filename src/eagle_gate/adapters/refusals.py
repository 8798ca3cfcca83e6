"""The speculative setups the gate refuses, and why.

A setup the gate cannot gate exactly is refused at launch (and again in each
scheduler, which sees what SGLang built) with :class:`GateRefused`, whose
message says what to pass instead. Passing such a setup through silently
would leave an operator believing the gate is at work, or break the server.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from eagle_gate.adapters.resolved import ResolvedSpec
from eagle_gate.config import GateConfig

logger = logging.getLogger("eagle_gate")

__all__ = [
    "GateRefused",
    "DP_ATTENTION_REFUSAL",
    "DP_LAZY_REFUSAL",
    "PP_REFUSAL",
    "MULTI_LAYER_REFUSAL",
    "tree_refusal",
    "check_speculation",
    "check_built_worker",
    "check_lazy_buffer",
    "lazy_buffer_bytes",
]


class GateRefused(RuntimeError):
    """The server configuration is one the gate does not handle."""


#: why data-parallel attention is refused (both versions).
DP_ATTENTION_REFUSAL = (
    "data-parallel attention (--enable-dp-attention / --attn-dp-size > 1) is not "
    "handled by eagle_gate: DP ranks exchange token counts every step for their "
    "MLP sync, and a PLAIN step's count (batch size) differs from a SPEC or idle "
    "rank's (batch size x draft tokens), so ranks would hang in a collective or "
    "mix activations. Launch without data-parallel attention, or without "
    "eagle_gate"
)
#: why lazy draft sync is refused under data-parallel attention.
DP_LAZY_REFUSAL = (
    "--gate-draft-sync lazy under data-parallel attention is refused: its "
    "catch-up runs an extra draft extend before a SPEC step on the DP ranks "
    "whose requests had PLAIN stretches only, so the ranks' collectives would "
    "stop matching. Use --gate-draft-sync eager (the default) or none"
)
#: why pipeline parallelism is refused (both versions).
PP_REFUSAL = (
    "pipeline parallelism (--pp-size > 1) is not handled by eagle_gate: SGLang "
    "pre-builds each round's verify input on the earlier stages, so the gate "
    "could only ever run SPEC there; it refuses rather than sit idle while "
    "looking active. Launch without eagle_gate for pipeline-parallel serving"
)


#: why multi-layer EAGLE is refused (both versions), from the resolved view
#: or from the worker SGLang built.
MULTI_LAYER_REFUSAL = (
    "multi-layer EAGLE (--enable-multi-layer-eagle, which SGLang also turns on by "
    "itself for some MTP models such as MiMo-V2 and Step-3.5) is not handled by "
    "eagle_gate: SGLang runs it with MultiLayerEagleWorkerV2, whose draft keeps "
    "one layer's state per step, and the gate's plain step keeps only "
    "EAGLEWorkerV2's single draft layer in step. Launch this model without "
    "eagle_gate"
)


def tree_refusal(spec: ResolvedSpec, *, draft_sync: str | None = None) -> str:
    """Why a draft tree (topk > 1) is refused, and what to pass instead,
    whichever way the topk was chosen (given, or SGLang's own choice).
    ``draft_sync``: the setting that blocks a tree the version could gate
    (lazy, none), or None where the version gates no trees."""
    steps = spec.num_steps or 3
    how = (
        "SGLang chose this shape itself because no --speculative-num-steps / "
        "--speculative-eagle-topk / --speculative-num-draft-tokens were given"
        if spec.shape_auto
        else "as resolved from the command line"
    )
    chain = (
        f"--speculative-num-steps {steps} --speculative-eagle-topk 1 "
        f"--speculative-num-draft-tokens {steps + 1}"
    )
    if draft_sync is not None:
        why = (
            f"--gate-draft-sync {draft_sync} was asked: eagle_gate gates draft "
            "trees with eager draft sync only, the sync measured to keep a tree's "
            "draft state exact across PLAIN stretches "
            "(scripts/measure_tree_draft.py). Use --gate-draft-sync eager, or pass "
        )
    else:
        why = (
            "eagle_gate gates draft trees on SGLang 0.5.23 only (measured exact "
            "there with eager draft sync); on this version it gates chain drafts "
            "(topk 1). Pass "
        )
    return (
        f"SGLang would run a draft tree ({spec.shape()}; {how}), and {why}{chain}, "
        "or launch without eagle_gate"
    )


def check_speculation(
    spec: ResolvedSpec,
    *,
    extra_refusals: Sequence[tuple[bool, str]] = (),
    draft_sync: str | None = None,
    gates_trees: bool = False,
    gates_dp_attention: bool = False,
) -> tuple[bool, str]:
    """Decide what the gate does with the speculative setup SGLang resolved.

    Returns ``(gated, state)``. Raises GateRefused for speculative setups the
    gate does not handle in any SGLang version (other algorithms, multi-layer
    EAGLE, a draft tree (topk > 1) however it was chosen where the version
    does not gate trees (``gates_trees``) or the draft sync is not eager,
    data-parallel attention, pipeline parallelism, rejection sampling
    without eager draft sync), because passing them through silently would
    leave an operator believing the gate is at work, or would break the
    server. ``spec`` is the version's resolution (never the raw command line:
    NEXTN is gated as the EAGLE it becomes, an auto-chosen tree is refused
    like a given one). ``extra_refusals``: the version's own ``(refused,
    reason)`` pairs. ``draft_sync``: the gate's setting (None: no plain step,
    or not known here). ``gates_trees``: the version's plain step was measured
    to keep a draft tree exact with eager sync (SGLang 0.5.23).
    ``gates_dp_attention``: the version votes on the mode in its MLP-sync
    gather (``adapters/dp_vote.py``); lazy draft sync stays refused there.
    """
    if not spec.speculating:
        return False, "idle: speculation is off, every step is SGLang's own"
    name = spec.algorithm
    if name not in {"EAGLE", "EAGLE3"}:
        raise GateRefused(
            f"--speculative-algorithm {name} (as SGLang resolves it) is not handled "
            "by eagle_gate; supported: EAGLE, EAGLE3 and NEXTN (which SGLang runs "
            "as EAGLE), or no speculation. Launch without eagle_gate to use it."
        )
    if spec.multi_layer:
        raise GateRefused(MULTI_LAYER_REFUSAL)
    for refused, reason in extra_refusals:
        if refused:
            raise GateRefused(reason)
    if spec.attn_dp_size > 1:
        if not gates_dp_attention:
            raise GateRefused(DP_ATTENTION_REFUSAL)
        if draft_sync == "lazy":
            raise GateRefused(DP_LAZY_REFUSAL)
    if spec.pp_size > 1:
        raise GateRefused(PP_REFUSAL)
    if spec.rejection_sampling and draft_sync not in (None, "eager"):
        raise GateRefused(
            f"--gate-draft-sync {draft_sync} with rejection sampling "
            "(--speculative-use-rejection-sampling, SGLang's default for EAGLE on "
            "ROCm) is refused: a plain step that skips the draft leaves the draft "
            "distribution (draft_probs) stale, and the next verify would accept "
            "tokens against a q that did not propose them, biasing the output. "
            "Use --gate-draft-sync eager (the default), which keeps it exact"
        )
    if spec.topk is not None and spec.topk > 1:
        if not gates_trees:
            raise GateRefused(tree_refusal(spec))
        if draft_sync not in (None, "eager"):
            raise GateRefused(tree_refusal(spec, draft_sync=draft_sync))
    return True, f"gating {spec.describe()}"


def check_built_worker(worker: Any, spec: ResolvedSpec, worker_hint: str) -> None:
    """Judge the draft worker SGLang actually built, beside the resolved view:
    multi-layer EAGLE shows as ``MultiLayerEagleWorkerV2`` (not a subclass of
    ``EAGLEWorkerV2``); a worker whose ``topk`` is not the view's means the
    view misread SGLang, and what was judged is not what runs."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    if type(worker).__name__ == "MultiLayerEagleWorkerV2":
        raise GateRefused(MULTI_LAYER_REFUSAL)
    if not isinstance(worker, EAGLEWorkerV2):
        raise GateRefused(
            f"SGLang built {type(worker).__name__}, not EAGLEWorkerV2; {worker_hint}"
        )
    topk = getattr(worker, "topk", 1)
    if isinstance(topk, int) and topk != (spec.topk or 1):
        raise GateRefused(
            f"SGLang built a draft worker with topk {topk}, but its resolved "
            f"setup read topk {spec.topk} ({spec.describe()}); eagle_gate judged "
            "the latter and stops rather than gate what it did not judge; launch "
            "without eagle_gate and report this with `eagle-gate doctor`'s output"
        )


def lazy_buffer_bytes(rows: int, width: int, hidden: int, dtype_bytes: int) -> int:
    """Bytes of the lazy draft-sync ring: hidden rows plus int64 tokens."""
    return rows * width * (hidden * dtype_bytes + 8)


def check_lazy_buffer(scheduler: Any, spec: ResolvedSpec, config: GateConfig) -> int:
    """Report the lazy buffer's size at start and refuse it above the bound.

    The width the draft's hidden input has is the target's hidden size, three
    times it for EAGLE3 (its auxiliary layers), or the model config's
    ``spec_hidden_size`` where the version has one. The algorithm is the one
    SGLang resolved (NEXTN runs as EAGLE: one layer's hidden state).
    """
    worker = scheduler.draft_worker
    rows = int(worker.req_to_token_pool.req_to_token.shape[0])
    width = int(worker.speculative_num_draft_tokens)
    model_config = worker.target_worker.model_config
    hidden = getattr(model_config, "spec_hidden_size", None)
    if not hidden:
        aux = 3 if spec.algorithm == "EAGLE3" else 1
        hidden = aux * int(model_config.hidden_size)
    dtype_bytes = getattr(model_config.dtype, "itemsize", 2)
    size = lazy_buffer_bytes(rows, width, int(hidden), int(dtype_bytes))
    bound = config.lazy_max_mib * 2**20
    logger.info(
        "eagle_gate: lazy draft sync will keep %d request slots x %d positions x "
        "%d hidden: %.1f MiB (bound %d MiB)",
        rows,
        width,
        hidden,
        size / 2**20,
        config.lazy_max_mib,
    )
    if size > bound:
        raise GateRefused(
            f"lazy draft sync needs {size / 2**20:.0f} MiB for its buffer, above "
            f"lazy_max_mib={config.lazy_max_mib}; raise --gate-lazy-max-mib or "
            "use --gate-draft-sync eager"
        )
    return size
