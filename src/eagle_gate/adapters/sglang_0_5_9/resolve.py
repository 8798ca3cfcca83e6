"""SGLang 0.5.9's resolution of the speculative arguments, read back.

0.5.9 resolves in ``ServerArgs.__post_init__`` (``_handle_speculative_decoding``
and the model-specific branches before it), in place, when
``prepare_server_args`` builds the record: ``NEXTN`` becomes ``EAGLE``,
``auto_choose_speculative_params`` fills the shape when
``--speculative-num-steps`` is not given (a Llama target: 5 steps, topk 4, 8
draft tokens), topk 1 forces ``num_steps + 1`` draft tokens, spec v2 turns
overlap on, MiMoV2Flash and Step3p5 turn multi-layer EAGLE on. Every
``ServerArgs`` of this version is therefore already resolved: this module
only reads it. 0.5.9 has no adaptive speculation, attention-DP width field or
rejection sampling.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from eagle_gate.adapters.draft_model import draft_model_of
from eagle_gate.adapters.resolved import ResolvedSpec, sglang_decisions

__all__ = ["resolve_spec", "resolve_argv"]


def resolve_spec(server_args: Any, requested: Any = None) -> ResolvedSpec:
    """The resolved view of a 0.5.9 ``ServerArgs`` (built, so resolved).

    ``requested``: the command line's raw speculative flags, when known, only
    to say what SGLang changed (the record itself no longer has them)."""
    a = server_args
    algorithm = getattr(a, "speculative_algorithm", None)
    algorithm = None if algorithm in (None, "") else str(algorithm).upper()
    if algorithm == "NONE":
        algorithm = None
    dp_size = int(getattr(a, "dp_size", 1) or 1)
    spec = ResolvedSpec(
        algorithm=algorithm,
        num_steps=_int(getattr(a, "speculative_num_steps", None)),
        topk=_int(getattr(a, "speculative_eagle_topk", None)),
        num_draft_tokens=_int(getattr(a, "speculative_num_draft_tokens", None)),
        multi_layer=bool(getattr(a, "enable_multi_layer_eagle", False)),
        adaptive=False,
        attn_dp_size=dp_size if getattr(a, "enable_dp_attention", False) else 1,
        dp_size=dp_size,
        pp_size=int(getattr(a, "pp_size", 1) or 1),
        overlap=not getattr(a, "disable_overlap_schedule", False),
        rejection_sampling=False,
        disaggregation_mode=str(getattr(a, "disaggregation_mode", "null") or "null"),
    )
    if spec.speculating:
        draft, mtp = draft_model_of(a, getattr(a, "speculative_draft_model_path", None))
        spec = replace(spec, draft_model=draft, mtp=mtp)
    decided = sglang_decisions(requested, spec)
    if decided:
        spec = replace(spec, decided_by_sglang=decided)
    return spec


def resolve_argv(argv: list[str]) -> tuple[Any, ResolvedSpec]:
    """SGLang's own ``prepare_server_args`` on ``argv`` (which resolves), and
    its view. Reads the model's config; loads no weights. The caller sets
    ``SGLANG_ENABLE_SPEC_V2`` first, as the launcher does."""
    from sglang.srt.server_args import prepare_server_args

    from eagle_gate.adapters.resolved import requested_flags

    server_args = prepare_server_args(list(argv))
    return server_args, resolve_spec(server_args, requested_flags(argv))


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
