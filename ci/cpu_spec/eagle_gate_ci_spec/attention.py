"""Torch stand-ins for SGLang's two Triton attention kernels, decode and extend,
on CPU (both versions).

What they replace: ``decode_attention_fwd`` and ``extend_attention_fwd`` of
SGLang's Triton attention backend (0.5.9:
``sglang.srt.layers.attention.triton_ops``; 0.5.23:
``sglang.kernels.ops.attention``), which on CPU run under the Triton
interpreter (``TRITON_INTERPRET=1``): numpy, one program instance at a time.
That was most of a speculative server's step on two cores (about 0.5 s a
verify step, ``../shared/notes/cpu-eagle.md``), and so most of the suite's time.

Why they are exact: each computes the function the kernel computes, softmax
over the visible keys of ``q . k * sm_scale`` times ``v``, with the kernel's
own visibility rules read off its source:

* decode: every key of the request (``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``);
  the split-KV scratch buffers (``attn_logits``, ``attn_lse``) are the
  kernel's intermediate state, read by nothing after it;
* extend: the prefix keys (through ``kv_indices``) then the request's own
  extend keys; a custom mask (``mask_indptr``; row ``r`` of a request starts
  at ``r * (prefix + extend)``) applies to the extend part, and to the prefix
  too unless ``skip_prefix_custom_mask``; otherwise causal or not. With both a
  custom mask and ``is_causal`` the kernel visits extend keys only up to the
  end of the query's ``BLOCK_M`` tile: so does this (the same block size,
  from the kernel's own ``_get_block_sizes_for_extend_attention``).

Only the float summation order differs (one softmax over all keys against the
kernel's online, tiled one): in float32, results agree with the interpreted
kernel to about 1e-6, which ``tests/servers/test_cpu_spec_env.py`` checks on
the shapes the servers use. Rows with no visible key give NaN in both.

Anything else the kernels support (sliding windows, logit caps, sinks, xai
temperature, paged or 4-D KV buffers, fp8 scales, score mods, LSE outputs,
the DCP skip flags) goes to the real kernel, interpreted, as before; so does
everything when ``EAGLE_GATE_CI_ATTENTION=triton`` (the stock check of
``test_cpu_spec_env.py`` runs so, keeping the real kernels served end to end).
Calls are counted per path (``calls()``: ``decode_attention_fwd(torch)``,
``decode_attention_fwd(interpreted)`` and the same for extend), so a server
log with the stand-ins' log on says which ran.
"""

from __future__ import annotations

import functools
import inspect

from eagle_gate_ci_spec.core import ATTENTION, _applied, _count

#: the modules holding the two kernels' launchers, by SGLang version.
KERNEL_MODULES = {
    "0.5.9": (
        "sglang.srt.layers.attention.triton_ops.decode_attention",
        "sglang.srt.layers.attention.triton_ops.extend_attention",
    ),
    "0.5.23": (
        "sglang.kernels.ops.attention.decode_attention",
        "sglang.kernels.ops.attention.extend_attention",
    ),
}


def _plain_buffers(*tensors) -> bool:
    """3-D token-major float32 tensors. In half precision the kernels round
    the probabilities to the value type before the second product, which a
    float32 softmax would not: those calls go to the real kernel."""
    import torch

    return all(t.dim() == 3 and t.dtype == torch.float32 for t in tensors)


def _attend(q, k, v, sm_scale, visible=None):
    """Softmax attention of ``q`` [m, H, D] over ``k``, ``v`` [n, Hkv, D(v)]
    (grouped heads repeated), in float32; ``visible`` [m, n] bool or None."""
    import torch

    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k.float()) * sm_scale
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.einsum("hmn,nhd->mhd", torch.softmax(scores, dim=-1), v.float())
    return out


_DECODE_PLAIN = {
    "logit_cap": 0.0, "sinks": None, "xai_temperature_len": -1, "has_mla": False,
    "page_size": 1, "score_mod": None, "k_scale": 1.0, "v_scale": 1.0,
}  # fmt: skip
_EXTEND_PLAIN = {
    "logit_cap": 0.0, "sliding_window_size": -1, "sinks": None,
    "window_kv_offsets": None, "xai_temperature_len": -1, "lse_extend": None,
    "skip_prefix": False, "skip_extend": False, "page_size": 1, "score_mod": None,
    "k_scale": 1.0, "v_scale": 1.0,
}  # fmt: skip


def _plain(a: dict, plain: dict) -> bool:
    """True where every feature argument the call has is at its plain value.

    0.5.23's decode arguments not listed change where work runs on ROCm only
    (``enable_lean``, the ``lean_*`` buffers, ``uneven_batch``: the kernel
    takes those paths under ``_is_hip`` alone), never a result on CPU."""
    for name, value in plain.items():
        if name not in a:
            continue
        got = a[name]
        if value is None:
            if got is not None:
                return False
        elif isinstance(value, bool):
            if got is not value:
                return False
        elif got is None or hasattr(got, "shape") or float(got) != float(value):
            return False
    return True


def decode(a: dict) -> bool:
    """``decode_attention_fwd``, arguments bound by name; False if not served."""
    q, o = a["q"], a["o"]
    k_buffer, v_buffer = a["k_buffer"], a["v_buffer"]
    if not (_plain(a, _DECODE_PLAIN) and _plain_buffers(q, k_buffer, v_buffer)):
        return False
    bounds = a["kv_indptr"][: q.shape[0] + 1].tolist()
    if any(bounds[j + 1] <= bounds[j] for j in range(q.shape[0])):
        return False
    kv_indices, sm_scale = a["kv_indices"], a["sm_scale"]
    for i in range(q.shape[0]):
        index = kv_indices[bounds[i] : bounds[i + 1]]
        out = _attend(q[i : i + 1], k_buffer[index], v_buffer[index], sm_scale)
        o[i] = out[0].to(o.dtype)
    return True


def extend(a: dict, block_m: int) -> bool:
    """``extend_attention_fwd``, arguments bound by name; False if not served."""
    import torch

    q_extend, k_extend, v_extend = a["q_extend"], a["k_extend"], a["v_extend"]
    k_buffer, v_buffer, o_extend = a["k_buffer"], a["v_buffer"], a["o_extend"]
    if not (
        _plain(a, _EXTEND_PLAIN)
        and _plain_buffers(q_extend, k_extend, v_extend, k_buffer, v_buffer)
    ):
        return False
    custom_mask, is_causal = a["custom_mask"], a["is_causal"]
    sm_scale = a["sm_scale"] or 1.0 / (q_extend.shape[-1] ** 0.5)
    qo = a["qo_indptr"].tolist()
    kv = a["kv_indptr"].tolist()
    kv_indices = a["kv_indices"]
    masks = a["mask_indptr"].tolist() if custom_mask is not None else None
    for i in range(len(qo) - 1):
        start, m = qo[i], qo[i + 1] - qo[i]
        if m <= 0:
            continue
        prefix = kv[i + 1] - kv[i]
        n = prefix + m
        index = kv_indices[kv[i] : kv[i + 1]]
        keys = torch.cat([k_buffer[index], k_extend[start : start + m]])
        values = torch.cat([v_buffer[index], v_extend[start : start + m]])
        rows = torch.arange(m).unsqueeze(1)
        cols = torch.arange(m).unsqueeze(0)
        if custom_mask is not None:
            flat = custom_mask[masks[i] : masks[i] + m * n].view(m, n) != 0
            own = flat[:, prefix:]
            if is_causal:  # the kernel stops at the end of the query's tile
                own = own & (cols < (rows // block_m + 1) * block_m)
            head = flat[:, :prefix]
            if a["skip_prefix_custom_mask"]:
                head = torch.ones_like(head)
        else:
            own = rows >= cols if is_causal else torch.ones(m, m, dtype=torch.bool)
            head = torch.ones(m, prefix, dtype=torch.bool)
        visible = torch.cat([head, own], dim=1)
        out = _attend(q_extend[start : start + m], keys, values, sm_scale, visible)
        o_extend[start : start + m] = out.to(o_extend.dtype)
    return True


def _stand_in(mod, name: str, serve) -> None:
    """Replace ``mod.<name>`` by a launcher that tries ``serve(bound
    arguments, mod)`` first and calls the real kernel where it declines."""
    original = getattr(mod, name)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def launcher(*args, **kw):
        bound = signature.bind(*args, **kw)
        bound.apply_defaults()
        if ATTENTION == "torch" and serve(bound.arguments, mod):
            _count(f"{name}(torch)")
            return None
        _count(f"{name}(interpreted)")
        return original(*args, **kw)

    launcher.__wrapped__ = original
    setattr(mod, name, launcher)
    _applied(f"{mod.__name__}.{name} -> {ATTENTION} (plain cases)")


def _patch_decode(mod):
    _stand_in(mod, "decode_attention_fwd", lambda a, _mod: decode(a))


def _patch_extend(mod):
    def serve(a, mod):
        # the kernel's own tile height (the causal + custom-mask bound)
        sizes = mod._get_block_sizes_for_extend_attention(
            a["q_extend"].shape[-1], a["v_extend"].shape[-1]
        )
        return extend(a, sizes[3])

    _stand_in(mod, "extend_attention_fwd", serve)


def hooks(version: str) -> dict:
    """Post-import hooks replacing the two launchers of ``version``."""
    decode_module, extend_module = KERNEL_MODULES[version]
    return {decode_module: _patch_decode, extend_module: _patch_extend}
