"""SGLang 0.5.23 on CPU: ``torch.cuda.synchronize`` is a no-op without CUDA.

0.5.23's ``Glm4MoeForCausalLM.set_embed_and_head`` (``models/glm4_moe.py``),
which the EAGLE worker calls on a GLM-4.5 NextN draft so that it shares the
target's embedding and head, ends with ``torch.cuda.empty_cache()`` and
``torch.cuda.synchronize()``. The first does nothing without CUDA; the second
raises "Torch not compiled with CUDA enabled" on a CPU-only torch, so the draft
worker never starts. It is a GPU-only call: it waits for queued CUDA work, and
on a host without CUDA there is none, so returning at once is exact. With CUDA
present torch's own function stays in place. (0.5.9 gets the same no-op from
``v0_5_9._patch_torch_0_5_9``, for its ``LlamaForCausalLM.set_embed``.)
"""

from __future__ import annotations

from eagle_gate_ci_spec.core import _applied, _count


def patch_cuda_synchronize(torch) -> None:
    if torch.cuda.is_available():
        return
    original = torch.cuda.synchronize
    if getattr(original, "__wrapped__", None) is not None:
        return  # already a stand-in

    def synchronize(device=None):
        """CPU-only: no CUDA, no queued GPU work to wait for."""
        _count("torch.cuda.synchronize(no CUDA)")

    synchronize.__wrapped__ = original
    torch.cuda.synchronize = synchronize
    _applied("torch.cuda.synchronize -> no-op (no CUDA)")
