"""The torch attention stand-ins of ``ci/cpu_spec`` against SGLang's own Triton
kernels, interpreted, on the same random inputs.

Run as ``python -m support.attention_check`` (``PYTHONPATH=tests``) with
``TRITON_INTERPRET=1`` and ``EAGLE_GATE_CI_ATTENTION=triton`` (the real
kernels stay unpatched in this process): prints one JSON object, the SGLang
version, the kernel's tile height and each case's largest absolute difference
between the stand-in's output and the kernel's (a case the stand-in declines
fails an assertion instead). The cases are the shapes the CI servers run
(head dim 16, 4 heads, MHA and 2-way GQA, float32): decode over ragged
lengths; extend with a prefix, causal; extend without a prefix, not causal;
the verify's tree mask (custom mask, causal, prefix unmasked) over more rows
than one tile, so the kernel's tile bound counts; a custom mask over the
prefix too.
"""

from __future__ import annotations

import inspect
import json
import os

import torch

HEAD_DIM = 16
HEADS = 4


def _kernels():
    from eagle_gate_ci_spec.core import sglang_version

    version = sglang_version()
    from eagle_gate_ci_spec.attention import KERNEL_MODULES

    decode_name, extend_name = KERNEL_MODULES[version]
    import importlib

    return (
        version,
        importlib.import_module(decode_name),
        importlib.import_module(extend_name),
    )


def _kv(tokens: int, kv_heads: int, g):
    k = torch.randn(tokens, kv_heads, HEAD_DIM, generator=g)
    v = torch.randn(tokens, kv_heads, HEAD_DIM, generator=g)
    return k, v


def _bind(fn, **given):
    """Positional-or-keyword call arguments of ``fn`` from ``given`` (0.5.9's
    and 0.5.23's signatures differ: 0.5.23 adds k_scale, v_scale)."""
    names = inspect.signature(fn).parameters
    return {k: v for k, v in given.items() if k in names}


def decode_case(mod, kv_heads: int, lengths: list[int], g) -> float:
    from eagle_gate_ci_spec import attention

    bs = len(lengths)
    k_buffer, v_buffer = _kv(4 * sum(lengths) + 8, kv_heads, g)
    perm = torch.randperm(k_buffer.shape[0], generator=g)
    kv_indptr = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    kv_indices = perm[: sum(lengths)].to(torch.int64)
    q = torch.randn(bs, HEADS, HEAD_DIM, generator=g)
    splits = 1
    given = dict(
        q=q, k_buffer=k_buffer, v_buffer=v_buffer, kv_indptr=kv_indptr,
        kv_indices=kv_indices, attn_lse=torch.empty(bs, HEADS, splits),
        attn_logits=torch.empty(bs, HEADS, splits, HEAD_DIM),
        num_kv_splits=torch.full((bs,), splits, dtype=torch.int32),
        max_kv_splits=splits, sm_scale=HEAD_DIM**-0.5, k_scale=1.0, v_scale=1.0,
    )  # fmt: skip
    want = torch.zeros(bs, HEADS, HEAD_DIM)
    mod.decode_attention_fwd(o=want, **_bind(mod.decode_attention_fwd, **given))
    got = torch.zeros(bs, HEADS, HEAD_DIM)
    args = inspect.signature(mod.decode_attention_fwd).bind(
        o=got, **_bind(mod.decode_attention_fwd, **given)
    )
    args.apply_defaults()
    assert attention.decode(args.arguments), "the stand-in declined"
    return float((got - want).abs().max())


def extend_case(mod, kv_heads, prefixes, extends, g, *, causal, mask=None) -> float:
    """``mask``: None, "tree" (a random mask over the extend part with the
    diagonal visible, prefix visible; with ``causal`` the kernel reads it only
    up to the end of each row's tile) or "full" (a random mask over prefix and
    extend, ``skip_prefix_custom_mask`` False)."""
    from eagle_gate_ci_spec import attention

    total = sum(extends)
    k_buffer, v_buffer = _kv(4 * (sum(prefixes) + total) + 8, kv_heads, g)
    perm = torch.randperm(k_buffer.shape[0], generator=g)
    kv_indptr = torch.tensor([0, *torch.tensor(prefixes).cumsum(0).tolist()])
    kv_indices = perm[: sum(prefixes)].to(torch.int64)
    qo_indptr = torch.tensor([0, *torch.tensor(extends).cumsum(0).tolist()])
    q = torch.randn(total, HEADS, HEAD_DIM, generator=g)
    k_extend, v_extend = _kv(total, kv_heads, g)
    custom_mask = mask_indptr = None
    if mask is not None:
        parts, starts = [], [0]
        for p, m in zip(prefixes, extends, strict=True):
            rows = torch.rand(m, p + m, generator=g) < 0.6
            if mask == "tree":  # upper entries too: the tile bound drops them
                rows[:, p:] |= torch.eye(m, dtype=torch.bool)
            parts.append(rows.flatten())
            starts.append(starts[-1] + (p + m) * m)
        custom_mask = torch.cat(parts)
        mask_indptr = torch.tensor(starts)
    given = dict(
        q_extend=q, k_extend=k_extend, v_extend=v_extend, k_buffer=k_buffer,
        v_buffer=v_buffer, qo_indptr=qo_indptr, kv_indptr=kv_indptr,
        kv_indices=kv_indices, custom_mask=custom_mask, is_causal=causal,
        mask_indptr=mask_indptr, max_len_extend=max(extends), k_scale=1.0,
        v_scale=1.0, sm_scale=HEAD_DIM**-0.5,
        skip_prefix_custom_mask=mask != "full",
    )  # fmt: skip
    fn = mod.extend_attention_fwd
    want = torch.zeros(total, HEADS, HEAD_DIM)
    fn(o_extend=want, **_bind(fn, **given))
    got = torch.zeros(total, HEADS, HEAD_DIM)
    args = inspect.signature(fn).bind(o_extend=got, **_bind(fn, **given))
    args.apply_defaults()
    block_m = mod._get_block_sizes_for_extend_attention(HEAD_DIM, HEAD_DIM)[3]
    assert attention.extend(args.arguments, block_m), "the stand-in declined"
    both = torch.isnan(want) & torch.isnan(got)
    return float((got - want).abs().masked_fill(both, 0).nan_to_num(1e9).max())


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "needs TRITON_INTERPRET=1"
    version, dmod, emod = _kernels()
    g = torch.Generator().manual_seed(0)
    block_m = emod._get_block_sizes_for_extend_attention(HEAD_DIM, HEAD_DIM)[3]
    long = block_m + 3  # verify rows past the first tile
    diffs = {}
    for kv_heads in (HEADS, HEADS // 2):
        tag = "mha" if kv_heads == HEADS else "gqa"
        diffs[f"decode-{tag}"] = decode_case(dmod, kv_heads, [1, 7, 40, 3], g)
        diffs[f"extend-prefix-causal-{tag}"] = extend_case(
            emod, kv_heads, [0, 5, 30], [9, 1, 4], g, causal=True
        )
        diffs[f"extend-noncausal-{tag}"] = extend_case(
            emod, kv_heads, [0, 0], [6, 3], g, causal=False
        )
        diffs[f"extend-tree-mask-{tag}"] = extend_case(
            emod, kv_heads, [12, 3], [long, 4], g, causal=True, mask="tree"
        )
        diffs[f"extend-full-mask-{tag}"] = extend_case(
            emod, kv_heads, [6, 2], [5, long], g, causal=False, mask="full"
        )
    print(json.dumps({"version": version, "block_m": block_m, "diffs": diffs}))


if __name__ == "__main__":
    main()
