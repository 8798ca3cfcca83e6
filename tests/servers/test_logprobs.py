"""Logprob requests on a gated EAGLE-3 server (issue #21, item 1).

SGLang 0.5.9 dies on a request with input logprobs when it serves EAGLE-3:
the input-logprob branch of ``LogitsProcessor._get_pruned_states`` leaves the
aux hidden states None and the draft's extend after prefill fails in
``torch.cat`` (the scheduler exits, the server with it). The 0.5.9 adapter
carries a fix (``eagle_gate/adapters/sglang_0_5_9/fixes.py``), applied where a
probe finds the defect; 0.5.23 has the upstream fix and needs none.

Here: the probe's verdicts on the installed SGLang and the fix's effect on
it (no server), then greedy input and top logprobs from the shared gated
server against the server without speculation. Tolerance: logprobs agree
within ``LOGPROB_ATOL`` = 1e-4 (float32; the gated server's target attention
runs SGLang's Triton kernels, the baseline torch_native, and the two differ
by about 1e-6 here), token ids exactly.

What the servers return differs by design in one place: SGLang 0.5.9's
spec-v2 worker returns no output logprobs for tokens committed by a
speculative step (its scheduler leaves them to the speculative worker, which
does not fill them), so a 0.5.9 EAGLE-3 server, gated or not, returns the
prefill's one output logprob; those returned are compared.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sglang_env
from support.gated_server import scheduler_status, set_policy
from support.timings import note
from support.traffic import health, post

VERSION = sglang_env.version()
FIX = "logprob-aux-hidden-states"
LOGPROB_ATOL = 1e-4
TOP = 5

#: (prompt, logprob_start_len, max_new_tokens)
REQUESTS = [
    ("Once upon a time the tiny model", 0, 6),
    ("Logprobs from the middle of a prompt onwards", 4, 5),
    ("A prompt whose logprobs start at its last token", -1, 4),
]


# -- the fix, judged and applied in this process (no server) ------------------------
@pytest.fixture
def fixes():
    from eagle_gate.adapters.sglang_0_5_9 import fixes

    yield fixes
    for fix in fixes.FIXES:  # put SGLang back as it was installed
        fix.instrumentor().uninstrument()
    fixes._APPLIED.clear()


def test_the_probe_finds_the_defect_only_in_0_5_9(fixes):
    """0.5.9's installed logits processor drops the aux states in the
    input-logprob branch; 0.5.23's prunes them (the same probe, run against
    0.5.23's code as an untested SGLang would run it)."""
    assert fixes.judge() == {FIX: VERSION == "0.5.9"}


def test_the_fix_cures_the_probe_and_applies_only_where_needed(fixes):
    assert fixes.apply_fixes() == ([FIX] if VERSION == "0.5.9" else [])
    assert fixes.judge() == {FIX: False}
    assert fixes.apply_fixes() == fixes.applied()  # idempotent


def test_the_fix_keeps_the_rows_the_branch_keeps(fixes):
    """The real method, wrapped, on a three-request prefill with input
    logprobs and three aux layers: every aux layer pruned to exactly the rows
    of the hidden states, so the LAST hidden state stored per request is the
    aux state of its last prompt token (as without logprobs)."""
    import torch
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    fixes.apply_fixes()
    hidden = torch.randn(12, 3)
    aux = [torch.randn(12, 3) for _ in range(3)]
    meta = type("Meta", (), {})()
    meta.forward_mode = ForwardMode.EXTEND
    meta.extend_return_logprob = True
    meta.extend_logprob_start_lens_cpu = [0, 2, 5]
    meta.extend_seq_lens_cpu = [4, 3, 5]
    meta.extend_seq_lens = torch.tensor([4, 3, 5])
    meta.padded_static_len = -1
    out = LogitsProcessor._get_pruned_states(object(), hidden, None, aux, meta)
    pruned, _, aux_pruned, sample_indices = out[:4]
    rows = [0, 1, 2, 3, 6, 11]  # request 2's start steps back to its last token
    assert torch.equal(pruned, hidden[rows])
    if isinstance(aux_pruned, torch.Tensor):  # a packed layout
        aux_pruned = [aux_pruned]
        aux = [torch.cat(aux, dim=-1)]
    assert all(torch.equal(a, h[rows]) for a, h in zip(aux_pruned, aux, strict=True))
    last = [3, 6, 11]
    stored = torch.cat(aux_pruned, dim=-1)[sample_indices]
    assert torch.equal(stored, torch.cat([h[last] for h in aux], dim=-1))


def test_a_fix_that_cannot_be_judged_stops_the_launch(fixes, monkeypatch):
    from dataclasses import replace

    from eagle_gate.adapters.patching import GatePatchError

    def broken(module):
        raise GatePatchError("probe failed on purpose")

    monkeypatch.setattr(fixes, "FIXES", (replace(fixes.FIXES[0], has_defect=broken),))
    with pytest.raises(GatePatchError, match="on purpose"):
        fixes.apply_fixes()


def test_doctor_names_the_fix():
    from eagle_gate import doctor
    from eagle_gate.adapters import select_adapter

    rows = doctor.check_version_fixes(select_adapter())
    if VERSION == "0.5.9":
        (row,) = rows
        assert row.ok and row.name == f"fix {FIX}"
        assert row.detail.startswith("needed, applied at launch")
    else:
        assert rows == []  # 0.5.23's adapter carries no fixes


# -- the servers -------------------------------------------------------------------
def _body(prompt: str, start: int, new: int) -> dict:
    return {
        "text": prompt,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": new,
            "ignore_eos": True,
        },
        "return_logprob": True,
        "logprob_start_len": start,
        "top_logprobs_num": TOP,
    }


def _ask(base_url: str) -> list[dict]:
    with ThreadPoolExecutor(len(REQUESTS)) as pool:
        replies = list(
            pool.map(lambda r: post(base_url, "/generate", _body(*r)), REQUESTS)
        )
    for status, reply in replies:
        assert status == 200, reply
    return [reply for _, reply in replies]


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= LOGPROB_ATOL


def _compare_entries(got: list, want: list, what: str) -> float:
    """Entries ``[logprob, token_id, text]``; returns the largest difference."""
    assert len(got) == len(want), (what, len(got), len(want))
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        assert g[1] == w[1], (what, g, w)
        assert _close(g[0], w[0]), (what, g, w)
        if g[0] is not None:
            worst = max(worst, abs(g[0] - w[0]))
    return worst


def _compare_tops(got: list, want: list, what: str) -> float:
    assert len(got) == len(want), (what, len(got), len(want))
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None, what
            continue
        worst = max(worst, _compare_entries(g, w, what))
    return worst


@pytest.fixture(scope="module")
def logprob_replies(traffic_servers):
    """The requests on both servers, the gated one under ``always`` (every
    decode step SPEC; logprob batches take no plain step anyway)."""
    t0 = time.monotonic()
    url = traffic_servers.gated.base_url
    set_policy(url, "always")
    gated = _ask(url)
    baseline = _ask(traffic_servers.baseline.base_url)
    return gated, baseline, time.monotonic() - t0


def test_the_gated_server_survives_and_names_its_fix(traffic_servers, logprob_replies):
    url = traffic_servers.gated.base_url
    assert health(url) == 200
    record = scheduler_status(url)
    assert record["fixes"] == ([FIX] if VERSION == "0.5.9" else [])
    log = traffic_servers.gated.log()
    applied = f"SGLang fix applied: {FIX}" in log
    assert applied == (VERSION == "0.5.9")
    assert "Scheduler hit an exception" not in log


def test_greedy_logprobs_equal_a_server_without_speculation(logprob_replies):
    gated, baseline, seconds = logprob_replies
    worst, outputs = 0.0, []
    for (prompt, _start, new), g, b in zip(REQUESTS, gated, baseline, strict=True):
        assert g["output_ids"] == b["output_ids"], prompt
        gm, bm = g["meta_info"], b["meta_info"]
        worst = max(
            worst,
            _compare_entries(
                gm["input_token_logprobs"], bm["input_token_logprobs"], prompt
            ),
            _compare_tops(gm["input_top_logprobs"], bm["input_top_logprobs"], prompt),
        )
        assert len(bm["output_token_logprobs"]) == new
        returned = len(gm["output_token_logprobs"])
        outputs.append(returned)
        if VERSION == "0.5.9":
            assert returned >= 1  # the prefill's; see the module doc
        else:
            assert returned == new
        worst = max(
            worst,
            _compare_entries(
                gm["output_token_logprobs"],
                bm["output_token_logprobs"][:returned],
                prompt,
            ),
            _compare_tops(
                gm["output_top_logprobs"], bm["output_top_logprobs"][:returned], prompt
            ),
        )
    inputs = [len(g["meta_info"]["input_token_logprobs"]) for g in gated]
    note(
        f"SGLang {VERSION}: logprobs, gated EAGLE-3 vs no speculation, "
        f"{len(REQUESTS)} greedy requests (input logprobs {inputs} positions, top "
        f"{TOP}; output logprobs returned {outputs} of "
        f"{[r[2] for r in REQUESTS]}): ids identical, largest logprob difference "
        f"{worst:.2e} (tolerance {LOGPROB_ATOL}) ({seconds:.0f} s)"
    )
