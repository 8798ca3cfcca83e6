"""Does the plain step keep a draft TREE (topk > 1) exact? Measured, not assumed.

Issue #22: the gate refuses draft trees, because nobody had measured whether
a tree's draft state stays exact across PLAIN stretches. This script measures
it on SGLang 0.5.23's real CPU EAGLE-3 servers (0.5.9's spec v2 runs chains
only), with the trained tiny draft, in the paired way of
``tests/servers/test_spec_e2e.py::test_draft_state_after_plain_stretches``, except
that the oracle is SGLang itself instead of an offline chain:

* a stock speculative server (no gate) with the same tree shape answers, for
  each request ``r`` and each committed count ``k``, what the first SPEC step
  accepts from a *fresh* state: ``prompt + output[:k-1]`` prefilled (its
  prefill samples ``output[k-1]`` and runs the draft extend over the whole
  history, which is the correct draft state by construction), then one
  decode step, whose correct drafts the request's ``meta_info`` reports
  (``spec_num_correct_drafts``, counted before ``max_new_tokens`` truncates);
* a gated server (the refusal lifted by ``tests/support/tree_lift``) runs the
  requests as one batch through PLAIN stretches of 1, 2, 4 and 8 steps with
  eager draft sync, and its decision log gives every SPEC step's accept
  length;
* each SPEC step is paired with the oracle at the same ``(r, k)``. A plain
  step that keeps the tree's draft KV and next draft input exact gives the
  same accept length at (nearly) every step after a stretch as after a SPEC
  step; a stale one gives fewer.

Run with the 0.5.23 environment (about 10 minutes on two cores)::

    EAGLE_GATE_MODEL_CACHE=build/test-models PYTHONPATH=tests \\
        .venv-0.5.23/bin/python scripts/measure_tree_draft.py

``--sync none`` is the positive control (the draft's next input zero-filled,
its KV stale): the share of differing steps after a stretch must rise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from support.draft_state import Tally, match_columns, spec_steps, tally
from support.gated_server import (
    decision_records,
    generate_many,
    install_test_plugins,
    scheduler_status,
    set_policy,
    with_pythonpath,
)
from support.model_cache import spec_models
from support.server import free_port, running_server
from support.spec_server import (
    SHAPE_FLAGS,
    spec_server_args,
    spec_server_env,
    without_shape,
)

REPO = Path(__file__).resolve().parents[1]
LIFT = REPO / "tests" / "support" / "tree_lift"
STRETCHES = (2, 1, 4, 8)
SPEC_BETWEEN = 4
REQUESTS = 8
PROMPTS = [
    [1] + [(37 * i + 11 * k) % 900 + 4 for k in range(24)] for i in range(REQUESTS)
]


def tree_args(argv: list[str], steps: int | None, topk: int | None, tokens: int | None):
    """The spec server's command line with the chain shape flags replaced:
    ``None`` everywhere drops them (SGLang then chooses its own shape)."""
    out = without_shape(argv)
    for flag, value in zip(SHAPE_FLAGS, (steps, topk, tokens), strict=True):
        if value is not None:
            out += [flag, str(value)]
    return out


def pattern() -> str:
    parts = [f"s{SPEC_BETWEEN + 2}"]
    for n in STRETCHES:
        parts += [f"p{n}", f"s{SPEC_BETWEEN}"]
    return ",".join(parts)


class Oracle:
    """Accept lengths from a fresh state, as ``support.draft_state`` reads an
    offline draft (``rows`` and ``accept(request, committed)``)."""

    def __init__(self, outputs: list[list[int]]) -> None:
        self.rows = outputs
        self.table: dict[tuple[int, int], int] = {}

    def accept(self, request: int, committed: int) -> int | None:
        return self.table.get((request, committed))


def ask_oracle(base_url: str, oracle: Oracle, wanted: set[tuple[int, int]], width: int):
    """Fill ``oracle.table`` at ``wanted`` ``(r, k)`` it lacks, ``width``
    requests at a time."""
    todo = sorted(wanted - set(oracle.table))
    for i in range(0, len(todo), width):
        chunk = todo[i : i + width]
        reqs = [(PROMPTS[r] + oracle.rows[r][: k - 1], 2) for r, k in chunk]
        for (r, k), res in zip(chunk, generate_many(base_url, reqs), strict=True):
            meta = res["meta_info"]
            assert res["output_ids"] == oracle.rows[r][k - 1 : k + 1], (r, k)
            assert meta.get("spec_verify_ct") == 1, meta
            oracle.table[(r, k)] = int(meta["spec_num_correct_drafts"]) + 1


def row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def show(label: str, t: Tally) -> None:
    share = f"{t.differ} ({t.share:.0%})"
    row(label, t.n, share, f"{t.server_mean:.2f}", f"{t.offline_mean:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="auto", help="auto, or steps,topk,tokens")
    parser.add_argument("--sync", default="eager", choices=("eager", "none"))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--work", type=Path, default=REPO / "build" / "tree-draft")
    args = parser.parse_args()
    shape = (
        (None, None, None)
        if args.shape == "auto"
        else tuple(int(x) for x in args.shape.split(","))
    )
    cache = Path(
        os.environ.get("EAGLE_GATE_MODEL_CACHE", REPO / "build" / "test-models")
    )
    target, draft, _ = spec_models(cache)
    work = args.work / f"{args.shape.replace(',', '-')}-{args.sync}"
    work.mkdir(parents=True, exist_ok=True)
    plugins = install_test_plugins(work / "plugins")
    t0 = time.monotonic()

    # 1. the gated run: PLAIN stretches, decision log
    port = free_port()
    gate_args = [
        "--gate-policy", "never", "--gate-draft-sync", args.sync,
        "--gate-decision-log", str(work / "decisions"),
        "--gate-status-dir", str(work / "status"),
    ]  # fmt: skip
    argv = tree_args(
        spec_server_args(target, draft, port, launcher="gate", gate_args=gate_args),
        *shape,
    )
    env = spec_server_env(
        launcher="gate",
        EAGLE_GATE_CONTROL_EVERY="1",
        EAGLE_GATE_OPS_INTERVAL_S="0.2",
        EAGLE_GATE_DECISION_LOG_RATE="100000",
        SGLANG_IS_IN_CI="1",
    )
    env = with_pythonpath(with_pythonpath(env, plugins), LIFT)
    with running_server(
        argv, port, env, work / "gated.log", ready_timeout_s=600
    ) as srv:
        start = scheduler_status(srv.base_url)
        print(f"gated server: {start.get('speculative')}", flush=True)
        set_policy(srv.base_url, "schedule", pattern=pattern(), repeat=True)
        gated = generate_many(srv.base_url, [(p, args.new_tokens) for p in PROMPTS])
        end = scheduler_status(srv.base_url)
        time.sleep(1.0)
    first = int(start["step"])
    records = sorted(
        (r for r in decision_records(work / "decisions") if r.get("step", -1) >= first),
        key=lambda r: r["step"],
    )
    outcomes = [r for r in records if r["kind"] == "outcome"]
    plain = end["steps"]["plain"] - start["steps"]["plain"]
    print(
        f"gated run: {len(outcomes)} steps, plain {plain}, failures "
        f"{end['plain_step_failures']}, {time.monotonic() - t0:.0f} s",
        flush=True,
    )

    # 2. the oracle: a stock server with the same shape, fresh states
    port = free_port()
    argv = tree_args(spec_server_args(target, draft, port), *shape)
    env = spec_server_env()
    outputs = [g["output_ids"] for g in gated]
    oracle = Oracle(outputs)
    steps = spec_steps(outcomes)
    wanted = {
        (r, s.committed)
        for s in steps
        for r in range(REQUESTS)
        if 1 <= s.committed <= args.new_tokens - 2
    }
    # fresh states depend on the shape and the greedy outputs only: kept
    # between runs (the control run asks for few new ones)
    saved = args.work / f"oracle-{args.shape.replace(',', '-')}-{args.new_tokens}.json"
    if saved.exists():
        known = json.loads(saved.read_text())
        if known["outputs"] == outputs:
            oracle.table = {(r, k): a for r, k, a in known["table"]}
    with running_server(
        argv, port, env, work / "oracle.log", ready_timeout_s=600
    ) as srv:
        reference = generate_many(srv.base_url, [(p, args.new_tokens) for p in PROMPTS])
        same = sum(
            a["output_ids"] == b for a, b in zip(reference, outputs, strict=True)
        )
        print(
            f"token identity, gated vs stock tree server: {same}/{REQUESTS}", flush=True
        )
        ask_oracle(srv.base_url, oracle, wanted, width=16)
    table = [[r, k, a] for (r, k), a in sorted(oracle.table.items())]
    saved.write_text(json.dumps({"outputs": outputs, "table": table}))
    print(f"oracle: {len(oracle.table)} fresh states, {time.monotonic() - t0:.0f} s")

    match_columns(steps, oracle)
    by = tally(steps)
    untouched = Tally(
        [s for s in steps if s.offline is not None and not s.plain_so_far]
    )
    since = Tally([s for s in steps if s.offline is not None and s.plain_so_far])
    print(f"\n{start['speculative']['describe']}, draft sync {args.sync}\n")
    row("SPEC step right after", "steps", "differ from fresh", "accept", "fresh")
    row(*["---"] * 5)
    for key in ("spec", *sorted(k for k in by if isinstance(k, int)), "all"):
        label = {"spec": "a SPEC step", "all": "all"}.get(key, f"{key} PLAIN steps")
        show(label, by[key])
    show("(before any stretch)", untouched)
    show("(after the first stretch)", since)
    return 0


if __name__ == "__main__":
    sys.exit(main())
