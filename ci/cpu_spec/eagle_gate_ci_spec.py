"""CI only: let SGLang's real EAGLE-3 speculative path serve on a CPU-only host.

Loaded in every Python process of a CI environment by ``eagle_gate_ci_spec.pth``
and inert unless ``EAGLE_GATE_CI_SPEC=1``. It is never part of the installed
``eagle_gate`` package. When on, it reads the installed SGLang version (package
metadata; SGLang is not imported here) and installs, lazily through post-import
hooks so every spawned SGLang process gets them too:

* stand-ins for GPU kernels and GPU-only calls that SGLang's CPU code path
  reaches: torch versions of the ``sgl_kernel`` CPU ops (the CPU build of
  sgl_kernel is not on PyPI), and CPU paths where a kernel dispatcher has no
  CPU branch (0.5.9: the sampled verify's top-k / top-p renormalisation and
  chain speculative sampling, so sampled requests serve; the grammar mask);
* one logic fix for 0.5.23 (the verify tree-mask layout, see
  ``_cpu_tree_mask_mode``), because SGLang's CPU default is the layout of
  another attention backend than the one this CI serves with.

Stand-ins replace kernels only, never SGLang logic a GPU would run too; each
says what it replaces and why it is exact. Test-only switches, off by default:

* ``EAGLE_GATE_CI_FORCE_OVERLAP=1`` (0.5.23): keep the overlap scheduler on
  for speculation on CPU (SGLang turns it off there by itself).
* ``EAGLE_GATE_CI_CPU_SEQLENS=1`` or ``0`` (0.5.23): whether the overlap
  scheduler's FutureMap publishes host sequence lengths. SGLang decides it from
  the attention backends' ``needs_cpu_seq_lens``: Triton (the CPU speculative
  backend), FA3 and trtllm_mha declare False, FlashInfer and most others True.
  ``1`` makes the scheduler run as with FlashInfer, ``0`` as with FA3; unset,
  SGLang's own decision stands.
* ``EAGLE_GATE_CI_PLAIN_GRAPHS=construct`` (both versions): after the gate
  decided its plain-step CUDA graphs (off on CPU: ``device_not_cuda``), build
  the real plain attention backend and the real plain DECODE runner of the
  gate's adapter (docs/plain-graphs.md T2) with the runner's ``capture()`` a
  no-op, check them, record the checks in ``plain_graphs.report`` of the
  gate's status and drop them again. The plain step stays eager.
* ``EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE=PATH`` (both versions): a deliberate
  fault for the sampling distribution test. While PATH exists, each plain
  step of the gate samples with its batch's temperatures multiplied by the
  number in PATH (restored after the step); SPEC steps and servers without
  the gate are untouched. Absent, the plain step runs as it is.

``EAGLE_GATE_CI_DP=1`` (both versions, independent of ``EAGLE_GATE_CI_SPEC``)
installs the stand-ins that let SGLang's DP attention (``--enable-dp-attention
--dp-size 2 --tp 2``) serve on CPU: the padded-row sequence length the CPU's
backends do not declare, and, on 0.5.9, a torch row copy for the Triton
``memcpy_triton`` of the DP gather/scatter, unpinned host tensors, and direct
calls of two collectives whose custom-op wrappers have no CPU kernel. The
target must be a model SGLang builds for DP attention (Qwen3 here, not Llama;
see ``tests/support/qwen3_target.py``).

Every stand-in counts its calls per process (``calls()``); with
``EAGLE_GATE_CI_SPEC_LOG=1`` the first call of each, and every patch applied,
is logged to stderr as ``[eagle_gate_ci_spec] pid N ...`` so a test can show
from a server log that the real speculative path ran.

Environment the speculative path needs besides this module: ``TRITON_INTERPRET=1``
(SGLang's own ``@triton.jit`` kernels then run interpreted on CPU tensors),
``SGLANG_USE_CPU_ENGINE=1``, and the Triton attention backend.
"""

from __future__ import annotations

import os
import sys

ENABLED = os.environ.get("EAGLE_GATE_CI_SPEC") == "1"
DP = os.environ.get("EAGLE_GATE_CI_DP") == "1"
LOG = os.environ.get("EAGLE_GATE_CI_SPEC_LOG") == "1"
FORCE_OVERLAP = os.environ.get("EAGLE_GATE_CI_FORCE_OVERLAP") == "1"
CPU_SEQLENS = {"1": True, "0": False}.get(
    os.environ.get("EAGLE_GATE_CI_CPU_SEQLENS", "")
)
PLAIN_GRAPHS = os.environ.get("EAGLE_GATE_CI_PLAIN_GRAPHS", "")
PLAIN_TEMPERATURE_FILE = os.environ.get("EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE", "")

STUB_MARK = "eagle-gate-cpu-stub"  # in the stand-in sgl_kernel's __version__
PREFIX = "[eagle_gate_ci_spec]"

_CALLS: dict[str, int] = {}
_INSTALLED: list[str] = []  # what install() set up in this process


def calls() -> dict[str, int]:
    """Calls of each stand-in in this process so far."""
    return dict(_CALLS)


def installed() -> list[str]:
    """Names of the stand-ins and patches installed in this process."""
    return list(_INSTALLED)


def _log(msg: str) -> None:
    if LOG:
        print(f"{PREFIX} pid {os.getpid()} {msg}", file=sys.stderr, flush=True)


def _count(name: str) -> None:
    n = _CALLS.get(name, 0) + 1
    _CALLS[name] = n
    if n == 1:
        _log(f"first call: {name}")


# --------------------------------------------------------------------------
# Exact torch versions of integer kernels (index copies and topk-1 trees).
# Only these functions import torch, and only when called.
# --------------------------------------------------------------------------

FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2  # SGLang's TreeMaskMode


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """Stand-in for sgl_kernel's CPU op ``assign_req_to_token_pool_cpu``.

    Replaces the GPU kernel ``mem_cache.allocation.assign_req_to_token_pool``
    (0.5.23): for request i, ``req_to_token[req_pool_indices[i], start:end]``
    takes the next ``end - start`` slots of ``out_cache_loc``, requests packed
    back to back. A pure index copy, so exact.
    """
    _count("assign_req_to_token_pool_cpu")
    off = 0
    for r, s, e in zip(
        req_pool_indices.tolist(),
        start_offset.tolist(),
        end_offset.tolist(),
        strict=True,
    ):
        n = e - s
        if n > 0:
            req_to_token[r, s:e] = out_cache_loc[off : off + n].to(req_to_token.dtype)
        off += n  # the kernel's offset is the plain sum of earlier lengths


def assign_extend_cache_locs_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """Stand-in for sgl_kernel's CPU op ``assign_extend_cache_locs_cpu``.

    Replaces the GPU kernel ``assign_extend_cache_locs``: the reverse copy of
    ``assign_req_to_token_pool_cpu``, gathering ``req_to_token[r, start:end]``
    of each request into ``out_cache_loc``, packed back to back. Exact.
    """
    _count("assign_extend_cache_locs_cpu")
    _gather_token_slots(
        req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc
    )


def _gather_token_slots(req_pool_indices, req_to_token, start, end, out):
    off = 0
    for r, s, e in zip(
        req_pool_indices.tolist(), start.tolist(), end.tolist(), strict=True
    ):
        n = e - s
        if n > 0:
            out[off : off + n] = req_to_token[r, s:e].to(out.dtype)
        off += n  # the kernel's offset is the plain sum of earlier lengths


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len, topk, num_cols
):
    """Stand-in for sgl_kernel's CPU op ``assign_draft_cache_locs_contiguous_cpu``.

    Replaces the GPU kernel ``assign_draft_cache_locs_contiguous`` (without
    positions, which SGLang asserts on CPU): request i's ``topk * num_cols``
    slots from ``req_to_token[r, seq_lens[i]:]`` go to
    ``out_cache_loc[i * topk * num_cols:]``. Exact.
    """
    _count("assign_draft_cache_locs_contiguous_cpu")
    n = topk * num_cols
    for i, (r, s) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[r, s : s + n].to(
            out_cache_loc.dtype
        )


def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride):
    """Stand-in for sgl_kernel's CPU op ``fill_bonus_tokens_cpu``.

    Replaces the GPU kernel ``fill_bonus_tokens``: request i's bonus token is
    the last accepted one, ``accept_tokens.flat[i * accept_stride +
    accept_lens[i] - 1]``. A gather, exact (the kernel reads the buffer by
    address, so a contiguous tensor is required, as SGLang passes).
    """
    import torch

    _count("fill_bonus_tokens_cpu")
    if not accept_tokens.is_contiguous():
        raise ValueError("fill_bonus_tokens_cpu needs contiguous accept_tokens")
    bs = accept_lens.shape[0]
    flat = accept_tokens.reshape(-1)
    idx = torch.arange(bs, device=flat.device) * accept_stride
    idx = idx + accept_lens.to(torch.int64) - 1
    bonus_tokens[:bs] = flat[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc):
    """Stand-in for sgl_kernel's CPU op ``fill_accept_out_cache_loc_cpu``.

    Replaces the GPU kernel ``fill_accept_out_cache_loc`` (reached for topk > 1
    only): the cache slots of the accepted draft positions, in order,
    skipping the ``-1`` entries of ``accept_index``. Exact (stable compaction).
    """
    _count("fill_accept_out_cache_loc_cpu")
    ai = accept_index.reshape(-1)
    src = ai[ai > -1].to(out_cache_loc.device).long()
    accept_out_cache_loc[: src.numel()] = out_cache_loc[src].to(
        accept_out_cache_loc.dtype
    )


def build_tree_topk1(
    parent_list,
    selected_index,
    verified_seq_len,
    tree_mask,
    positions,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    topk,
    depth,
    draft_token_num,
    tree_mask_mode,
):
    """Exact torch version of ``build_tree_kernel_efficient`` for topk 1.

    Replaces sgl_kernel's GPU op (SGLang 0.5.9 binds it on CUDA/HIP only). With
    topk 1 the draft is a chain: SGLang forces ``draft_token_num = depth + 1``,
    ``selected_index`` is ``0 .. n-2`` and ``parent_list`` is ``-1, 0, 1 ..``.
    Per request b with verified length ``s`` and ``n = draft_token_num`` it
    writes what the kernel writes, and nothing else:

    * ``positions[b*n + x] = s + x`` (token x sits at depth x);
    * ``retrive_index[b, x] = b*n + x``; ``retrive_next_token[b, x] = x + 1``
      for x < n-1 (the last stays -1); ``retrive_next_sibling`` untouched
      (no token of a chain has a sibling);
    * the tree mask: row x lets draft token x see tree tokens 0..x (a lower
      triangle). FULL_MASK: row x of request b starts at
      ``n*n*b + n*sum(seq_lens[:b]) + (s + n)*x``; its first ``s`` cells (the
      prefix) are left as the caller filled them, the next n are the triangle.
      QLEN_ONLY: row x starts at ``n*n*b + n*x`` and holds the n cells.

    Anything other than a topk-1 chain raises NotImplementedError.
    """
    import torch

    _count("build_tree_kernel_efficient(topk1)")
    if topk != 1:
        raise NotImplementedError(
            f"CPU tree build stand-in handles topk 1 chains only, got topk={topk}"
        )
    mode = int(tree_mask_mode)
    if mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(f"CPU tree build: tree mask mode {mode}")
    n = int(draft_token_num)
    bs = verified_seq_len.numel()
    if n - 1 > depth:
        raise NotImplementedError(f"topk-1 chain of {n} tokens deeper than {depth}")
    chain = torch.arange(n - 1, device=selected_index.device)
    if bs and not bool((selected_index[:, : n - 1] == chain).all()):
        raise NotImplementedError("CPU tree build: selected tokens are not a chain")
    if bs == 0:
        return
    dev = verified_seq_len.device
    seq = verified_seq_len.to(torch.int64)
    steps = torch.arange(n, device=dev)
    positions[: bs * n] = (seq[:, None] + steps).reshape(-1).to(positions.dtype)
    rows = torch.arange(bs, device=dev)[:, None] * n
    retrive_index[:bs, :n] = (rows + steps).to(retrive_index.dtype)
    retrive_next_token[:bs, : n - 1] = steps[1:].to(retrive_next_token.dtype)
    tri = torch.tril(torch.ones(n, n, dtype=torch.bool, device=tree_mask.device))
    tri = tri.to(tree_mask.dtype)
    if mode == QLEN_ONLY:
        tree_mask[: bs * n * n] = tri.reshape(-1).repeat(bs)
        return
    prefix = 0
    for b, s in enumerate(seq.tolist()):
        start = n * n * b + n * prefix
        block = tree_mask[start : start + n * (s + n)].view(n, s + n)
        block[:, s:] = tri
        prefix += s


def _check_chain(what, bs, n, retrive_next_token, retrive_next_sibling):
    """Refuse what the topk-1 stand-ins cannot compute: a tree with siblings,
    or draft tokens that are not the chain 0 -> 1 -> ... -> n-1. Returns
    ``arange(n)`` (the chain's positions) for the caller's indexing."""
    import torch

    if bool((retrive_next_sibling[:bs, :n] != -1).any()):
        raise NotImplementedError(f"{what} handles topk 1 chains only")
    steps = torch.arange(n, device=retrive_next_token.device)
    if not bool((retrive_next_token[:bs, : n - 1] == steps[1:]).all()):
        raise NotImplementedError(f"{what}: draft tokens are not a chain")
    return steps


def verify_tree_greedy_topk1(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    target_predict,
):
    """Exact torch version of ``verify_tree_greedy`` for a topk-1 chain.

    Replaces sgl_kernel's GPU op (SGLang 0.5.9 calls it on CUDA/HIP only and
    does nothing on CPU). The kernel walks the tree from the root: at each
    level it compares the next draft token with the target's argmax after the
    last accepted token and stops at the first mismatch. On a chain of
    ``n = candidates.shape[1]`` tokens, with ``r = retrive_index[b]`` and
    ``t = target_predict.flatten()``, request b accepts the longest prefix
    with ``candidates[b, j] == t[r[j-1]]`` (j = 1 .. min(n, m) - 1, where
    ``m = accept_index.shape[1]``); if that is ``a`` tokens long it writes
    ``accept_token_num[b] = a``, ``accept_index[b, :a+1] = r[:a+1]`` and
    ``predicts[r[i]] = t[r[i]]`` for i <= a (the accepted tokens, then the
    bonus token), leaving every other cell as the caller filled it.

    A tree with siblings (topk > 1) raises NotImplementedError.
    """
    import torch

    _count("verify_tree_greedy(topk1)")
    bs, n = candidates.shape
    if bs == 0:
        return
    steps = _check_chain(
        "CPU greedy verify", bs, n, retrive_next_token, retrive_next_sibling
    )
    levels = min(n, accept_index.shape[1]) - 1
    flat_target = target_predict.reshape(-1)
    ridx = retrive_index[:bs, : levels + 1].to(torch.int64)
    match = candidates[:, 1 : levels + 1] == flat_target[ridx[:, :levels]]
    accepted = match.to(torch.int64).cumprod(dim=1).sum(dim=1)
    keep = steps[None, : levels + 1] <= accepted[:, None]
    accept_index[:, : levels + 1] = torch.where(
        keep, ridx.to(accept_index.dtype), accept_index[:, : levels + 1]
    )
    done = ridx[keep]
    predicts[done] = flat_target[done].to(predicts.dtype)
    accept_token_num[:bs] = accepted.to(accept_token_num.dtype)


# --------------------------------------------------------------------------
# SGLang 0.5.23
# --------------------------------------------------------------------------


def build_tree_kernel_efficient_cpu(
    parent_list,
    top_scores_index,
    seq_lens,
    tree_mask,
    positions,
    retrieve_index,
    retrieve_next_token,
    retrieve_next_sibling,
    topk,
    spec_steps,
    num_verify_tokens,
    tree_mask_mode,
):
    """Stand-in for sgl_kernel's CPU op ``build_tree_kernel_efficient_cpu``.

    Delegates to SGLang's own Triton kernel of the same op
    (``spec_tree.sgl_build_tree_kernel_triton``, its XPU path), run by the
    Triton interpreter on CPU tensors: the same integer algorithm the GPU runs,
    any topk.
    """
    from sglang.kernels.ops.speculative.spec_tree import (
        TreeMaskMode,
        sgl_build_tree_kernel_triton,
    )

    _count("build_tree_kernel_efficient_cpu")
    sgl_build_tree_kernel_triton(
        parent_list,
        top_scores_index,
        seq_lens,
        tree_mask,
        positions,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        topk,
        spec_steps,
        num_verify_tokens,
        TreeMaskMode(int(tree_mask_mode)),
    )


def verify_tree_greedy_cpu(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    target_predict,
):
    """Stand-in for sgl_kernel's CPU op ``verify_tree_greedy_cpu``.

    Delegates to SGLang's own Triton kernel ``spec_tree.verify_tree_greedy_triton``
    (its XPU path), interpreted on CPU tensors: exact, any topk.
    """
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    _count("verify_tree_greedy_cpu")
    verify_tree_greedy_triton(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        target_predict,
    )


SGL_KERNEL_OPS_0_5_23 = {
    f.__name__: f
    for f in (
        assign_req_to_token_pool_cpu,
        assign_extend_cache_locs_cpu,
        assign_draft_cache_locs_contiguous_cpu,
        fill_bonus_tokens_cpu,
        fill_accept_out_cache_loc_cpu,
        build_tree_kernel_efficient_cpu,
        verify_tree_greedy_cpu,
    )
}


def _cpu_tree_mask_mode(original):
    def default_tree_mask_mode():
        """Logic fix (CPU only): the verify tree mask in FULL_MASK layout.

        SGLang 0.5.23 picks QLEN_ONLY on CPU, the layout its intel_amx verify
        kernel reads. This CI serves with the Triton attention backend, whose
        TARGET_VERIFY reads FULL_MASK, as on GPU (with QLEN_ONLY, topk 2
        diverged from the baseline at token 2). GPUs take FULL_MASK already.
        """
        from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode

        _count("default_tree_mask_mode(FULL_MASK)")
        return TreeMaskMode.FULL_MASK

    default_tree_mask_mode.__wrapped__ = original
    return default_tree_mask_mode


def _patch_eagle_utils_0_5_23(mod):
    if not mod._is_cpu:
        return
    fixed = _cpu_tree_mask_mode(mod.default_tree_mask_mode)
    mod.default_tree_mask_mode = fixed
    # verify_mask binds the name at import; it imports eagle_utils first, so it
    # normally gets the fixed one already. Rebind in case it was loaded before.
    vm = sys.modules.get("sglang.srt.layers.attention.verify_mask")
    if vm is not None:
        vm.default_tree_mask_mode = fixed
    _applied("eagle_utils.default_tree_mask_mode -> FULL_MASK")


def _patch_verify_mask_0_5_23(mod):
    eu = sys.modules.get("sglang.srt.speculative.eagle_utils")
    if eu is not None and eu._is_cpu:
        mod.default_tree_mask_mode = eu.default_tree_mask_mode


def _patch_speculative_hook(mod):
    def _disable_overlap_schedule_for_cpu(server_args):
        """Test switch EAGLE_GATE_CI_FORCE_OVERLAP: keep overlap on for spec on CPU.

        Replaces SGLang's CPU-only resolution that turns the overlap scheduler
        off for speculation on CPU; on GPU it returns early and does nothing,
        which is what this does everywhere.
        """
        _count("_disable_overlap_schedule_for_cpu(skipped)")

    mod._disable_overlap_schedule_for_cpu = _disable_overlap_schedule_for_cpu
    _applied("speculative_hook._disable_overlap_schedule_for_cpu -> no-op")


def _decide_cpu_seq_lens(attn_backends):
    """Test switch EAGLE_GATE_CI_CPU_SEQLENS: host seq lens in the FutureMap, or not.

    Replaces ``decide_needs_cpu_seq_lens`` (an OR over the attention backends'
    declared ``needs_cpu_seq_lens``) with the answer the scheduler gets from
    other backends on GPU: True as with FlashInfer (the FutureMap then copies
    seq_lens to the host on every resolve), False as with FA3 / trtllm_mha
    (seq_lens_cpu and seq_lens_sum stay None). Both branches are SGLang's own.
    """
    _count(f"decide_needs_cpu_seq_lens({CPU_SEQLENS})")
    return CPU_SEQLENS


def _patch_overlap_utils(mod):
    mod.decide_needs_cpu_seq_lens = _decide_cpu_seq_lens
    _applied(f"overlap_utils.decide_needs_cpu_seq_lens -> {CPU_SEQLENS}")


def _patch_scheduler(mod):
    # scheduler.py binds the name at import and calls it in init_overlap().
    mod.decide_needs_cpu_seq_lens = _decide_cpu_seq_lens
    _applied(f"scheduler.decide_needs_cpu_seq_lens -> {CPU_SEQLENS}")


def _hooks_0_5_23() -> dict:
    hooks = {
        "sgl_kernel": lambda mod: _set_sgl_kernel_ops(mod, SGL_KERNEL_OPS_0_5_23),
        "sglang.srt.speculative.eagle_utils": _patch_eagle_utils_0_5_23,
        "sglang.srt.layers.attention.verify_mask": _patch_verify_mask_0_5_23,
    }
    if FORCE_OVERLAP:
        hooks["sglang.srt.arg_groups.speculative_hook"] = _patch_speculative_hook
    if CPU_SEQLENS is not None:
        hooks["sglang.srt.managers.overlap_utils"] = _patch_overlap_utils
        hooks["sglang.srt.managers.scheduler"] = _patch_scheduler
    return hooks


# --------------------------------------------------------------------------
# Sampling kernels of a sampled (temperature > 0) verify, 0.5.9
# --------------------------------------------------------------------------
# 0.5.9's EagleVerifyInput.sample (eagle_info_v2) verifies a batch that is not
# all greedy with three sgl_kernel GPU ops, bound on CUDA only (on CPU the
# names are unbound: NameError). 0.5.23 never reaches them on CPU: its
# _verify_uses_greedy(is_cpu=True) commits argmax for sampled requests there.
# These are torch versions of the same algorithms, float32 like the kernels.
# They are exact in the sense that matters here, the same rule on the same
# probabilities; sums run in torch's order, not a CUDA block scan's, so a
# draw can differ from a GPU's only where a float rounding moves a boundary.


def _per_row(value, rows: int, dtype, device):
    import torch

    if isinstance(value, torch.Tensor):
        value = value.reshape(-1).to(device=device, dtype=dtype)
        if value.numel() == 1:
            return value.expand(rows)
        if value.numel() != rows:
            raise ValueError(f"{value.numel()} per-row values for {rows} rows")
        return value
    return torch.full((rows,), value, dtype=dtype, device=device)


def _renorm_at_or_above(probs, pivot):
    import torch

    kept = torch.where(probs >= pivot[:, None], probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_renorm_prob(probs, top_k):
    """Stand-in for sgl_kernel's ``top_k_renorm_prob`` (FlashInfer's
    ``top_k_renorm_probs``), called by 0.5.9's sampled verify.

    Per row, keeps the probabilities at or above the k-th largest (ties at the
    pivot kept, as FlashInfer's threshold does), zeroes the rest and divides
    by the kept mass. ``k >= vocab`` keeps the row (SGLang's "no top-k" is
    1 << 30). SGLang never sends ``k < 1`` (its sampling params refuse it);
    this refuses it too rather than guess.
    """
    import torch

    _count("top_k_renorm_prob")
    probs = probs.float()
    rows, vocab = probs.shape
    k = _per_row(top_k, rows, torch.int64, probs.device)
    if bool((k < 1).any()):
        raise ValueError(f"top_k_renorm_prob: top_k must be >= 1, got {k.tolist()}")
    ranked = probs.sort(dim=-1, descending=True).values
    pivot = ranked.gather(1, (k.clamp(max=vocab) - 1)[:, None]).squeeze(1)
    return _renorm_at_or_above(probs, pivot)


def top_p_renorm_prob(probs, top_p):
    """Stand-in for sgl_kernel's ``top_p_renorm_prob`` (FlashInfer's
    ``top_p_renorm_probs``), called by 0.5.9's sampled verify.

    Per row, keeps the smallest set of the highest probabilities whose mass
    reaches ``top_p`` (the highest token always; ties at the smallest kept
    probability kept, as FlashInfer's threshold does), zeroes the rest and
    divides by the kept mass. ``top_p >= 1`` keeps the row.
    """
    import torch

    _count("top_p_renorm_prob")
    probs = probs.float()
    rows, _ = probs.shape
    p = _per_row(top_p, rows, torch.float32, probs.device)
    if bool(((p <= 0) | (p > 1)).any()):
        raise ValueError(
            f"top_p_renorm_prob: top_p must be in (0, 1], got {p.tolist()}"
        )
    ranked = probs.sort(dim=-1, descending=True).values
    before = ranked.cumsum(dim=-1) - ranked  # mass of the higher-ranked tokens
    n_kept = (before < p[:, None]).sum(dim=-1).clamp(min=1)
    pivot = ranked.gather(1, (n_kept - 1)[:, None]).squeeze(1)
    pivot = torch.where(p >= 1, torch.zeros_like(pivot), pivot)
    return _renorm_at_or_above(probs, pivot)


def tree_speculative_sampling_target_only(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    uniform_samples,
    uniform_samples_for_final_sampling,
    target_probs,
    draft_probs,
    threshold_single=1.0,
    threshold_acc=1.0,
    deterministic=True,
):
    """Stand-in for sgl_kernel's ``tree_speculative_sampling_target_only``
    for a topk-1 chain (the only draft shape the gate runs), called by 0.5.9's
    sampled verify.

    The kernel's rule, per request b, on a chain of ``n`` draft tokens with
    ``m = accept_index.shape[1]`` levels and target probabilities
    ``q[b, x]`` (after temperature, top-k, top-p) at draft position x:
    starting at position 0 with coin ``u[b, 0]``, draft token
    ``candidates[b, x+1]`` is accepted when ``coin <= q[b, x][token] /
    max(threshold_acc, 1e-9)`` or ``q[b, x][token] >= threshold_single``;
    an accepted token is written to ``predicts`` at the previous accepted
    slot, its slot ``retrive_index[b, x+1]`` to ``accept_index[b, a]``, and
    the next level uses coin ``u[b, x+1]``. At the first rejection the
    kernel records ``draft_probs[b, x][token] = q[b, x][token]`` (target-only:
    the draft's distribution is taken as a point mass on its token). Then,
    with coin ``c = uniform_samples_for_final_sampling[b]``, it samples from
    ``relu(q[b, x] - draft_probs[b, x])`` (``draft_probs`` ignored when every
    level was accepted: the bonus token), taking the first index whose
    running sum exceeds ``c * total`` (the last positive index if rounding
    leaves none), and writes it to ``predicts`` at the last accepted slot;
    ``accept_token_num[b]`` is the number of accepted draft tokens.

    A tree with siblings (topk > 1) raises NotImplementedError.
    """
    import torch

    _count("tree_speculative_sampling_target_only(chain)")
    bs, n = candidates.shape
    if bs == 0:
        return
    _check_chain(
        "CPU speculative sampling", bs, n, retrive_next_token, retrive_next_sibling
    )
    levels = accept_index.shape[1]
    vocab = target_probs.shape[-1]
    q = target_probs.reshape(bs, n, vocab)
    drafts = draft_probs.reshape(bs, n, vocab)
    acc_div = max(float(threshold_acc), 1e-9)
    coins = uniform_samples.reshape(bs, n).tolist()
    final = uniform_samples_for_final_sampling.reshape(bs).to(torch.float32)
    cands = candidates.tolist()
    slots = retrive_index[:bs, :n].tolist()
    for b in range(bs):
        x, accepted = 0, 0
        last = slots[b][0]
        accept_index[b, 0] = last
        for _ in range(1, min(levels, n)):
            token = cands[b][x + 1]
            prob = float(q[b, x, token])
            if coins[b][x] <= prob / acc_div or prob >= threshold_single:
                predicts[last] = token
                x += 1
                accepted += 1
                last = slots[b][x]
                accept_index[b, accepted] = last
                continue
            drafts[b, x, token] = q[b, x, token]
            break
        accept_token_num[b] = accepted
        residual = q[b, x]
        if accepted != levels - 1:
            residual = residual - drafts[b, x]
        residual = residual.clamp(min=0)
        running = residual.cumsum(dim=0)
        threshold = (final[b] * running[-1]).reshape(1)  # float32, as the kernel
        chosen = int(torch.searchsorted(running, threshold, right=True))
        if chosen >= vocab:
            positive = torch.nonzero(residual > 0)
            chosen = int(positive[-1]) if positive.numel() else vocab - 1
        predicts[last] = chosen


# --------------------------------------------------------------------------
# SGLang 0.5.9
# --------------------------------------------------------------------------


def _is_host_only(mod) -> bool:
    """True where an SGLang module took none of its accelerator branches."""
    return not any(
        getattr(mod, flag, False) for flag in ("_is_cuda", "_is_hip", "_is_npu")
    )


def _patch_torch_0_5_9(torch):
    if not torch.cuda.is_available():
        original_sync = torch.cuda.synchronize

        def synchronize(device=None):
            """CPU-only fix: ``torch.cuda.synchronize`` without CUDA is a no-op.

            0.5.9's ``LlamaForCausalLM.set_embed`` (the draft shares the
            target's embedding) calls it unconditionally; with no CUDA device
            there is no queued GPU work to wait for.
            """
            _count("torch.cuda.synchronize(no CUDA)")

        synchronize.__wrapped__ = original_sync
        torch.cuda.synchronize = synchronize
        _applied("torch.cuda.synchronize -> no-op (no CUDA)")

    original_record = torch.Tensor.record_stream

    def record_stream(self, stream):
        """CPU-only fix: ``Tensor.record_stream`` on a CPU tensor is a no-op.

        0.5.9's ``FutureMap.resolve_future`` tells the CUDA caching allocator
        that the forward stream uses a tensor; CPU tensors reject the call
        ("unknown parameter type"), and their memory is not recycled by stream,
        so there is nothing to record. Other tensors go to torch as before.
        """
        if self.device.type == "cpu":
            _count("Tensor.record_stream(cpu no-op)")
            return None
        return original_record(self, stream)

    record_stream.__wrapped__ = original_record
    torch.Tensor.record_stream = record_stream
    _applied("Tensor.record_stream -> no-op for CPU tensors")


def _patch_eagle_utils_0_5_9(mod):
    if not _is_host_only(mod):
        return
    # build_tree_kernel_efficient calls this name, bound on CUDA/HIP only.
    mod.sgl_build_tree_kernel_efficient = build_tree_topk1
    original = mod.verify_tree_greedy_func

    def verify_tree_greedy_func(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        target_predict,
        topk=-1,
    ):
        """CPU path of 0.5.9's greedy-verify dispatcher.

        On CUDA/HIP it only calls sgl_kernel's ``verify_tree_greedy`` and returns
        the three mutated tensors; on CPU it called nothing. This calls the
        exact torch kernel ``verify_tree_greedy_topk1`` instead.
        """
        if topk > 1:
            raise NotImplementedError(f"CPU greedy verify: topk={topk}")
        verify_tree_greedy_topk1(
            predicts,
            accept_index,
            accept_token_num,
            candidates,
            retrive_index,
            retrive_next_token,
            retrive_next_sibling,
            target_predict,
        )
        return predicts, accept_index, accept_token_num

    verify_tree_greedy_func.__wrapped__ = original
    mod.verify_tree_greedy_func = verify_tree_greedy_func
    # eagle_info / eagle_info_v2 bind the name at import (after this hook ran,
    # since they import eagle_utils); rebind any already loaded.
    for name in _EAGLE_UTILS_USERS:
        user = sys.modules.get(name)
        if user is not None:
            user.verify_tree_greedy_func = verify_tree_greedy_func
    _applied("eagle_utils tree build / greedy verify -> torch topk-1")


_EAGLE_UTILS_USERS = (
    "sglang.srt.speculative.eagle_info",
    "sglang.srt.speculative.eagle_info_v2",
)


def _rebind_verify_0_5_9(mod):
    eu = sys.modules.get("sglang.srt.speculative.eagle_utils")
    fixed = getattr(eu, "verify_tree_greedy_func", None)
    if fixed is not None and hasattr(fixed, "__wrapped__"):
        mod.verify_tree_greedy_func = fixed


def _patch_eagle_info_v2_0_5_9(mod):
    _rebind_verify_0_5_9(mod)
    if not _is_host_only(mod):
        return
    original = mod.assign_extend_cache_locs_func

    def assign_extend_cache_locs_func(
        req_pool_indices,
        req_to_token,
        start_offset,
        end_offset,
        batch_size,
        draft_token_num,
        device,
    ):
        """CPU path of 0.5.9's ``assign_extend_cache_locs_func``.

        On CUDA/HIP it allocates ``batch_size * draft_token_num`` int64 slots
        and runs the Triton kernel ``assign_extend_cache_locs`` (gather each
        request's ``req_to_token[r, start:end]``, packed); on CPU it returned
        None and the verify then wrote KV at ``k_cache[None]``. This does the
        same gather in torch (exact).
        """
        import torch

        _count("assign_extend_cache_locs_func(cpu)")
        out = torch.empty(
            (batch_size * draft_token_num,), dtype=torch.int64, device=device
        )
        _gather_token_slots(
            req_pool_indices, req_to_token, start_offset, end_offset, out
        )
        return out

    assign_extend_cache_locs_func.__wrapped__ = original
    mod.assign_extend_cache_locs_func = assign_extend_cache_locs_func
    _applied("eagle_info_v2.assign_extend_cache_locs_func -> torch on CPU")
    # EagleVerifyInput.sample calls these for batches that are not all
    # greedy; 0.5.9 binds them from sgl_kernel on CUDA only.
    for fn in SAMPLING_OPS_0_5_9:
        setattr(mod, fn.__name__, fn)
    _applied("eagle_info_v2 sampled verify -> torch top-k/top-p/chain sampling")


def _patch_xgrammar_0_5_9(mod):
    def apply_vocab_mask_cpu(logits, vocab_mask):
        """CPU path of 0.5.9's grammar mask (``XGrammarGrammar.apply_vocab_mask``).

        On CUDA it applies the grammar's token bitmask to the logits with
        SGLang's Triton kernel ``apply_token_bitmask_inplace_triton``; on CPU
        it calls ``self.apply_vocab_mask_cpu``, which 0.5.9 never defines
        (AttributeError: any grammar-constrained request kills a CPU server).
        This applies the same bitmask with xgrammar's own kernel, which runs
        on CPU tensors (what 0.5.23's CPU branch calls): masked tokens' logits
        become -inf, the others are untouched. Exact.
        """
        from xgrammar import apply_token_bitmask_inplace

        _count("XGrammarGrammar.apply_vocab_mask_cpu")
        apply_token_bitmask_inplace(logits, vocab_mask.to(logits.device))

    mod.XGrammarGrammar.apply_vocab_mask_cpu = staticmethod(apply_vocab_mask_cpu)
    _applied("xgrammar_backend: grammar bitmask on CPU -> xgrammar's CPU kernel")


SAMPLING_OPS_0_5_9 = (
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
)


def _hooks_0_5_9() -> dict:
    return {
        "torch": _patch_torch_0_5_9,
        "sglang.srt.speculative.eagle_utils": _patch_eagle_utils_0_5_9,
        "sglang.srt.speculative.eagle_info": _rebind_verify_0_5_9,
        "sglang.srt.speculative.eagle_info_v2": _patch_eagle_info_v2_0_5_9,
        "sglang.srt.constrained.xgrammar_backend": _patch_xgrammar_0_5_9,
    }


# --------------------------------------------------------------------------
# The gate's plain-step CUDA graphs, constructed without capture (T2)
# --------------------------------------------------------------------------


def _patch_gate_plain_graphs(mod):
    """Test switch EAGLE_GATE_CI_PLAIN_GRAPHS=construct (see the module doc)."""
    original = mod.plain_graphs_for_scheduler

    def plain_graphs_for_scheduler(adapter, scheduler, config, **kwargs):
        graphs = original(adapter, scheduler, config, **kwargs)
        if kwargs.get("gated") and graphs.reason == "device_not_cuda":
            try:
                graphs.report = _construct_plain_graphs(mod, adapter, scheduler)
            except Exception as exc:  # the test reads it from the status
                graphs.report = {"error": repr(exc)}
            _count("plain_graphs(construct)")
        return graphs

    mod.plain_graphs_for_scheduler = plain_graphs_for_scheduler
    _applied("eagle_gate plain graphs: construct without capture")


def _patch_gate_plain_temperature(mod):
    """Test switch EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE (see the module doc)."""
    original = mod.plain_step
    path = PLAIN_TEMPERATURE_FILE

    def plain_step(parts, worker, batch, *args, **kwargs):
        try:
            with open(path) as f:
                scale = float(f.read())
        except FileNotFoundError:
            return original(parts, worker, batch, *args, **kwargs)
        info = batch.sampling_info
        temperatures = info.temperatures
        info.temperatures = temperatures * scale
        _count("plain_step(temperature scaled)")
        try:
            return original(parts, worker, batch, *args, **kwargs)
        finally:
            info.temperatures = temperatures

    plain_step.__wrapped__ = original
    mod.plain_step = plain_step
    _applied("eagle_gate plain step: temperature scaled while the switch file exists")


def _count_calls(obj, name: str, counts: dict, key: str) -> None:
    """Count calls of ``obj.name`` (an instance attribute shadowing the method)."""
    method = getattr(obj, name)

    def counted(*args, **kwargs):
        counts[key] = counts.get(key, 0) + 1
        return method(*args, **kwargs)

    setattr(obj, name, counted)


def _construct_plain_graphs(base, adapter, scheduler) -> dict:
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )

    mr = base.target_model_runner(scheduler)
    ndt = int(scheduler.draft_worker.speculative_num_draft_tokens)
    before = {
        "attn_backend": mr.attn_backend,
        "graph": getattr(mr, adapter.GRAPH_ATTR, None),
        "spec_algorithm": mr.spec_algorithm,
        "aux": getattr(mr, "eagle_use_aux_hidden_state", None),
        "layers": list(
            getattr(getattr(mr.model, "model", None), "layers_to_capture", []) or []
        ),
        "init_new_workspace": getattr(mr, "init_new_workspace", None),
    }
    counts: dict = {}
    captures: list = []

    class Construct(adapter._plain_runner_cls()):
        def capture(self, *args, **kwargs):
            captures.append(1)  # a CUDA graph cannot be recorded on CPU

    if sglang_version() == "0.5.9":
        from sglang.srt.model_executor.cuda_graph_runner import (
            get_batch_sizes_to_capture,
        )
    else:
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import (
            get_batch_sizes_to_capture,
        )
    expected_bs, _ = get_batch_sizes_to_capture(mr, ndt)
    shared = {}
    if getattr(mr, "graph_shared_output", False) is None:
        # 0.5.23 creates its process-shared logits buffer only where decode
        # graphs are on (never on CPU); on a GPU the verify set's buffer
        # (max_bs * num_draft_tokens rows) is there and holds the plain set's.
        from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

        shared["graph_shared_output"] = GraphSharedOutput(
            device=mr.device, max_rows=max(expected_bs) * ndt
        )
    _count_calls(mr.attn_backend, "init_cuda_graph_state", counts, "verify_backend")
    try:
        backend = adapter.build_plain_backend(mr)
        _count_calls(backend, "init_cuda_graph_state", counts, "plain_backend")
        with base.swap_attrs(mr, **shared):
            runner = adapter.build_plain_runner(mr, backend, cls=Construct)
    finally:
        del mr.attn_backend.init_cuda_graph_state  # the class's method again
    if sglang_version() == "0.5.9":
        width = runner.num_tokens_per_bs
    else:
        width = runner.captured_req_width
    after_layers = list(
        getattr(getattr(mr.model, "model", None), "layers_to_capture", []) or []
    )
    graphs = base.PlainGraphs(
        state="captured",
        runner=runner,
        backend=backend,
        capture_bs=tuple(runner.capture_bs),
        max_bs=int(runner.max_bs),
        disable_padding=bool(runner.disable_padding),
    )
    agree = {}
    for bs in sorted({1, runner.max_bs, runner.max_bs + 1}):
        for hidden in (
            CaptureHiddenMode.NULL,
            CaptureHiddenMode.LAST,
            CaptureHiddenMode.FULL,
        ):
            batch = SimpleNamespace(
                batch_size=bs,
                forward_mode=ForwardMode.DECODE,
                capture_hidden_mode=hidden,
                spec_info=None,
                replace_embeds=None,
                encoder_lens=None,
                can_run_tbo=False,
                lora_ids=None,
                input_ids=SimpleNamespace(numel=lambda bs=bs: bs),
                global_num_tokens_cpu=None,
            )
            check = getattr(runner, "can_run", None) or runner.can_run_graph
            try:
                ran = bool(check(batch))
            except Exception as exc:
                ran = repr(exc)
            agree[f"{bs}:{hidden.name}"] = [
                ran,
                base.select_plain_path(graphs, bs)[0] == "graph",
            ]
    report = {
        "runner_class": type(runner).__mro__[1].__name__,
        "shared_logits_stand_in": bool(shared),
        "captures_stubbed": len(captures),
        "forward_mode": runner.capture_forward_mode.name,
        "width": int(width),
        "hidden_mode": CaptureHiddenMode(runner.capture_hidden_mode).name,
        "spec_info_none": runner.get_spec_info(int(runner.max_bs)) is None,
        "capture_bs": sorted(set(runner.capture_bs)),
        "expected_bs": sorted(set(expected_bs)),
        "max_bs": int(runner.max_bs),
        "backend_class": type(backend).__name__,
        "verify_backend_class": type(before["attn_backend"]).__name__,
        "backend_is_new": backend is not before["attn_backend"],
        "runner_backend_is_plain": getattr(runner, "attn_backend", backend) is backend,
        "init_cuda_graph_state": {
            "plain_backend": counts.get("plain_backend", 0),
            "verify_backend": counts.get("verify_backend", 0),
        },
        "model_runner_unchanged": {
            "attn_backend": mr.attn_backend is before["attn_backend"],
            "graph_attr": getattr(mr, adapter.GRAPH_ATTR, None) is before["graph"],
            "spec_algorithm": mr.spec_algorithm is before["spec_algorithm"],
            "eagle_use_aux_hidden_state": getattr(
                mr, "eagle_use_aux_hidden_state", None
            )
            == before["aux"],
            "layers_to_capture": after_layers == before["layers"],
            "init_new_workspace": getattr(mr, "init_new_workspace", None)
            == before["init_new_workspace"],
        },
        "can_run_vs_select": agree,
    }
    if hasattr(runner, "capture_prepare"):
        try:
            fb = runner.capture_prepare(1)
            fb = fb[0] if isinstance(fb, tuple) else fb
            fb = getattr(fb, "forward_batch", fb)
            report["capture_prepare"] = {
                "forward_mode": fb.forward_mode.name,
                "spec_info_none": fb.spec_info is None,
                "hidden_mode": CaptureHiddenMode(fb.capture_hidden_mode).name,
                "input_ids": int(fb.input_ids.numel()),
            }
        except Exception as exc:
            report["capture_prepare"] = {"error": repr(exc)}
    del graphs, runner, backend
    return report


# --------------------------------------------------------------------------
# DP attention on CPU (EAGLE_GATE_CI_DP=1), both versions
# --------------------------------------------------------------------------


def _cpu_graph_seq_len_fill_value(self):
    """Stand-in for ``AttentionBackend.get_cpu_graph_seq_len_fill_value``.

    DP attention pads a rank's batch to the size the ranks agreed on
    (``ForwardBatch._pad_inputs_to_size``); the padded rows get this sequence
    length. On CPU 0.5.23 asks the backend's CPU-graph value, which only the
    Intel AMX and hybrid backends define (1); a GPU asks the CUDA-graph value,
    1 for Triton and FlashInfer. The padded rows are dummies whose outputs
    are dropped after the MLP: each attends one slot, and no real row reads
    them, so 1 is exact for the real rows, as on a GPU.
    """
    _count("get_cpu_graph_seq_len_fill_value(1)")
    return 1


def _patch_attn_base_dp(mod):
    cls = mod.AttentionBackend
    if "get_cpu_graph_seq_len_fill_value" not in cls.__dict__:
        cls.get_cpu_graph_seq_len_fill_value = _cpu_graph_seq_len_fill_value
        _applied("AttentionBackend.get_cpu_graph_seq_len_fill_value -> 1")


def _dp_hooks_0_5_23() -> dict:
    return {
        "sglang.srt.layers.attention.base_attn_backend": _patch_attn_base_dp,
    }


def _cuda_graph_seq_len_fill_value_0_5_9(self):
    """Stand-in for ``get_cuda_graph_seq_len_fill_value`` of 0.5.9's
    torch_native backend, which raises NotImplementedError.

    0.5.9's ``ForwardBatch._pad_inputs_to_size`` asks every backend for this
    value, on every device, when DP attention pads a rank's batch. The CPU's
    own backend (intel_amx, ``get_graph_seq_len_fill_value``) and the GPU
    backends (Triton, FlashInfer) answer 1; torch_native, which a CPU without
    AMX falls back to, never says. The padded rows are dummies whose outputs
    are dropped; 1 lets each attend one slot, as on those backends.
    """
    _count("get_cuda_graph_seq_len_fill_value(1)")
    return 1


def _patch_torch_native_0_5_9(mod):
    cls = mod.TorchNativeAttnBackend
    if "get_cuda_graph_seq_len_fill_value" not in cls.__dict__:
        cls.get_cuda_graph_seq_len_fill_value = _cuda_graph_seq_len_fill_value_0_5_9
        _applied("TorchNativeAttnBackend.get_cuda_graph_seq_len_fill_value -> 1")


def memcpy_rows(dst, src, dim, offset, sz, offset_src):
    """Stand-in for 0.5.9's ``dp_attention.memcpy_triton`` on CPU tensors.

    The Triton kernel copies ``sz`` rows: ``src[offset:offset+sz]`` to
    ``dst[:sz]`` when ``offset_src``, else ``src[:sz]`` to
    ``dst[offset:offset+sz]`` (``offset`` and ``sz`` may be 1-element tensors,
    as the kernel loads them). 0.5.9 calls it on every device in the DP
    gather and scatter; a CPU has no Triton driver (0.5.23 calls its own torch
    ``memcpy_cpu`` there instead). The same row copy in torch: exact.
    """
    _count("dp_attention.memcpy_triton(torch copy)")
    if dim != 0:
        raise ValueError("dim != 0 unsupported")
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError("src and dst must have same trailing shape")
    offset, sz = int(offset), int(sz)
    if sz <= 0:
        return
    if offset_src:
        dst[:sz].copy_(src[offset : offset + sz])
    else:
        dst[offset : offset + sz].copy_(src[:sz])


def _patch_dp_attention_0_5_9(mod):
    if not mod.torch.cuda.is_available():
        original = mod.memcpy_triton
        memcpy_rows.__wrapped__ = original
        mod.memcpy_triton = memcpy_rows
        _applied("dp_attention.memcpy_triton -> torch row copy (no CUDA)")


class _TorchWithoutPinning:
    """``torch`` as 0.5.9's ``forward_batch_info`` sees it on a host without CUDA.

    Stand-in for pinned host memory, a CUDA feature: 0.5.9's
    ``ForwardBatch.prepare_mlp_sync_batch`` (DP attention) builds the gathered
    token counts with ``torch.tensor(..., pin_memory=True)`` before copying
    them to the device, and a CPU-only torch refuses to pin (0.5.23 passes
    ``pin_memory=not _is_cpu`` there). Pinning only speeds a host-to-device
    copy up; the tensor holds the same numbers without it, so dropping the
    flag is exact. Everything else is torch itself.
    """

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def tensor(self, *args, pin_memory=False, **kwargs):
        if pin_memory:
            _count("forward_batch_info torch.tensor(pin_memory dropped)")
        return self._torch.tensor(*args, **kwargs)


def _patch_forward_batch_info_0_5_9(mod):
    if not mod.torch.cuda.is_available():
        mod.torch = _TorchWithoutPinning(mod.torch)
        _applied("forward_batch_info: torch.tensor(pin_memory=True) unpinned (no CUDA)")


def _patch_parallel_state_0_5_9(mod):
    """CPU tensors skip 0.5.9's ``reg_*`` custom-op wrappers of two collectives.

    ``GroupCoordinator.all_gather_into_tensor`` and ``reduce_scatter_tensor``
    call the custom ops ``sglang::reg_all_gather_into_tensor`` /
    ``reg_reduce_scatter_tensor`` (registered for the accelerator, so a CPU
    tensor finds no kernel: NotImplementedError); NPU (and XPU for the gather)
    call the bodies directly. Each op's body is exactly
    ``group._all_gather_into_tensor(output, input)`` /
    ``group._reduce_scatter_tensor(output, input)``; this calls those for CPU
    tensors, the same collective (gloo here). CUDA tensors go through the ops
    as before. DP attention gathers MLP inputs with the first.
    """
    cls = mod.GroupCoordinator
    gather, scatter = cls.all_gather_into_tensor, cls.reduce_scatter_tensor

    def all_gather_into_tensor(self, output, input):
        if input.device.type != "cpu":
            return gather(self, output, input)
        _count("GroupCoordinator.all_gather_into_tensor(cpu, direct)")
        return self._all_gather_into_tensor(output, input)

    def reduce_scatter_tensor(self, output, input):
        if input.device.type != "cpu":
            return scatter(self, output, input)
        _count("GroupCoordinator.reduce_scatter_tensor(cpu, direct)")
        self._reduce_scatter_tensor(output, input)
        return output

    all_gather_into_tensor.__wrapped__ = gather
    reduce_scatter_tensor.__wrapped__ = scatter
    cls.all_gather_into_tensor = all_gather_into_tensor
    cls.reduce_scatter_tensor = reduce_scatter_tensor
    _applied("GroupCoordinator gather/reduce-scatter into tensor: CPU direct")


def _patch_eagle_info_dp_0_5_9(mod):
    """0.5.9's ``EagleVerifyInput.create_idle_input`` on a host without CUDA.

    An idle DP-attention rank's draft step returns this empty verify input;
    0.5.9 allocates its six zero-row tensors with ``device="cuda"`` (0.5.23
    takes the device from the caller). Stand-in for that device: the same
    zero-row tensors, dtypes and fill values on the CPU; every other field as
    SGLang sets it. Zero rows hold no values, so this is exact.
    """
    import torch

    if torch.cuda.is_available():
        return
    cls = mod.EagleVerifyInput
    original = cls.create_idle_input

    def create_idle_input(klass, topk, spec_steps, num_verify_tokens):
        _count("EagleVerifyInput.create_idle_input(cpu)")
        empty = (0, num_verify_tokens)
        return klass(
            draft_token=torch.empty((0,), dtype=torch.long),
            custom_mask=torch.full((0,), True, dtype=torch.bool),
            positions=torch.empty((0,), dtype=torch.int64),
            retrive_index=torch.full(empty, -1, dtype=torch.long),
            retrive_next_token=torch.full(empty, -1, dtype=torch.long),
            retrive_next_sibling=torch.full(empty, -1, dtype=torch.long),
            retrive_cum_len=None,
            topk=topk,
            draft_token_num=num_verify_tokens,
            spec_steps=spec_steps,
            capture_hidden_mode=mod.CaptureHiddenMode.FULL,
            seq_lens_sum=0,
            seq_lens_cpu=torch.empty((0,), dtype=torch.int32),
        )

    create_idle_input.__wrapped__ = original
    cls.create_idle_input = classmethod(create_idle_input)
    _applied("EagleVerifyInput.create_idle_input -> CPU tensors (no CUDA)")


def _dp_hooks_0_5_9() -> dict:
    return {
        "sglang.srt.speculative.eagle_info": _patch_eagle_info_dp_0_5_9,
        "sglang.srt.distributed.parallel_state": _patch_parallel_state_0_5_9,
        "sglang.srt.model_executor.forward_batch_info": _patch_forward_batch_info_0_5_9,
        "sglang.srt.layers.attention.torch_native_backend": _patch_torch_native_0_5_9,
        "sglang.srt.layers.dp_attention": _patch_dp_attention_0_5_9,
    }


DP_HOOKS_BY_VERSION = {"0.5.9": _dp_hooks_0_5_9, "0.5.23": _dp_hooks_0_5_23}


def install_dp() -> bool:
    """Register the DP-attention hooks for the installed SGLang; True if any."""
    version = sglang_version()
    make_hooks = DP_HOOKS_BY_VERSION.get(version or "")
    if make_hooks is None:
        print(
            f"{PREFIX} EAGLE_GATE_CI_DP=1 but SGLang {version} has no CPU "
            f"DP-attention shims (known: {', '.join(DP_HOOKS_BY_VERSION)})",
            file=sys.stderr,
        )
        return False
    import wrapt

    for module_name, hook in make_hooks().items():
        wrapt.register_post_import_hook(hook, module_name)
    _log(f"installed DP-attention stand-ins for SGLang {version}")
    return True


# --------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------


def _set_sgl_kernel_ops(mod, ops: dict) -> None:
    if STUB_MARK not in str(getattr(mod, "__version__", "")):
        _log(f"sgl_kernel {getattr(mod, '__version__', '?')} is real: left alone")
        return
    for name, fn in ops.items():
        setattr(mod, name, fn)
    _applied(f"sgl_kernel stand-in ops: {', '.join(sorted(ops))}")


def _applied(what: str) -> None:
    _INSTALLED.append(what)
    _log(f"patched {what}")


HOOKS_BY_VERSION = {"0.5.9": _hooks_0_5_9, "0.5.23": _hooks_0_5_23}


def sglang_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def install() -> bool:
    """Register the post-import hooks for the installed SGLang; True if any."""
    version = sglang_version()
    make_hooks = HOOKS_BY_VERSION.get(version or "")
    if make_hooks is None:
        print(
            f"{PREFIX} EAGLE_GATE_CI_SPEC=1 but SGLang {version} has no CPU "
            f"speculative shims (known: {', '.join(HOOKS_BY_VERSION)})",
            file=sys.stderr,
        )
        return False
    if os.environ.get("TRITON_INTERPRET") != "1":
        _log("TRITON_INTERPRET is not 1: SGLang's Triton kernels need it on CPU")
    import wrapt

    hooks = make_hooks()
    if PLAIN_GRAPHS == "construct":
        hooks["eagle_gate.adapters.plain.capture"] = _patch_gate_plain_graphs
    if PLAIN_TEMPERATURE_FILE:
        hooks["eagle_gate.adapters.plain.step"] = _patch_gate_plain_temperature
    for module_name, hook in hooks.items():
        wrapt.register_post_import_hook(hook, module_name)
    _log(f"installed for SGLang {version}")
    return True


if ENABLED:
    install()
if DP:
    install_dp()
