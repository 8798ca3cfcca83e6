"""The draft's state in a live server, step by step, against the draft itself.

Greedy verification makes a server's output tokens the same whatever its
draft proposes, so only acceptance shows a draft that went out of step. An
average accept length is a weak witness (the trained tiny draft accepts about
1.65 tokens a step against 1.0 with no history, and averages over few steps
are noisy). This module compares each request's every SPEC step with what the
same draft proposes offline from the whole, correct history, as
``support.trained_draft`` computes it (SGLang's EAGLE-3 forward in plain
torch, checked against incremental extend + decode in
``tests/inprocess/test_trained_draft.py``):

* the offline accept length at a request's state (``k`` output tokens
  committed) is ``1 +`` the number of leading draft tokens of the chain
  anchored at its last committed token that equal the target's greedy
  continuation (the reference output);
* a server whose draft KV and next draft input are exactly what SGLang's own
  speculative steps would have left gets the same accept length at every
  step, up to float rounding (Triton's interpreted attention against torch's
  on near-tied logits), so the share of steps that differ is ~0;
* a draft that missed or misread positions (a skipped draft extend, a stale
  hidden state, KV never written) proposes other chains at the steps that
  read those positions: the share that differs rises, both right after the
  stretch and later (stale KV stays stale).

The decision log's ``outcome`` records give, per step, the mode and every
request's accept length in batch order; a request's committed count follows
from them (``+accept`` after SPEC, ``+1`` after PLAIN; 1 after prefill). The
batch's columns are matched to the requests by agreement (a request's own
predictions agree at nearly every step, another's at chance level).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

STEPS = 3  # draft steps per chain (== --speculative-num-steps)


class OfflineDraft:
    """Offline accept lengths of the trained draft on known sequences.

    ``prompts[r] + outputs[r]`` is request ``r``'s whole sequence (the
    reference server's greedy output)."""

    def __init__(
        self,
        target_dir: Path | str,
        draft_dir: Path | str,
        prompts: Sequence[Sequence[int]],
        outputs: Sequence[Sequence[int]],
    ) -> None:
        import torch

        from support import trained_draft as td

        target = td.TinyTarget(target_dir)
        draft = td.load_draft(draft_dir)
        rows = [list(p) + list(o) for p, o in zip(prompts, outputs, strict=True)]
        self.prompt_lens = [len(p) for p in prompts]
        self.rows = rows
        self.preds: list[list[list[int]]] = []
        with torch.no_grad():
            for row in rows:  # lengths may differ: one at a time (tiny model)
                tokens = torch.tensor([row])
                _, aux, _ = target.forward(tokens)
                res = draft.ttt(tokens, aux, STEPS)
                self.preds.append(
                    [draft.head(normed)[0].argmax(-1).tolist() for normed in res]
                )

    def accept(self, request: int, committed: int) -> int | None:
        """Offline accept length of ``request``'s SPEC step with ``committed``
        output tokens before it, or None where the chain runs past the known
        sequence (the last steps of a request: capped by max_new_tokens)."""
        row, pred = self.rows[request], self.preds[request]
        anchor = self.prompt_lens[request] + committed - 2
        if anchor < 0 or anchor + STEPS + 1 > len(row) - 1:
            return None
        accept = 1
        for s in range(STEPS):
            if pred[s][anchor] != row[anchor + s + 2]:
                break
            accept += 1
        return accept


@dataclass
class Step:
    """One request's SPEC step as the server ran it."""

    column: int
    committed: int  # output tokens before the step
    plain_before: int  # PLAIN steps right before it (0: a SPEC step was)
    plain_so_far: int  # PLAIN steps of this request before it
    longest_gap: int  # its longest PLAIN stretch so far
    accept: int
    request: int = -1
    offline: int | None = None

    @property
    def differs(self) -> bool:
        return self.offline is not None and self.accept != self.offline


def spec_steps(outcomes: Sequence[dict]) -> list[Step]:
    """Every column's SPEC steps from ``outcome`` records in step order, while
    the batch only grows (a request that left ends the reading: columns would
    shift)."""
    committed: list[int] = []
    plain_run: list[int] = []
    plain_total: list[int] = []
    longest: list[int] = []
    steps: list[Step] = []
    for record in outcomes:
        lens = [int(a) for a in record["accept_lens"]]
        if len(lens) < len(committed):
            break
        while len(committed) < len(lens):  # a request joined (merged at the end)
            committed.append(1)  # its prefill produced the first token
            plain_run.append(0)
            plain_total.append(0)
            longest.append(0)
        for c, accept in enumerate(lens):
            if record["mode"] == "spec":
                steps.append(
                    Step(
                        c,
                        committed[c],
                        plain_run[c],
                        plain_total[c],
                        longest[c],
                        accept,
                    )
                )
                plain_run[c] = 0
            else:
                plain_run[c] += 1
                plain_total[c] += 1
                longest[c] = max(longest[c], plain_run[c])
            committed[c] += accept
    return steps


def match_columns(steps: list[Step], offline: OfflineDraft) -> dict[int, int]:
    """Column -> request, by most agreeing steps (greedy over the agreement
    table; each request once). Fills ``request`` and ``offline`` in."""
    columns = sorted({s.column for s in steps})
    n = len(offline.rows)
    table = {(c, r): 0 for c in columns for r in range(n)}
    for s in steps:
        for r in range(n):
            o = offline.accept(r, s.committed)
            table[(c := s.column, r)] += int(o == s.accept)
    chosen: dict[int, int] = {}
    for (c, r), _ in sorted(table.items(), key=lambda kv: -kv[1]):
        if c not in chosen and r not in chosen.values():
            chosen[c] = r
    for s in steps:
        s.request = chosen[s.column]
        s.offline = offline.accept(s.request, s.committed)
    return chosen


@dataclass
class Tally:
    """Paired comparison of a class of steps: how many, how many differ from
    the offline draft, and the mean accept length on each side."""

    steps: list[Step] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.steps)

    @property
    def differ(self) -> int:
        return sum(s.differs for s in self.steps)

    @property
    def share(self) -> float:
        return self.differ / self.n if self.n else float("nan")

    @property
    def server_mean(self) -> float:
        return sum(s.accept for s in self.steps) / self.n if self.n else float("nan")

    @property
    def offline_mean(self) -> float:
        vals = [s.offline for s in self.steps if s.offline is not None]
        return sum(vals) / len(vals) if vals else float("nan")

    @property
    def deficit(self) -> float:
        """Mean accept length the server lost against the offline draft."""
        return self.offline_mean - self.server_mean if self.n else float("nan")

    def describe(self) -> str:
        return (
            f"{self.differ}/{self.n} differ, accept {self.server_mean:.2f} "
            f"(offline {self.offline_mean:.2f})"
        )


def tally(steps: list[Step]) -> dict[int | str, Tally]:
    """Steps by what came right before: ``n`` (a PLAIN stretch of n steps),
    ``"spec"`` (a SPEC step) and ``"all"``. Steps whose offline answer is
    unknown (the chain runs past the reference) are left out."""
    out: dict[int | str, Tally] = {"spec": Tally(), "all": Tally()}
    for s in steps:
        if s.offline is None:
            continue
        out["all"].steps.append(s)
        key: int | str = s.plain_before if s.plain_before else "spec"
        out.setdefault(key, Tally()).steps.append(s)
    return out
