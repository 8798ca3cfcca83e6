"""SGLang 0.5.23's MLP-sync gather carries the DP vote
(:mod:`eagle_gate.adapters.dp_vote`).

0.5.23 builds each rank's row in ``MLPSyncBatchInfo._get_local_tensor``
(``managers/scheduler_components/dp_attn.py``), sizes the gathered tensor
from that row (``info_width = local_info_tensor.numel()`` in ``all_gather``),
fills inactive ranks from ``_get_fallback_tensor``, and reads the eleven
columns it knows by index from ``tp0_info_cpu`` (attention-TP rank 0 of each
DP rank). So a twelfth column, appended to both rows, travels through
SGLang's own gather unchanged, and no other reader notices it.

The two rows are rebuilt here with the vote in the same ``torch.tensor``
call (no allocation beyond stock's); ``ROW_FIELDS`` is 0.5.23's column
order, and ``tests/inprocess/test_dp_vote.py`` checks the rebuilt rows against
SGLang's own, column for column, so a drift fails there.

``PATCHES``: the rows replaced, the gather wrapped to settle the vote, and
``prepare_mlp_sync_batch_raw`` wrapped to cast it (``hooks.dp_cast_wrapper``).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from eagle_gate.adapters.dp_vote import DPVote, row
from eagle_gate.adapters.hooks import dp_cast_wrapper, replaced_by
from eagle_gate.adapters.patching import PatchTarget

__all__ = [
    "ROW_FIELDS",
    "VOTE",
    "PATCHES",
    "local_row",
    "fallback_row",
    "settle_after_gather",
]

#: 0.5.23's row, in its column order (``_get_local_tensor``).
ROW_FIELDS = (
    "num_tokens",
    "num_tokens_for_logprob",
    "can_run_decode_cuda_graph",
    "is_extend_in_batch",
    "local_can_run_tbo",
    "local_forward_mode",
    "can_run_prefill_cuda_graph",
    "prefill_cuda_graph_max_prefix_len",
    "can_run_draft_cuda_graph",
    "is_health_check",
    "attention_pairs",
)
_ROW_VALUES = attrgetter(*ROW_FIELDS)

#: the vote of this scheduler process (one scheduler thread per process).
VOTE = DPVote()

#: whether this version gates DP attention (else it is refused at launch):
#: a real DP-attention server ran the vote end to end on CPU
#: (tests/servers/test_dp_attention_cpu.py).
GATES_DP_ATTENTION = True


def local_row(info: Any, device: Any, dtype: Any = None) -> Any:
    """0.5.23's ``_get_local_tensor``, this rank's vote in a 12th column."""
    return row((*_ROW_VALUES(info), VOTE.local), device, dtype)


def fallback_row(info: Any, device: Any, dtype: Any = None) -> Any:
    """0.5.23's ``_get_fallback_tensor`` (an inactive rank), voting idle."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return row([0, 0, 1, 0, 1, ForwardMode.IDLE.value, 0, 0, 1, 0, 0, 0], device, dtype)


def settle_after_gather(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Around ``MLPSyncBatchInfo.all_gather``: SGLang's gather, then every
    rank's vote read from the gathered rows (the last column of
    ``tp0_info_cpu``, already on the CPU) and settled into the agreed mode."""
    out = wrapped(*args, **kwargs)
    VOTE.settle(instance.tp0_info_cpu[:, len(ROW_FIELDS)].tolist())
    return out


DP_MODULE = "sglang.srt.managers.scheduler_components.dp_attn"
_ROW = ("self", "device", "dtype")
PATCHES = (
    (
        PatchTarget(DP_MODULE, "MLPSyncBatchInfo._get_local_tensor", _ROW),
        replaced_by(local_row),
    ),
    (
        PatchTarget(DP_MODULE, "MLPSyncBatchInfo._get_fallback_tensor", _ROW),
        replaced_by(fallback_row),
    ),
    (
        PatchTarget(
            DP_MODULE,
            "MLPSyncBatchInfo.all_gather",
            ("self", "device", "group", "use_all_reduce"),
        ),
        settle_after_gather,
    ),
    (
        PatchTarget(DP_MODULE, "prepare_mlp_sync_batch_raw", ("local_batch",)),
        dp_cast_wrapper(VOTE),
    ),
)
