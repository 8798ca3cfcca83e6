"""DP attention on CPU (``EAGLE_GATE_CI_DP=1``), both versions: what SGLang's
``--enable-dp-attention --dp-size 2 --tp 2`` needs on a CPU-only host (see
the package doc).
"""

from __future__ import annotations

from eagle_gate_ci_spec.core import _applied, _count


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


HOOKS_BY_VERSION = {"0.5.9": _dp_hooks_0_5_9, "0.5.23": _dp_hooks_0_5_23}
