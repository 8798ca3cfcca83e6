"""SGLang 0.5.9 on CPU: no-ops for GPU-only calls on CPU tensors, CPU paths
where a kernel dispatcher has no CPU branch (tree build, greedy verify, extend
cache locations, the sampled verify's kernels, the grammar mask).
"""

from __future__ import annotations

import sys

from eagle_gate_ci_spec.core import _applied, _count
from eagle_gate_ci_spec.kernels import (
    _gather_token_slots,
    build_tree_topk1,
    verify_tree_greedy_topk1,
)
from eagle_gate_ci_spec.v0_5_9_sampling import SAMPLING_OPS_0_5_9


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


def hooks() -> dict:
    return {
        "torch": _patch_torch_0_5_9,
        "sglang.srt.speculative.eagle_utils": _patch_eagle_utils_0_5_9,
        "sglang.srt.speculative.eagle_info": _rebind_verify_0_5_9,
        "sglang.srt.speculative.eagle_info_v2": _patch_eagle_info_v2_0_5_9,
        "sglang.srt.constrained.xgrammar_backend": _patch_xgrammar_0_5_9,
    }
