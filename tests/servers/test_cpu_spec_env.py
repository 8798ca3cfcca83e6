"""The CI environment runs SGLang's real EAGLE-3 path on CPU, exactly.

End to end, in whichever SGLang environment runs the suite: a stock EAGLE-3
server (EAGLEWorkerV2, SGLang's real Triton attention kernels interpreted,
``EAGLE_GATE_CI_ATTENTION=triton``, overlap scheduler on, the CPU stand-ins of
``ci/cpu_spec``) and a server without speculation give token-identical greedy
outputs for concurrent requests, while the speculative one verified drafts and
accepted several tokens per step. Every other speculative server of the suite
runs the torch versions of the two attention kernels instead (about ten times
faster); they are checked here against the interpreted kernels on the same
inputs. Plus unit tests of the exact torch topk-1 tree build and greedy verify
that 0.5.9 runs on CPU, against hand-computed tensors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sglang_env
from support.server import free_port, running_server
from support.spec_models import PROMPTS, build_spec_models
from support.spec_server import (
    INTERPRETED_ATTENTION,
    TORCH_ATTENTION,
    baseline_server_args,
    baseline_server_env,
    generate_concurrent,
    shim_first_calls,
    spec_server_args,
    spec_server_env,
)

REPO = Path(__file__).resolve().parents[2]
NEW_TOKENS = 16

# Stand-ins whose first call must show in the speculative server's log.
EXPECTED_SHIMS = {
    "0.5.9": {
        "build_tree_kernel_efficient(topk1)",
        "verify_tree_greedy(topk1)",
        "assign_extend_cache_locs_func(cpu)",
    },
    "0.5.23": {
        "build_tree_kernel_efficient_cpu",
        "verify_tree_greedy_cpu",
        "assign_draft_cache_locs_contiguous_cpu",
        "default_tree_mask_mode(FULL_MASK)",
        "_disable_overlap_schedule_for_cpu(skipped)",
    },
}


PACKAGE = REPO / "ci" / "cpu_spec" / "eagle_gate_ci_spec"


def _load_shims():
    """The repo's exact torch kernels (``ci/cpu_spec``'s ``kernels`` module;
    the environment imports the package from this checkout)."""
    from eagle_gate_ci_spec import kernels

    return kernels


def test_environment_carries_the_current_shims():
    """Every process of the environment imports ``eagle_gate_ci_spec`` from
    this checkout: its ``.pth`` names ``ci/cpu_spec`` (a path line written by
    .ci/make-sglang-env.sh) and imports the package; no copy of it is left in
    site-packages to shadow the checkout."""
    import sysconfig

    found = importlib.util.find_spec("eagle_gate_ci_spec")
    assert found is not None and found.origin, (
        "eagle_gate_ci_spec is not in this environment: run .ci/make-sglang-env.sh"
    )
    origin = Path(found.origin).resolve()
    assert origin == (PACKAGE / "__init__.py").resolve(), (
        f"eagle_gate_ci_spec comes from {origin}, not this checkout's {PACKAGE}: "
        "rerun .ci/make-sglang-env.sh"
    )
    site = Path(sysconfig.get_paths()["purelib"])
    pth = site / "eagle_gate_ci_spec.pth"
    lines = pth.read_text().splitlines()
    assert [Path(lines[0]).resolve(), *lines[1:]] == [
        PACKAGE.parent.resolve(),
        "import eagle_gate_ci_spec",
    ], lines
    stale = [p.name for p in site.glob("eagle_gate_ci_spec*") if p != pth]
    assert not stale, f"old copies in {site} shadow the checkout: {stale}"
    # the stand-ins' old flat names still reach their modules
    import eagle_gate_ci_spec

    assert eagle_gate_ci_spec.build_tree_topk1 is _load_shims().build_tree_topk1


def test_no_file_under_ci_is_over_400_lines():
    """The CI stand-ins stay split by concern (one module each)."""
    long = {
        str(p.relative_to(REPO)): n
        for p in (REPO / "ci").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, long


@pytest.fixture(scope="module")
def spec_and_baseline(tmp_path_factory):
    """Greedy outputs of a baseline and a stock EAGLE-3 server, same prompts."""
    root = tmp_path_factory.mktemp("spec-env")
    models = build_spec_models(root / "models")
    results = {}
    port = free_port()
    with running_server(
        baseline_server_args(models.target, port),
        port,
        baseline_server_env(),
        root / "baseline.log",
    ) as srv:
        results["baseline"] = generate_concurrent(srv.base_url, PROMPTS, NEW_TOKENS)
    port = free_port()
    with running_server(
        spec_server_args(models.target, models.draft, port, overlap=True),
        port,
        # the real attention kernels, interpreted (the suite's other servers
        # run the torch stand-ins, checked below)
        spec_server_env(overlap=True, EAGLE_GATE_CI_ATTENTION="triton"),
        root / "spec.log",
    ) as srv:
        results["spec"] = generate_concurrent(srv.base_url, PROMPTS, NEW_TOKENS)
        results["spec_log"] = srv.log_path
    results["models"] = models
    return results


@pytest.mark.parametrize("version", [sglang_env.version()])
def test_stock_eagle3_on_cpu_matches_baseline(spec_and_baseline, version):
    baseline, spec = spec_and_baseline["baseline"], spec_and_baseline["spec"]
    models = spec_and_baseline["models"]
    log = spec_and_baseline["spec_log"].read_text(errors="replace")

    base_ids = [r["output_ids"] for r in baseline]
    spec_ids = [r["output_ids"] for r in spec]
    assert all(len(ids) == NEW_TOKENS for ids in base_ids)
    assert spec_ids == base_ids
    # The rigged target emits runs of its token, but not only that token.
    flat = [t for ids in base_ids for t in ids]
    assert 0 < flat.count(models.run_token) < len(flat)

    # The real speculative path ran and accepted drafts.
    assert all("spec_verify_ct" not in r["meta_info"] for r in baseline)
    verify_ct = [r["meta_info"].get("spec_verify_ct", 0) for r in spec]
    assert all(ct > 0 for ct in verify_ct), [r["meta_info"] for r in spec]
    completion = sum(r["meta_info"]["completion_tokens"] for r in spec)
    accept_length = completion / sum(verify_ct)
    print(
        f"SGLang {version}: {sum(verify_ct)} verify steps, accept {accept_length:.2f}"
    )
    assert accept_length > 1.2, [r["meta_info"] for r in spec]

    assert "EAGLE" in log
    shims = shim_first_calls(log)
    assert EXPECTED_SHIMS[version] <= shims, log[-3000:]
    assert INTERPRETED_ATTENTION <= shims, shims
    assert not TORCH_ATTENTION & shims, shims
    if version == "0.5.23":
        assert "Overlap schedule is not implemented" not in log


def test_attention_stand_ins_match_the_interpreted_kernels():
    """``ci/cpu_spec``'s torch decode and extend attention against SGLang's own
    Triton kernels, interpreted, on the same random inputs
    (``support.attention_check``: MHA and GQA, ragged lengths, prefixes,
    causal or not, the verify's custom mask with and without the prefix,
    rows past one tile): they differ by float summation order only."""
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "EAGLE_GATE_CI_ATTENTION": "triton",
        "PYTHONPATH": str(REPO / "tests"),
    }
    env.pop("EAGLE_GATE_CI_SPEC", None)
    proc = subprocess.run(
        [sys.executable, "-m", "support.attention_check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["version"] == sglang_env.version()
    assert len(report["diffs"]) == 10, report
    assert max(report["diffs"].values()) < 1e-5, report


# ---------------------------------------------------------------------------
# Unit tests: the exact torch topk-1 kernels (0.5.9's CPU path), hand-computed.
# ---------------------------------------------------------------------------


def _chain_build_inputs(seq_lens, n=4, mode=0):
    import torch

    shims = _load_shims()
    bs = len(seq_lens)
    seq = torch.tensor(seq_lens, dtype=torch.int64)
    if mode == shims.FULL_MASK:
        mask = torch.full((sum(seq_lens) * n + n * n * bs,), True)
    else:
        mask = torch.full((n * n * bs,), True)
    retrive = torch.full((3, bs, n), -1, dtype=torch.long)
    # What 0.5.9's draft hands over for topk 1 and 3 steps.
    parent_list = torch.tensor([[-1, 0, 1]] * bs)
    selected = torch.tensor([[0, 1, 2]] * bs)
    positions = torch.empty(bs * n, dtype=torch.long)
    return shims, (parent_list, selected, seq, mask, positions, *retrive)


def test_topk1_tree_build_full_mask():
    shims, args = _chain_build_inputs([3, 2])
    shims.build_tree_topk1(*args, 1, 3, 4, shims.FULL_MASK)
    _, _, _, mask, positions, r_index, r_next, r_sibling = args
    assert positions.tolist() == [3, 4, 5, 6, 2, 3, 4, 5]
    assert r_index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert r_next.tolist() == [[1, 2, 3, -1], [1, 2, 3, -1]]
    assert r_sibling.tolist() == [[-1] * 4, [-1] * 4]
    # Request 0: 4 rows of 3 prefix + 4 tree cells; request 1: 4 rows of 2 + 4.
    req0 = [
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 1],
    ]
    req1 = [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1],
    ]
    expected = [c for row in req0 + req1 for c in row]
    assert mask.int().tolist() == expected


def test_topk1_tree_build_qlen_only_and_refusals():
    import torch

    shims, args = _chain_build_inputs([5], mode=1)
    shims.build_tree_topk1(*args, 1, 3, 4, shims.QLEN_ONLY)
    mask = args[3]
    assert mask.int().tolist() == [1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1]
    assert args[4].tolist() == [5, 6, 7, 8]

    with pytest.raises(NotImplementedError, match="topk"):
        shims.build_tree_topk1(*args, 2, 3, 4, shims.QLEN_ONLY)
    with pytest.raises(NotImplementedError):
        shims.build_tree_topk1(*args, 1, 3, 4, shims.QLEN_ONLY_BITPACKING)
    shims, args = _chain_build_inputs([5])
    args[1][0] = torch.tensor([0, 2, 1])  # not a chain
    with pytest.raises(NotImplementedError, match="chain"):
        shims.build_tree_topk1(*args, 1, 3, 4, shims.FULL_MASK)


def _verify(candidates, target_predict, n=4):
    import torch

    shims = _load_shims()
    bs = len(candidates)
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32)
    accept_num = torch.empty(bs, dtype=torch.int32)
    rows = torch.arange(bs)[:, None] * n
    r_index = rows + torch.arange(n)
    r_next = torch.tensor([[1, 2, 3, -1]] * bs)
    r_sibling = torch.full((bs, n), -1)
    shims.verify_tree_greedy_topk1(
        predicts,
        accept_index,
        accept_num,
        torch.tensor(candidates),
        r_index,
        r_next,
        r_sibling,
        torch.tensor(target_predict),
    )
    return predicts.tolist(), accept_index.tolist(), accept_num.tolist()


def test_topk1_greedy_verify():
    # Row 0 accepts 2 drafts (5, 6), rejects 7 (target says 1): bonus 1.
    # Row 1 accepts 1 (5), rejects 8 (target 6): bonus 6.
    # Row 2 accepts all 3 (5, 6, 1): bonus 2.
    # Row 3 rejects the first draft (4 != 5): bonus 5.
    predicts, accept_index, accept_num = _verify(
        candidates=[[9, 5, 6, 7], [9, 5, 8, 7], [9, 5, 6, 1], [9, 4, 6, 1]],
        target_predict=[[5, 6, 1, 2], [5, 6, 8, 2], [5, 6, 1, 2], [5, 6, 1, 2]],
    )
    assert accept_num == [2, 1, 3, 0]
    assert accept_index == [
        [0, 1, 2, -1],
        [4, 5, -1, -1],
        [8, 9, 10, 11],
        [12, -1, -1, -1],
    ]
    assert predicts == [5, 6, 1, 0, 5, 6, 0, 0, 5, 6, 1, 2, 5, 0, 0, 0]


def test_topk1_greedy_verify_refuses_trees():
    import torch

    shims = _load_shims()
    sibling = torch.full((1, 4), -1)
    sibling[0, 1] = 2
    with pytest.raises(NotImplementedError):
        shims.verify_tree_greedy_topk1(
            torch.zeros(4, dtype=torch.int32),
            torch.full((1, 4), -1, dtype=torch.int32),
            torch.empty(1, dtype=torch.int32),
            torch.tensor([[9, 5, 6, 7]]),
            torch.arange(4)[None],
            torch.tensor([[1, 3, -1, -1]]),
            sibling,
            torch.tensor([[5, 6, 1, 2]]),
        )


def test_index_copy_stand_ins():
    import torch

    shims = _load_shims()
    req_to_token = torch.zeros(3, 8, dtype=torch.int32)
    out = torch.tensor([11, 12, 13, 21, 22])
    # Request row 2 gets slots 1..3, row 0 gets slots 4..5.
    shims.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]), req_to_token, torch.tensor([1, 4]),
        torch.tensor([4, 6]), out, 8,
    )  # fmt: skip
    assert req_to_token[2].tolist() == [0, 11, 12, 13, 0, 0, 0, 0]
    assert req_to_token[0].tolist() == [0, 0, 0, 0, 21, 22, 0, 0]

    back = torch.full((5,), -7, dtype=torch.int64)
    shims.assign_extend_cache_locs_cpu(
        torch.tensor([2, 0]), req_to_token, torch.tensor([1, 4]),
        torch.tensor([4, 6]), back, 8,
    )  # fmt: skip
    assert back.tolist() == [11, 12, 13, 21, 22]

    draft = torch.full((4,), -7, dtype=torch.int64)
    shims.assign_draft_cache_locs_contiguous_cpu(
        torch.tensor([2, 0]), req_to_token, torch.tensor([2, 4]), draft, 8, 1, 2
    )
    assert draft.tolist() == [12, 13, 21, 22]

    bonus = torch.zeros(2, dtype=torch.int32)
    shims.fill_bonus_tokens_cpu(
        torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]]), torch.tensor([3, 1]), bonus, 4
    )
    assert bonus.tolist() == [7, 1]

    accepted = torch.zeros(4, dtype=torch.int64)
    shims.fill_accept_out_cache_loc_cpu(
        torch.tensor([[0, 2, -1], [3, -1, -1]]),
        torch.tensor([100, 101, 102, 103]),
        accepted,
    )
    assert accepted.tolist() == [100, 102, 103, 0]
