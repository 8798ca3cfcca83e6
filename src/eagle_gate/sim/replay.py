"""Replay a gate's decision log through a policy: ``python -m eagle_gate.sim replay``.

A gated server started with ``--gate-decision-log DIR`` writes, per scheduler
process, a JSON-lines file of the views it decided on and the outcomes it
observed, in the order they happened (format: :mod:`eagle_gate.decision_log`).
Replaying feeds the same views and outcomes, in the same order, to a policy and
reports what it would have decided: the logged policy reproduces its own
decisions (a check that the log is complete), and another policy shows where it
would have chosen differently on the same traffic. It is counterfactual only in
the decisions: the outcomes are the ones the server really produced.

A shadow log (``--gate-shadow``: every step ran SGLang's stock SPEC step, the
decisions say what the policy would have run) replays into the same
comparison the live status shows: would-have decisions by mode and the
throughput the replayed policy estimates it would have gained
(:class:`eagle_gate.shadow.ShadowLedger`, over the steps that ran SPEC).

Under tensor parallelism the log holds each rank's local intervals, while the
live policy saw rank 0's (released in batches); replay rank 0's log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from eagle_gate.policy import Mode, Policy, StepOutcome, StepView
from eagle_gate.shadow import ShadowLedger, predicted_plain_rate

__all__ = ["ReplayResult", "read_log", "replay"]

_MODES = {"spec": Mode.SPEC, "plain": Mode.PLAIN}


@dataclass
class ReplayResult:
    """What the replayed policy decided, against what the log says."""

    decisions: int = 0
    #: decisions where the log has a policy answer (``spec`` or ``plain``).
    comparable: int = 0
    agreed: int = 0
    by_mode: dict[str, int] = field(default_factory=lambda: {"spec": 0, "plain": 0})
    logged_by_mode: dict[str, int] = field(
        default_factory=lambda: {"spec": 0, "plain": 0}
    )
    outcomes: int = 0
    policy_errors: int = 0
    #: steps where the replayed policy differed from the log (first 20).
    first_differences: list[tuple[int, str, str]] = field(default_factory=list)
    #: decisions the log marks as shadow mode (the server ran stock SPEC).
    shadow_decisions: int = 0
    #: what the replayed policy would have run on the steps that ran SPEC, and
    #: the throughput it estimates that would have gained.
    shadow: ShadowLedger = field(default_factory=ShadowLedger)

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.comparable if self.comparable else None


def read_log(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of one decision-log file, in file order."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not a JSON record: {exc}") from None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def replay(records: Iterable[dict[str, Any]], policy: Policy) -> ReplayResult:
    """Feed the logged views and outcomes to ``policy``, in log order."""
    result = ReplayResult()
    view = StepView()
    predict = predicted_plain_rate(policy)
    ledger = result.shadow
    for record in records:
        kind = record.get("kind")
        if kind == "start":
            view.num_draft_tokens = int(record.get("num_draft_tokens") or 1)
            view.tp_rank = int(record.get("tp_rank") or 0)
            view.tp_size = int(record.get("tp_size") or 1)
        elif kind == "decision":
            result.decisions += 1
            view.update(
                batch_size=int(record["batch_size"]),
                step=int(record["step"]),
                seq_len_sum=_int_or_none(record.get("seq_len_sum")),
                exact=bool(record.get("seq_lens_exact", True)),
            )
            try:
                mode = policy.decide(view)
            except Exception:
                result.policy_errors += 1
                continue
            name = "plain" if mode is Mode.PLAIN else "spec"
            result.by_mode[name] += 1
            if record.get("override") == "shadow":
                result.shadow_decisions += 1
            if record.get("ran", "spec") == "spec":
                ledger.decided(view.step, mode is Mode.PLAIN, predict, view)
            logged = record.get("decided")
            if logged in _MODES:
                result.comparable += 1
                result.logged_by_mode[logged] += 1
                if logged == name:
                    result.agreed += 1
                elif len(result.first_differences) < 20:
                    result.first_differences.append((int(record["step"]), logged, name))
        elif kind == "outcome":
            result.outcomes += 1
            lens = list(record["accept_lens"])
            if record["mode"] == "spec":
                ledger.resolved(
                    int(record["step"]), sum(lens), record.get("interval_s")
                )
            policy.observe(
                StepOutcome(
                    mode=_MODES[record["mode"]],
                    batch_size=len(lens),
                    tokens=sum(lens),
                    accept_lens=lens,
                    interval_s=record.get("interval_s"),
                    step=int(record["step"]),
                    draft_matches=record.get("draft_matches"),
                )
            )
    return result


def main(argv: list[str]) -> int:
    import argparse

    from eagle_gate.config import ConfigError, resolve_config

    ap = argparse.ArgumentParser(
        prog="python -m eagle_gate.sim replay",
        description="Replay a gate decision log (JSON lines) through a policy.",
    )
    ap.add_argument("log", help="a decisions-<pid>.jsonl file")
    ap.add_argument("--policy", help="policy to replay (default: the logged one)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    records = list(read_log(args.log))
    start = next((r for r in records if r.get("kind") == "start"), {})
    name = args.policy or start.get("policy")
    if not name:
        ap.error("the log has no start record naming its policy; pass --policy")
    sets = list(args.set)
    if not args.policy:
        sets = [f"{k}={v}" for k, v in (start.get("settings") or {}).items()] + sets
    try:
        policy = resolve_config(environ={}, cli_policy=name, cli_sets=sets)
        policy = policy.create_policy()
    except ConfigError as exc:
        print(f"eagle_gate: {exc}")
        return 2
    result = replay(records, policy)
    share = result.agreement
    print(f"replayed {result.decisions} decisions and {result.outcomes} outcomes")
    spec, plain = result.by_mode["spec"], result.by_mode["plain"]
    print(f"policy {name!r}: spec {spec}, plain {plain}")
    print(
        f"logged: spec {result.logged_by_mode['spec']}, "
        f"plain {result.logged_by_mode['plain']}; agreement "
        + ("n/a" if share is None else f"{share:.1%}")
    )
    for step, logged, now in result.first_differences[:5]:
        print(f"  step {step}: logged {logged}, replayed {now}")
    totals = result.shadow.snapshot()
    gain = totals["estimated_gain"]
    if result.shadow_decisions:
        print(
            f"shadow log: {result.shadow_decisions} decisions ran SGLang's stock "
            "SPEC step"
        )
    print(
        f"on the steps that ran SPEC, {name!r} would run: spec "
        f"{totals['would_run']['spec']}, plain {totals['would_run']['plain']}; "
        "estimated throughput gain "
        + ("unknown" if gain is None else f"{gain:+.1%}")
        + f" ({totals['plain_estimated']} would-PLAIN steps timed with the "
        f"policy's predicted PLAIN rate, {totals['plain_without_estimate']} "
        "without one)"
    )
    return 0
