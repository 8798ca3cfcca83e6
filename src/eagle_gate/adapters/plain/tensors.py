"""Tensor helpers of the plain step: the flat speculative layout and the
attribute swaps around a forward.

All are pure tensor ops or attribute juggling: no device synchronisation, and
nothing that depends on the SGLang version.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = [
    "DRAFT_MATCHES_ATTR",
    "flat_plain_tokens",
    "mark_draft_matches",
    "read_draft_matches",
    "kv_slots",
    "spread_rows",
    "eager_target",
    "swap_attrs",
]

#: set on a plain step's result that carries draft matches (its value: the
#: stride), read by the resolver wrapper once the tokens are on the CPU.
DRAFT_MATCHES_ATTR = "eagle_gate_draft_matches"

_MISSING = object()


def flat_plain_tokens(next_token_ids: Any, stride: int) -> tuple[Any, Any]:
    """One token per request -> (flat ``bs*stride`` int32 tokens, int32 ones).

    The flat speculative layout every spec-v2 resolver reads: request i's token
    at ``i * stride``; the other slots are padding the resolver never reads
    because every accept length is 1.
    """
    import torch

    flat = spread_rows(next_token_ids.to(torch.int32), stride)
    ones = torch.ones(next_token_ids.shape[0], dtype=torch.int32, device=flat.device)
    return flat, ones


def mark_draft_matches(
    result: Any, tokens: Any, draft_input: Any, hot_token_id: Any, stride: int
) -> None:
    """Write, per request, whether the draft's top proposal for this position
    equals the target's new token into the first padding slot of the flat
    tokens (``i * stride + 1``), and tag ``result``.

    The proposal is ``draft_input.topk_index[:, 0]`` in the target's
    vocabulary (``hot_token_id``: the draft's reduced-vocabulary map, as
    ``draft_forward`` applies it): the first token a SPEC step would have
    drafted, so the flag is exactly "a SPEC step would have accepted its first
    draft token" for a greedy target. The flags ride on the D2H copy the
    scheduler already makes of the tokens (no sync here); the resolver never
    reads padding slots (every accept length is 1). Needs ``stride >= 2``.
    """
    proposals = draft_input.topk_index[:, 0]
    if hot_token_id is not None:
        proposals = hot_token_id[proposals]
    result.next_token_ids[1::stride] = tokens == proposals
    setattr(result, DRAFT_MATCHES_ATTR, stride)


def read_draft_matches(result: Any) -> int | None:
    """The draft matches a resolved plain step carries (its tokens are on the
    CPU by then), or None when it carries none."""
    stride = getattr(result, DRAFT_MATCHES_ATTR, 0)
    if not stride:
        return None
    return int(result.next_token_ids[1::stride].sum())


def kv_slots(req_to_token: Any, req_pool_indices: Any, start: Any, width: int):
    """KV slot ids of positions ``start .. start+width-1`` of each request,
    flattened request-major (int64). Pure tensor ops: no device sync."""
    import torch

    offsets = torch.arange(width, device=start.device, dtype=start.dtype)
    cols = start[:, None] + offsets[None, :]
    return req_to_token[req_pool_indices[:, None], cols].reshape(-1).to(torch.int64)


def spread_rows(rows: Any, stride: int):
    """``[bs, ...]`` -> ``[bs*stride, ...]`` with row i at ``i*stride``, zeros
    elsewhere: a plain step's per-request tensors in the flat verify layout."""
    import torch

    out = torch.zeros(
        (rows.shape[0] * stride, *rows.shape[1:]), dtype=rows.dtype, device=rows.device
    )
    out[::stride] = rows
    return out


class eager_target:
    """Run the target without its CUDA graphs for one forward.

    With speculation on, the target's graphs are captured for TARGET_VERIFY
    and their ``can_run`` checks do not look at the forward mode, so a DECODE
    forward of a captured batch size would replay the verify graph with the
    wrong layout. ``attribute``: where the version keeps that graph runner.
    """

    def __init__(self, model_runner: Any, attribute: str = "graph_runner") -> None:
        self.model_runner = model_runner
        self.attribute = attribute

    def __enter__(self) -> None:
        self.saved = getattr(self.model_runner, self.attribute)
        setattr(self.model_runner, self.attribute, None)

    def __exit__(self, *exc: Any) -> None:
        setattr(self.model_runner, self.attribute, self.saved)


@contextlib.contextmanager
def swap_attrs(obj: Any, **values: Any):
    """Set attributes of ``obj`` for the ``with`` block and put the old values
    back in ``finally`` (an attribute that did not exist is deleted again)."""
    saved = [(name, getattr(obj, name, _MISSING)) for name in values]
    try:
        for name, value in values.items():
            setattr(obj, name, value)
        yield obj
    finally:
        for name, value in reversed(saved):
            if value is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, value)
