"""Tensor-parallel agreement on the one input that differs between ranks.

Under tensor parallelism every rank runs its own scheduler and its own gate,
and all ranks must take the same branch in the same step or their collectives
deadlock. Batch sizes, steps and accept lengths agree by construction; wall
clock intervals do not. So with ``tp_size > 1`` the gate does not hand a
policy its local timings. It holds each resolved outcome back, and every
``every`` decode steps all ranks exchange, in one small broadcast from rank 0
over the CPU process group, rank 0's intervals for the held outcomes; then
every rank delivers the same outcomes, with rank 0's intervals, in the same
order, before the same decision. Policies therefore see identical inputs on
every rank, at the price of outcomes arriving up to ``every`` steps late,
and the gate adds one collective per ``every`` steps, never one per step.

This module holds no SGLang or torch: the adapters hand it a ``broadcast``
function (rank 0's list in, the same list out on every rank).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TimingAgreement", "DEFAULT_EVERY", "torch_min_agreement"]

#: decode steps between two agreements (one broadcast each).
DEFAULT_EVERY = 16


class TimingAgreement:
    """Holds outcomes back and releases them with rank 0's timings."""

    def __init__(
        self,
        broadcast: Callable[[list[Any]], list[Any]] | None,
        *,
        every: int = DEFAULT_EVERY,
    ) -> None:
        """``broadcast=None``: no process group to agree over; outcomes are
        then released with no interval at all, which still keeps ranks equal."""
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every!r}")
        self.broadcast = broadcast
        self.every = every
        self._held: list[tuple] = []
        self.rounds = 0

    def hold(
        self,
        mode: Any,
        step: int,
        accept_lens: Any,
        interval: float | None,
        draft_matches: int | None = None,
        depth: int | None = None,
    ):
        """Keep one resolved outcome until the next agreement. ``draft_matches``
        and ``depth`` travel as they are: every rank counts them from the same
        sampled tokens and ran the same depth."""
        self._held.append((mode, step, accept_lens, interval, draft_matches, depth))

    def due(self, step: int) -> bool:
        """Whether the decision at ``step`` is preceded by an agreement."""
        return step % self.every == 0

    def release(self) -> list[tuple]:
        """Agree and return the held outcomes, ``(mode, step, accept_lens,
        interval, draft_matches, depth)``, with rank 0's intervals.

        Every rank must call this at the same step. The number of held
        outcomes is the same on every rank (results are resolved at the same
        point of the same scheduler iteration); it travels with the intervals
        and is checked, so a mismatch fails loudly instead of diverging.
        """
        held, self._held = self._held, []
        if self.broadcast is None:
            return [(m, step, lens, None, dm, d) for m, step, lens, _, dm, d in held]
        mine = [len(held)] + [item[3] for item in held]
        agreed = self.broadcast(mine)
        if agreed[0] != len(held):
            raise RuntimeError(
                f"eagle_gate TP agreement: rank 0 held {agreed[0]} outcomes, this "
                f"rank {len(held)}; ranks are no longer in step"
            )
        self.rounds += 1
        return [
            (mode, step, lens, interval, dm, depth)
            for (mode, step, lens, _, dm, depth), interval in zip(
                held, agreed[1:], strict=True
            )
        ]


def torch_timing_broadcast(cpu_group: Any) -> Callable[[list[Any]], list[Any]]:
    """Rank 0's ``[count, interval...]`` to every rank over a gloo CPU group.

    Two small collectives per agreement: the count (int64), then the
    intervals (float64, NaN for None). Imports torch only when called.
    """
    import math

    import torch
    import torch.distributed as dist

    src = dist.get_global_rank(cpu_group, 0)
    count = torch.zeros(1, dtype=torch.int64)

    def broadcast(values: list[Any]) -> list[Any]:
        count[0] = values[0]
        dist.broadcast(count, src=src, group=cpu_group)
        n = int(count[0])
        mine = [math.nan if v is None else float(v) for v in values[1:]]
        intervals = torch.tensor((mine + [math.nan] * n)[:n], dtype=torch.float64)
        if n:
            dist.broadcast(intervals, src=src, group=cpu_group)
        return [n] + [None if math.isnan(v) else v for v in intervals.tolist()]

    return broadcast


def torch_min_agreement(cpu_group: Any) -> Callable[[bool], bool]:
    """``agree(ok) -> all ranks ok``: a MIN all-reduce of one int64 over a gloo
    CPU group (the attention-TP group), so every rank takes the same start-up
    branch (plain-step CUDA graphs: capture on all ranks or on none). Every
    rank must call it the same number of times. Imports torch only when called.
    """
    import torch
    import torch.distributed as dist

    def agree(ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=cpu_group)
        return bool(int(flag[0]))

    return agree
