"""Sampling kernels of a sampled (temperature > 0) verify, SGLang 0.5.9.

0.5.9's EagleVerifyInput.sample (eagle_info_v2) verifies a batch that is not
all greedy with three sgl_kernel GPU ops, bound on CUDA only (on CPU the
names are unbound: NameError). 0.5.23 never reaches them on CPU: its
_verify_uses_greedy(is_cpu=True) commits argmax for sampled requests there.
These are torch versions of the same algorithms, float32 like the kernels.
They are exact in the sense that matters here, the same rule on the same
probabilities; sums run in torch's order, not a CUDA block scan's, so a
draw can differ from a GPU's only where a float rounding moves a boundary.
"""

from __future__ import annotations

from eagle_gate_ci_spec.core import _count
from eagle_gate_ci_spec.kernels import _check_chain


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


SAMPLING_OPS_0_5_9 = (
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
)
