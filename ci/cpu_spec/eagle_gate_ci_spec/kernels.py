"""Exact torch versions of integer kernels: the index copies SGLang's CPU
branches call as ``sgl_kernel`` CPU ops (0.5.23), and the topk-1 tree build
and greedy verify that 0.5.9 has no CPU branch for.

Only these functions import torch, and only when called.
"""

from __future__ import annotations

from eagle_gate_ci_spec.core import _count

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
