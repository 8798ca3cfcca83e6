"""An MTP model served with the gate: ``--speculative-algorithm NEXTN`` end to end.

The model is the tiny MiMo target whose trained MTP layer is its draft
(``support.trained_mtp``): SGLang runs NEXTN as EAGLE (one hidden state, no aux
layers) with ``MiMoMTP`` as the draft model, on its real ``EAGLEWorkerV2``
(draft forward, TARGET_VERIFY, draft extend; Triton kernels interpreted; the CPU
stand-ins of ``ci/cpu_spec``), the overlap scheduler on (0.5.9 always; 0.5.23
through the CI switch). Against a server without speculation of the same
target:

* the status names what runs (NEXTN as EAGLE, MTP draft MiMoMTP);
* the draft-state check of the EAGLE-3 servers (``support.draft_state``): PLAIN
  stretches of 2, 1, 4 and 8 steps between SPEC steps, outputs token-identical,
  every SPEC step's accept length against the MTP layer offline; eager sync
  keeps it in step, and without sync (``none``, the positive control, run in
  0.5.9's session only) the steps after a stretch differ;
* the mixed-traffic soak of ``support.soak`` (sampling, logprobs, stop strings,
  n = 2, grammar, aborts, dropped streams, bad input, runtime policy changes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import sglang_env
from support import soak
from support.draft_state import (
    DRAFT_NEW,
    DRAFT_PROMPTS,
    NONE_CONTROL_REQUESTS,
    OfflineDraft,
    check_draft_state,
)
from support.gated_server import generate_many, log_failures, status
from support.server import nextn_server, serve, serve_together
from support.timings import note
from support.trained_mtp import read_mtp_info

VERSION = sglang_env.version()


@dataclass(frozen=True)
class Gated:
    base_url: str
    log_path: Path
    decision_dir: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def servers(mtp_model, test_plugins, tmp_path_factory):
    """The gated NEXTN server (eager draft sync) and a server without
    speculation of the MiMo target, started together."""
    root = tmp_path_factory.mktemp("mtp-eager")
    t0 = time.monotonic()
    managers = [
        nextn_server(mtp_model, root, "eager", test_plugins),
        serve(mtp_model, root / "baseline.log"),
    ]
    with serve_together(managers) as (gated, baseline):
        note(f"SGLang {VERSION}: MTP servers (gated + no-spec) up in "
             f"{time.monotonic() - t0:.0f} s")  # fmt: skip
        yield Gated(gated.base_url, gated.log_path, root / "decisions"), baseline
        log = gated.log_text()
    note(f"SGLang {VERSION}: MTP servers held {time.monotonic() - t0:.0f} s")
    assert not log_failures(log), log[-4000:]


@pytest.fixture(scope="module")
def eager(servers) -> Gated:
    return servers[0]


@pytest.fixture(scope="module")
def reference(servers) -> dict:
    """The server without speculation's greedy answers to the draft-state
    prompts, and the soak's references."""
    base = servers[1].base_url
    draft = generate_many(base, [(p, DRAFT_NEW) for p in DRAFT_PROMPTS])
    return {"draft": [r["output_ids"] for r in draft], "soak": soak.references(base)}


@pytest.fixture(scope="module")
def offline(mtp_model, reference) -> OfflineDraft:
    return OfflineDraft(mtp_model, mtp_model, DRAFT_PROMPTS, reference["draft"])


def test_the_status_names_nextn_and_the_mtp_draft(eager):
    view = status(eager.base_url)
    spec = view["speculative"]
    assert spec["algorithm"] == "EAGLE", spec
    assert spec["draft_model"] == "MiMoMTP" and spec["mtp"] is True, spec
    assert "--speculative-algorithm NEXTN runs as EAGLE" in spec["describe"], spec
    assert "MTP draft MiMoMTP" in spec["describe"], spec
    (record,) = view["schedulers"]
    assert record["gated"] is True, record


def test_mtp_draft_state_after_plain_stretches_eager(
    eager, reference, offline, mtp_model
):
    """Outputs token-identical through PLAIN stretches of 1, 2, 4 and 8 steps,
    and every SPEC step accepts what the MTP layer accepts offline from the
    whole, correct history. Also the trained layer's accept length, offline
    (held-out prompts, at training) and on this server."""
    result = check_draft_state(
        eager.base_url,
        eager.decision_dir,
        "eager",
        offline,
        reference["draft"],
        f"SGLang {VERSION}: [MTP eager]",
    )
    spec = result["all"]
    info = read_mtp_info(mtp_model) or {}
    note(
        f"SGLang {VERSION}: MTP layer accept length: offline (held-out, "
        f"training) {info.get('accept_length')}; on the server "
        f"{spec.server_mean:.2f} over {spec.n} SPEC steps (offline on the same "
        f"steps {spec.offline_mean:.2f})"
    )
    # the layer proposes: more than one token per SPEC step on the server
    assert spec.server_mean > 1.5, spec.describe()


def test_mtp_soak_of_mixed_traffic(eager, reference):
    soak.soak_and_check(
        eager.base_url,
        eager.log,
        reference["soak"],
    )


@pytest.mark.skipif(
    VERSION != "0.5.9",
    reason="the MTP positive control runs in one version's session (0.5.9's, "
    "the shorter): what it shows, that the draft-state check sees an MTP draft "
    "left stale, is the check's and the gate's code, the same for both; "
    "0.5.23's EAGLE-3 control (test_spec_e2e, none-overlap) runs there",
)
def test_mtp_draft_state_without_sync_is_caught(
    mtp_model, reference, test_plugins, tmp_path
):
    """The positive control: without draft sync the SPEC steps right after a
    stretch propose from a stale MTP state, and the same check sees it."""
    n = NONE_CONTROL_REQUESTS
    few = OfflineDraft(mtp_model, mtp_model, DRAFT_PROMPTS[:n], reference["draft"][:n])
    with nextn_server(mtp_model, tmp_path, "none", test_plugins) as srv:
        check_draft_state(
            srv.base_url,
            tmp_path / "decisions",
            "none",
            few,
            reference["draft"],
            f"SGLang {VERSION}: [MTP none]",
        )
        log = srv.log_text()
    assert not log_failures(log), log[-4000:]
