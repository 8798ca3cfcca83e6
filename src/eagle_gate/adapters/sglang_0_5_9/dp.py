"""SGLang 0.5.9's MLP-sync gather carrying the DP vote
(:mod:`eagle_gate.adapters.dp_vote`).

0.5.9's ``MLPSyncBatchInfo.all_gather`` (``managers/scheduler_dp_attn_mixin.py``)
hard-codes a row of 6 columns in its buffer and its views, so a seventh
column cannot ride through it as on 0.5.23: :func:`all_gather` replaces it,
the same gather and the same reads with the width taken from the row, plus
the vote settled from the seventh column. The rows are rebuilt with the vote
in the same ``torch.tensor`` call (no allocation beyond stock's);
``tests/inprocess/test_dp_vote.py`` checks them against SGLang's own, column for column.

``PATCHES``: the gather replaced, and ``prepare_mlp_sync_batch_raw`` wrapped
to cast the vote (``hooks.dp_cast_wrapper``).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from eagle_gate.adapters.dp_vote import DPVote, row
from eagle_gate.adapters.hooks import dp_cast_wrapper, replaced_by
from eagle_gate.adapters.patching import PatchTarget

__all__ = ["ROW_FIELDS", "VOTE", "PATCHES", "local_row", "fallback_row", "all_gather"]

#: 0.5.9's row, in its column order (``_get_local_tensor``).
ROW_FIELDS = (
    "num_tokens",
    "num_tokens_for_logprob",
    "can_cuda_graph",
    "is_extend_in_batch",
    "local_can_run_tbo",
    "local_forward_mode",
)
WIDTH = len(ROW_FIELDS) + 1
_ROW_VALUES = attrgetter(*ROW_FIELDS)

VOTE = DPVote()  # this scheduler process's

#: whether this version gates DP attention (else it is refused at launch):
#: a real DP-attention server ran the vote end to end on CPU
#: (tests/servers/test_dp_attention_cpu.py).
GATES_DP_ATTENTION = True


def fallback_row(info: Any, device: Any, dtype: Any = None) -> Any:
    """0.5.9's ``_get_fallback_tensor`` (an inactive rank), voting idle."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return row([0, 0, 1, 0, 1, ForwardMode.IDLE.value, 0], device, dtype)


def local_row(info: Any, device: Any, dtype: Any = None) -> Any:
    """0.5.9's ``_get_local_tensor``, this rank's vote in a 7th column."""
    return row((*_ROW_VALUES(info), VOTE.local), device, dtype)


def all_gather(info: Any, device: Any, group: Any) -> None:
    """0.5.9's ``MLPSyncBatchInfo.all_gather`` at the row's width, then the
    vote settled from the last column of the DP ranks' attention-TP rank 0."""
    import torch
    from sglang.srt.managers import scheduler_dp_attn_mixin as mixin

    local = local_row(info, device)
    rows = info.dp_size * info.tp_size * info.cp_size
    gathered = torch.empty(
        (info.dp_size, info.tp_size * info.cp_size, WIDTH),
        dtype=torch.int64,
        device=device,
    )
    torch.distributed.all_gather_into_tensor(gathered.flatten(), local, group=group)
    tp_group = mixin.get_tp_group()
    active = tp_group.active_ranks_cpu if device == "cpu" else tp_group.active_ranks
    gathered.view(rows, WIDTH)[active == 0] = fallback_row(info, device)
    tp0 = gathered[:, 0, :]
    info.tp0_info = tp0  # SGLang reads columns 4:6 of it (TBO); the vote is last
    info.global_num_tokens = tp0[:, 0].tolist()
    info.global_num_tokens_for_logprob = tp0[:, 1].tolist()
    info.can_cuda_graph = bool(tp0[:, 2].min().item())
    info.is_extend_in_batch = bool(tp0[:, 3].max().item())
    if mixin._ENABLE_METRICS_DP_ATTENTION:
        info.dp_cooperation_info = mixin.DPCooperationInfo.create(tp0[:, 5].tolist())
    VOTE.settle(tp0[:, WIDTH - 1].tolist())


DP_MODULE = "sglang.srt.managers.scheduler_dp_attn_mixin"
PATCHES = (
    (
        PatchTarget(
            DP_MODULE, "MLPSyncBatchInfo.all_gather", ("self", "device", "group")
        ),
        replaced_by(all_gather),
    ),
    (
        PatchTarget(
            DP_MODULE, "prepare_mlp_sync_batch_raw", ("local_batch", "dp_size")
        ),
        dp_cast_wrapper(VOTE),
    ),
)
