"""SGLang 0.5.23 on CPU: the ``sgl_kernel`` CPU ops its ``_is_cpu`` branches
import, the verify tree-mask layout fix, and the test switches
``EAGLE_GATE_CI_FORCE_OVERLAP`` and ``EAGLE_GATE_CI_CPU_SEQLENS``.
"""

from __future__ import annotations

import sys

from eagle_gate_ci_spec.core import (
    CPU_SEQLENS,
    FORCE_OVERLAP,
    _applied,
    _count,
    _set_sgl_kernel_ops,
)
from eagle_gate_ci_spec.kernels import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
)


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


def hooks() -> dict:
    from eagle_gate_ci_spec.no_cuda import patch_cuda_synchronize

    hooks = {
        "torch": patch_cuda_synchronize,  # GLM-4.5 NextN: set_embed_and_head
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
