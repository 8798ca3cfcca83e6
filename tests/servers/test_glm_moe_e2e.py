"""A GLM-4.5 MoE model served with the gate: ``--speculative-algorithm NEXTN``
with the checkpoint's own NextN layer, end to end on CPU.

The model is ``support.glm_moe``'s tiny random-weight ``Glm4MoeForCausalLM``
(GQA with partial rotary, q/k/v biases; layer 0 dense, layer 1 MoE: 4 routed
experts, top 2 of sigmoid scores with a correction bias, one shared expert) and
its NextN layer (always MoE). SGLang builds ``Glm4MoeForCausalLMNextN`` for the
draft and runs NEXTN as EAGLE on its real ``EAGLEWorkerV2``; the MoE layers run
SGLang's own CPU path (no AMX here: the native top-k and the torch loop over
experts), the overlap scheduler on (0.5.9 always; 0.5.23 through the CI
switch). One CPU stand-in is GLM-specific: on 0.5.23 the draft's
``set_embed_and_head`` calls ``torch.cuda.synchronize()``, a no-op without
CUDA (``ci/cpu_spec/eagle_gate_ci_spec/no_cuda.py``; 0.5.9's stand-ins already
had it). Against a server without speculation of the same target:

* the status names what runs (NEXTN as EAGLE, MTP draft
  ``Glm4MoeForCausalLMNextN``);
* greedy outputs of a batch of four stay token-identical while a fixed
  schedule forces PLAIN stretches of 1, 2 and 4 steps between SPEC steps
  that accept draft tokens;
* the mixed-traffic soak of ``support.soak``.

The NextN layer is not trained, but the checkpoint is shaped so that its
proposals are often right (``support.glm_moe``: accept length about 2), so the
SPEC steps between the stretches accept whole chains, part chains and nothing,
and the decision log shows it. Kept small: one server pair, one batch of four
short requests, the soak.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import sglang_env
from support import soak
from support.gated_server import (
    decision_records,
    generate_many,
    log_failures,
    scheduler_status,
    set_policy,
    status,
)
from support.glm_moe import DRAFT_ARCHITECTURE, build_glm_moe
from support.server import nextn_server, serve, serve_together
from support.spec_server import shim_first_calls
from support.timings import note

VERSION = sglang_env.version()

PROMPTS = (
    "the quick brown fox",
    "a model of tokens",
    "speculative decoding is",
    "one two three",
)
NEW_TOKENS = 24
#: PLAIN stretches of 1, 2 and 4 steps between SPEC steps, repeated
SCHEDULE = "s2,p1,s1,p2,s2,p4"


@dataclass(frozen=True)
class Gated:
    base_url: str
    log_path: Path
    decisions: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def glm_model(tmp_path_factory) -> Path:
    """The tiny GLM-4.5 MoE target with its NextN layer, cached under
    ``EAGLE_GATE_MODEL_CACHE`` when set (next to the tiny Llama whose
    tokenizer it takes)."""
    from support.model_cache import tiny_llama

    cache = os.environ.get("EAGLE_GATE_MODEL_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("glm-model")
    llama = tiny_llama(root)
    return build_glm_moe(llama, root / "tiny-glm4-moe")


@pytest.fixture(scope="module")
def servers(glm_model, test_plugins, tmp_path_factory):
    """A gated NEXTN server of the GLM target (policy ``never`` until a test
    sets one; SGLang fills the draft path in, passing it changes nothing) and
    a server without speculation, started together."""
    root = tmp_path_factory.mktemp("glm-servers")
    gated_server = nextn_server(glm_model, root, "eager", test_plugins)
    t0 = time.monotonic()
    with serve_together([gated_server, serve(glm_model, root / "baseline.log")]) as (
        gated,
        baseline,
    ):
        note(
            f"SGLang {VERSION}: GLM-4.5 servers (gated NEXTN + no-spec) up in "
            f"{time.monotonic() - t0:.0f} s"
        )
        yield Gated(gated.base_url, gated.log_path, root / "decisions"), baseline
        log = gated.log_text()
    note(f"SGLang {VERSION}: GLM-4.5 servers held {time.monotonic() - t0:.0f} s")
    assert not log_failures(log), log[-4000:]


@pytest.fixture(scope="module")
def gated(servers) -> Gated:
    return servers[0]


@pytest.fixture(scope="module")
def reference(servers) -> list[list[int]]:
    """The greedy answers of the server without speculation."""
    out = generate_many(servers[1].base_url, [(p, NEW_TOKENS) for p in PROMPTS])
    return [r["output_ids"] for r in out]


def spec_accept_lengths(decision_dir: Path, spec_steps: int) -> list[int]:
    """Every request's accept length in every SPEC step of the decision log,
    once it holds the ``spec_steps`` SPEC outcomes the status counted (the
    ops thread writes the log about every 0.2 s)."""
    deadline = time.monotonic() + 60
    while True:
        outcomes = [
            r
            for r in decision_records(decision_dir)
            if r["kind"] == "outcome" and r["mode"] == "spec"
        ]
        if len(outcomes) >= spec_steps or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert len(outcomes) == spec_steps, (len(outcomes), spec_steps)
    return [int(a) for r in outcomes for a in r["accept_lens"]]


def test_the_status_names_nextn_and_the_glm_draft(gated):
    view = status(gated.base_url)
    spec = view["speculative"]
    assert spec["algorithm"] == "EAGLE", spec
    assert spec["draft_model"] == DRAFT_ARCHITECTURE and spec["mtp"] is True, spec
    assert "--speculative-algorithm NEXTN runs as EAGLE" in spec["describe"], spec
    assert f"MTP draft {DRAFT_ARCHITECTURE}" in spec["describe"], spec
    (record,) = view["schedulers"]
    assert record["gated"] is True, record


def test_glm_outputs_identical_through_plain_stretches(gated, reference):
    before = scheduler_status(gated.base_url)["steps"]
    set_policy(gated.base_url, "schedule", pattern=SCHEDULE, repeat=True)
    t0 = time.monotonic()
    out = generate_many(gated.base_url, [(p, NEW_TOKENS) for p in PROMPTS])
    seconds = time.monotonic() - t0
    after = scheduler_status(gated.base_url)["steps"]
    got = [r["output_ids"] for r in out]
    same = sum(a == b for a, b in zip(got, reference, strict=True))
    plain = after.get("plain", 0) - before.get("plain", 0)
    spec = after.get("spec", 0) - before.get("spec", 0)
    note(
        f"SGLang {VERSION}: GLM-4.5 NEXTN gated ({SCHEDULE}): identical "
        f"{same}/{len(reference)}, {plain} PLAIN / {spec} SPEC steps, {seconds:.0f} s"
    )
    assert got == reference
    # both modes ran, on every request of the batch at once
    assert plain >= 4 and spec >= 4, (before, after)
    # the SPEC steps accepted draft tokens, and not always all of them
    accepts = spec_accept_lengths(gated.decisions, spec)
    mean = sum(accepts) / len(accepts)
    note(
        f"SGLang {VERSION}: GLM-4.5 NextN accept length {mean:.2f} over "
        f"{len(accepts)} request SPEC steps ({sorted(set(accepts))})"
    )
    assert max(accepts) > 1 and min(accepts) == 1, accepts
    if VERSION == "0.5.23":
        # the draft shares the target's embedding and head through the
        # stand-in (and only through it: no CUDA here)
        assert "torch.cuda.synchronize(no CUDA)" in shim_first_calls(gated.log_text())


def test_glm_soak_of_mixed_traffic(servers):
    """``support.soak``'s mixed traffic (sampling, logprobs, stop strings,
    n = 2, grammar, aborts, dropped streams, bad input, runtime policy
    changes) against the gated GLM-4.5 server, references from the server
    without speculation."""
    gated, baseline = servers
    soak.soak_and_check(
        gated.base_url, gated.log_text, soak.references(baseline.base_url)
    )
