"""Lazy draft sync: plain steps leave the draft alone and keep what it would
have consumed; one batched draft extend catches it up before the next SPEC
step (``--gate-draft-sync lazy``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from eagle_gate.adapters.plain.tensors import kv_slots

logger = logging.getLogger("eagle_gate")

__all__ = ["LazyDraftSync"]


class LazyDraftSync:
    """``draft_sync = "lazy"``: plain steps leave the draft alone but keep, per
    request, the (new token, target hidden state) pairs the draft would have
    consumed; when the request next runs SPEC, one batched draft extend over
    its gap catches the draft up first.

    The draft extend SGLang provides covers ``num_draft_tokens`` positions per
    request, so the buffer holds that many pairs per request slot (a ring over
    positions): a gap up to that long is caught up whole; a longer one on its
    most recent positions, and the older ones stay stale (acceptance may dip;
    outputs cannot change, verify decides them). Memory: ``rows x width x
    hidden`` of the target's hidden dtype, allocated at the first plain step
    and logged then.

    Bookkeeping is on the CPU, keyed by the request's ``req_pool_idx`` and
    ``rid`` (a reused slot starts clean), and read from ``seq_lens_cpu``: no
    device synchronisation.
    """

    def __init__(self, row_of: Callable[[Any], int]) -> None:
        #: a request's ``req_to_token`` row (where each version keeps it).
        self.row_of = row_of
        self.width = 0
        self.hidden: Any = None
        self.tokens: Any = None
        #: req_pool_idx -> [rid, first gap position, gap length]
        self.gaps: dict[int, list] = {}
        self.bytes = 0
        self.catch_ups = 0

    def record(self, worker: Any, batch: Any, new_tokens: Any, hidden: Any) -> None:
        """After a plain step: keep each request's (new token, hidden) pair."""
        import torch

        if self.hidden is None:
            rows = int(worker.req_to_token_pool.req_to_token.shape[0])
            self.width = int(worker.speculative_num_draft_tokens)
            self.hidden = torch.zeros(
                (rows, self.width, hidden.shape[-1]),
                dtype=hidden.dtype,
                device=hidden.device,
            )
            self.tokens = torch.zeros(
                (rows, self.width), dtype=torch.int64, device=hidden.device
            )
            self.bytes = (
                self.hidden.numel() * self.hidden.element_size()
                + self.tokens.numel() * self.tokens.element_size()
            )
            logger.info(
                "eagle_gate: lazy draft-sync buffer: %d request slots x %d positions "
                "x %d hidden = %.1f MiB",
                rows,
                self.width,
                hidden.shape[-1],
                self.bytes / 2**20,
            )
        rows = batch.req_pool_indices
        slots = torch.remainder(batch.seq_lens, self.width)
        self.hidden[rows, slots] = hidden
        self.tokens[rows, slots] = new_tokens.to(torch.int64)
        for req, pos in zip(batch.reqs, batch.seq_lens_cpu.tolist(), strict=True):
            row = self.row_of(req)
            gap = self.gaps.get(row)
            if gap is None or gap[0] != req.rid or gap[1] + gap[2] != pos:
                self.gaps[row] = [req.rid, pos, 1]
            else:
                gap[2] += 1

    def window(self, batch: Any) -> tuple[list[int], list[int], list[bool]] | None:
        """Per request: catch-up window start, valid length, and whether it has
        a gap ending at its current length; None when nobody has one."""
        starts, lengths, mask = [], [], []
        for req, pos in zip(batch.reqs, batch.seq_lens_cpu.tolist(), strict=True):
            gap = self.gaps.get(self.row_of(req))
            if gap is not None and gap[0] == req.rid and gap[1] + gap[2] == pos:
                length = min(gap[2], self.width)
                starts.append(pos - length)
                lengths.append(length)
                mask.append(True)
            else:
                starts.append(pos)
                lengths.append(1)
                mask.append(False)
        return (starts, lengths, mask) if any(mask) else None

    def forget(self, batch: Any) -> None:
        """A SPEC step ran for these requests: their gaps are closed."""
        for req in batch.reqs:
            self.gaps.pop(self.row_of(req), None)

    def catch_up(
        self,
        worker: Any,
        batch: Any,
        draft_extend: Callable[[Any, Any, Any], None],
    ) -> bool:
        """Before a SPEC step: one batched draft extend over every request's
        gap (``draft_extend(worker, batch, result)`` is the version's call of
        SGLang's ``_draft_extend_for_decode``, into an empty
        ``EagleDraftInput``, a class both versions keep in
        ``speculative.eagle_info``), then the caught-up rows of the next draft
        input replace the zero-filled ones. The batch is restored
        field by field afterwards. Returns whether a catch-up ran."""
        import dataclasses
        import types

        import torch

        if self.hidden is None or batch.seq_lens_cpu is None:
            return False
        plan = self.window(batch)
        if plan is None:
            self.forget(batch)
            return False
        starts, lengths, mask = plan
        device = batch.seq_lens.device
        width = self.width
        start_t = torch.tensor(starts, dtype=batch.seq_lens.dtype, device=device)
        length_t = torch.tensor(lengths, dtype=torch.int32, device=device)
        offsets = torch.arange(width, device=device)
        slots = torch.remainder(start_t[:, None] + offsets[None, :], width)
        rows = batch.req_pool_indices[:, None]
        valid = offsets[None, :] < length_t[:, None]
        tokens = torch.where(valid, self.tokens[rows, slots], 0).reshape(-1)
        hidden = (self.hidden[rows, slots] * valid[..., None]).reshape(
            -1, self.hidden.shape[-1]
        )
        spec = batch.spec_info
        saved = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        result = GenerationBatchResult(
            logits_output=types.SimpleNamespace(hidden_states=hidden),
            next_token_ids=tokens.to(torch.int32),
            accept_lens=length_t,
            next_draft_input=EagleDraftInput(),
        )
        result.new_seq_lens = start_t + length_t
        try:
            batch.seq_lens = start_t
            batch.seq_lens_cpu = torch.tensor(starts, dtype=torch.int64)
            batch.seq_lens_sum = sum(starts)
            batch.out_cache_loc = kv_slots(
                worker.req_to_token_pool.req_to_token,
                batch.req_pool_indices,
                start_t,
                width,
            )
            draft_extend(worker, batch, result)
        finally:
            for name, value in saved.items():
                setattr(batch, name, value)
        caught = result.next_draft_input
        chosen = torch.tensor(mask, device=device)[:, None]
        spec.topk_p = torch.where(chosen, caught.topk_p, spec.topk_p)
        spec.topk_index = torch.where(chosen, caught.topk_index, spec.topk_index)
        if spec.hidden_states is not None and caught.hidden_states is not None:
            spec.hidden_states = torch.where(
                chosen, caught.hidden_states, spec.hidden_states
            )
        self.forget(batch)
        self.catch_ups += 1
        return True
