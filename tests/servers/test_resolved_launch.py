"""``python -m eagle_gate.launch`` judges what SGLang resolved (#22), on real
EAGLE-3 command lines (the tiny target, the trained draft, the CPU
speculative environment), to the point where the launch stops.

* No shape flags: SGLang's auto-chooser gives the Llama target a draft tree
  (5 steps, topk 4, 8 draft tokens) although the raw topk is None. 0.5.9:
  the gate refuses it before any model loads, saying what to pass instead.
  0.5.23 gates it with eager draft sync (a real tree server:
  ``tests/servers/test_spec_e2e.py::test_sglangs_own_tree_is_gated_with_eager_sync``)
  and refuses it the same way with lazy or none: launched here with
  ``--gate-draft-sync lazy``.
* NEXTN: resolved to EAGLE (not refused as an unknown algorithm); without
  shape flags it is the same auto-chosen tree, judged the same way.
* A given topk > 1: 0.5.23 resolves it and judges it like the auto-chosen
  tree; 0.5.9's spec v2 refuses it itself while resolving.

Cost: each launch stops after SGLang's argument resolution (no model loads),
about 10-25 s on two cores.
"""

from __future__ import annotations

import subprocess

import sglang_env
from support.server import free_port
from support.spec_server import spec_server_args, spec_server_env, without_shape

VERSION = sglang_env.version()
CHOSEN_BY_SGLANG = "SGLang chose this shape itself"
WHAT_TO_PASS = (
    "ass --speculative-num-steps 5 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 6"
)  # "Pass ..." or "..., or pass ..."


def with_flag(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


#: what stops a tree at launch: on 0.5.23 lazy draft sync (eager is gated),
#: on 0.5.9 the tree itself.
TREE_STOP = ["--gate-draft-sync", "lazy"] if VERSION == "0.5.23" else []
WHY_REFUSED = (
    "--gate-draft-sync lazy was asked"
    if VERSION == "0.5.23"
    else "draft trees on SGLang 0.5.23 only"
)


def tree_args(target, draft, *gate_args: str) -> list[str]:
    return spec_server_args(
        target, draft, free_port(), launcher="gate", gate_args=[*TREE_STOP, *gate_args]
    )


def launch_until_refused(args: list[str]) -> str:
    out = subprocess.run(
        args,
        env=spec_server_env(launcher="gate"),
        capture_output=True,
        text=True,
        timeout=400,
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    # stopped before any scheduler (and model) started
    assert "eagle_gate active in scheduler" not in text, text[-3000:]
    return text


def test_no_shape_flags_sglangs_own_tree_is_judged_on_purpose(spec_models):
    target, draft = spec_models
    text = launch_until_refused(without_shape(tree_args(target, draft)))
    assert (
        "eagle_gate: SGLang resolved speculation: EAGLE3, 5 steps, topk 4, "
        "8 draft tokens" in text
    ), text[-3000:]
    assert CHOSEN_BY_SGLANG in text and WHAT_TO_PASS in text, text[-3000:]
    assert WHY_REFUSED in text, text[-3000:]


def test_nextn_is_resolved_to_eagle_not_refused_as_unknown(spec_models):
    target, draft = spec_models
    args = tree_args(target, draft)
    args = without_shape(with_flag(args, "--speculative-algorithm", "NEXTN"))
    text = launch_until_refused(args)
    assert "is not handled by eagle_gate" not in text, text[-3000:]
    assert "--speculative-algorithm NEXTN runs as EAGLE" in text, text[-3000:]
    assert CHOSEN_BY_SGLANG in text and WHAT_TO_PASS in text, text[-3000:]


def test_a_given_topk_2_is_judged_like_sglangs_own_tree(spec_models):
    target, draft = spec_models
    args = tree_args(target, draft)
    text = launch_until_refused(with_flag(args, "--speculative-eagle-topk", "2"))
    if VERSION == "0.5.9":  # SGLang's own spec v2 check, while resolving
        assert "only supports topk = 1" in text, text[-3000:]
    else:
        assert "SGLang would run a draft tree (3 steps, topk 2" in text, text[-3000:]
        assert "as resolved from the command line" in text, text[-3000:]
        assert "--speculative-eagle-topk 1" in text, text[-3000:]
        assert WHY_REFUSED in text, text[-3000:]
