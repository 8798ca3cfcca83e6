"""SGLang 0.5.23's resolution of the speculative arguments, read back.

0.5.23 keeps the operator's input on the ``ServerArgs`` record untouched and
records each decision as a declaration over it
(``arg_groups/overrides.declare_resolution``); ``resolve_once`` runs the
resolution pipeline once per record, and ``resolving_view`` reads the
declarations over the raw fields. The speculative part lives in
``arg_groups/speculative_hook.py``: ``handle_speculative_decoding`` maps NEXTN
(and EAGLE) to EAGLE, ``_maybe_disable_adaptive`` switches
``--speculative-adaptive`` off where adaptive cannot run,
``_handle_eagle_family`` lets ``_auto_choose_speculative_params`` choose the
shape when no ``--speculative-num-steps`` is given (a Llama target: 5 steps,
topk 4, 8 draft tokens) and turns overlap off on CPU
(``_disable_overlap_schedule_for_cpu``); model overrides
(``model_overrides/mimo_v2.py``, ``gigachat35.py``, Step3p5 in
``overrides.py``) turn multi-layer EAGLE on.

A record that SGLang has not resolved yet (``prepare_server_args`` returns raw
input; ``run_server`` resolves it) is resolved here on a deep copy, so the
operator's record reaches SGLang's own launcher unsealed, exactly as it would
without the gate (``run_server`` still writes to it before resolving in gRPC
mode). Resolution is a function of the record and the environment, so the
copy resolves as SGLang will.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from eagle_gate.adapters.draft_model import draft_model_of
from eagle_gate.adapters.resolved import ResolvedSpec, sglang_decisions

__all__ = ["resolve_spec", "resolve_argv", "resolved_record"]


def resolved_record(server_args: Any) -> Any:
    """``server_args`` when SGLang resolved it already, else a resolved copy."""
    if getattr(server_args, "_resolution_finished", False):
        return server_args
    record = copy.deepcopy(server_args)
    record.resolve_once()
    return record


def resolve_spec(server_args: Any, requested: Any = None) -> ResolvedSpec:
    """The resolved view of a 0.5.23 ``ServerArgs`` record (resolving a copy
    when SGLang has not yet). ``requested`` defaults to the record's own raw
    fields, which 0.5.23 leaves as the operator gave them."""
    from sglang.srt.arg_groups.overrides import resolving_view

    record = resolved_record(server_args)
    cfg = resolving_view(record)
    algorithm = cfg.speculative_algorithm
    algorithm = None if algorithm in (None, "") else str(algorithm).upper()
    if algorithm == "NONE":
        algorithm = None
    spec = ResolvedSpec(
        algorithm=algorithm,
        num_steps=_int(cfg.speculative_num_steps),
        topk=_int(cfg.speculative_eagle_topk),
        num_draft_tokens=_int(cfg.speculative_num_draft_tokens),
        multi_layer=bool(cfg.enable_multi_layer_eagle),
        adaptive=bool(cfg.speculative_adaptive),
        attn_dp_size=int(cfg.attn_dp_size or 1),
        dp_size=int(cfg.dp_size or 1),
        pp_size=int(cfg.pp_size or 1),
        overlap=not cfg.disable_overlap_schedule,
        rejection_sampling=bool(cfg.speculative_use_rejection_sampling),
        disaggregation_mode=str(cfg.disaggregation_mode or "null"),
    )
    if spec.speculating:
        draft, mtp = draft_model_of(record, cfg.speculative_draft_model_path)
        spec = replace(spec, draft_model=draft, mtp=mtp)
    decided = sglang_decisions(server_args if requested is None else requested, spec)
    return replace(spec, decided_by_sglang=decided) if decided else spec


def resolve_argv(argv: list[str]) -> tuple[Any, ResolvedSpec]:
    """SGLang's own ``prepare_server_args`` on ``argv`` (raw input), and the
    view of its resolution (on a copy). Reads the model's config; loads no
    weights."""
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(list(argv))
    return server_args, resolve_spec(server_args)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
