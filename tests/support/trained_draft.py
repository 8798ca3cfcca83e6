"""Train a tiny EAGLE-3 draft for the tiny target of ``support.tiny_model``.

A random draft accepts almost nothing, and a rigged one (zeroed final norm, a
scaled target row) ignores its own state, so neither can show that a draft whose
KV cache and hidden input went stale proposes worse tokens. This module trains,
in plain torch on CPU, a one-layer EAGLE-3 draft on the target's own greedy
continuations of varied prompts, and writes it in the checkpoint layout SGLang
loads as ``LlamaForCausalLMEagle3`` (``--speculative-algorithm EAGLE3
--speculative-draft-model-path DIR``) in 0.5.9 and 0.5.23.

The forward reimplemented here is SGLang's for such a draft and such a target:

* Aux hidden states. The draft config names ``eagle_aux_hidden_state_layer_ids``
  ``[0, 0, 0]``; SGLang adds 1, so the target captures the residual stream
  entering its layer 1 (``embed + attn_0 + mlp_0``, i.e. the output of layer 0;
  0.5.9: ``hidden_states + residual``, 0.5.23: the boundary's residual).
  A layer index is captured once however often it is listed, so the draft gets
  ONE ``H``-wide state per token, and its ``fc`` (``3H -> H``) is skipped:
  SGLang applies ``fc`` only when the hidden width differs from the embedding
  width. (Layer 0 cannot be captured on 0.5.9: its residual is still None.) The
  checkpoint's ``fc`` is ``[I | 0 | 0]`` so that it would pass the state through.
* One draft layer (``midlayer``; 0.5.9 accepts exactly one):
  ``residual = h; x = cat(input_layernorm(embed(tok)), hidden_norm(h))``
  (``2H`` wide) -> attention (RoPE at the draft position, causal, GQA) ->
  ``residual += attn; mlp(post_attention_layernorm(residual))`` ->
  ``out = mlp + residual``; logits ``= lm_head(norm(out))``; the draft's own
  next hidden input is ``out`` (pre-norm).
* Positions. Draft position ``j`` holds ``embed(t[j+1])`` and the target's aux
  state at ``j``, at RoPE position ``j``; it predicts ``t[j+2]``. The draft
  extend fills positions from the target; each draft decode step then feeds the
  previous step's argmax token and ``out`` one position further.
* ``d2t`` is all zeros (``draft_vocab_size == vocab_size``): draft id == target
  id. The draft embeds with the TARGET's ``embed_tokens`` (SGLang's
  ``set_embed``); the checkpoint holds a copy too.

Training is teacher-forced with EAGLE-3's training-time test: step 1 reads the
target's aux states, steps 2..S read the draft's own ``out`` and attend to the
target-filled history plus their own earlier steps, as draft decode does.
Because a chain is only accepted while every earlier draft token was right,
teacher-forced argmaxes give exact acceptance counts, so the same forward
estimates the accept length offline (``offline_accept_length``), and, with the
history hidden or swapped, shows how much the proposals depend on the KV cache.

``build_trained_eagle3_draft(target_dir, out_dir)`` caches: ``out_dir`` holds
``eagle_gate_draft.json`` with the target's safetensors hash and ``VERSION``;
a matching one is returned at once.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

VERSION = "eagle_gate-trained-eagle3-v3"
INFO_FILE = "eagle_gate_draft.json"
WEIGHTS_FILE = "model.safetensors"
# SGLang captures layer id + 1: the residual stream entering target layer 1.
AUX_LAYER_IDS = [0, 0, 0]
NUM_STEPS = 3  # draft steps the training-time test unrolls (== spec num_steps)
SEED = 20240607
DRAFT_INTERMEDIATE = 256

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------


def target_fingerprint(target_dir: Path | str) -> str:
    """sha256 over the target's safetensors files (names and bytes, sorted)."""
    h = hashlib.sha256()
    files = sorted(Path(target_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {target_dir}")
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def read_draft_info(draft_dir: Path | str) -> dict | None:
    """The ``eagle_gate_draft.json`` of a built draft, or None."""
    p = Path(draft_dir) / INFO_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _rope_theta(cfg: dict) -> float:
    rp = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type", "default")) not in (
        "default",
        None,
    ):
        raise ValueError(f"unsupported rope scaling {scaling}")
    return float(rp.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _rms(x, w, eps):
    import torch

    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * w


def _rope_cos_sin(positions, head_dim, theta):
    """cos/sin for integer ``positions`` (any shape): shape ``positions + (d,)``."""
    import torch

    inv = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    )
    freqs = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _apply_rope(x, cos, sin):
    """Neox-style (rotate-half) RoPE, as HF Llama and SGLang's Llama use.

    ``x``: ``[B, heads, T, d]``; ``cos``/``sin``: ``[T, d]`` or ``[B, 1, T, d]``.
    """
    import torch

    d = x.shape[-1] // 2
    rot = torch.cat([-x[..., d:], x[..., :d]], dim=-1)
    return x * cos + rot * sin


def _silu_mlp(x, gate, up, down):
    import torch.nn.functional as F

    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


# --------------------------------------------------------------------------
# the target, in plain torch
# --------------------------------------------------------------------------


class TinyTarget:
    """The tiny Llama target: greedy decoding and the EAGLE-3 aux state.

    Plain torch over the safetensors weights, so it behaves the same under
    transformers 4.57 and 5.x (``check_against_transformers`` compares them).
    """

    def __init__(self, target_dir: Path | str):
        import torch
        from safetensors.torch import load_file

        self.dir = Path(target_dir)
        cfg = json.loads((self.dir / "config.json").read_text())
        self.cfg = cfg
        w: dict[str, torch.Tensor] = {}
        for f in sorted(self.dir.glob("*.safetensors")):
            w.update({k: v.float() for k, v in load_file(str(f)).items()})
        self.w = w
        self.H = int(cfg["hidden_size"])
        self.L = int(cfg["num_hidden_layers"])
        self.nh = int(cfg["num_attention_heads"])
        self.nkv = int(cfg.get("num_key_value_heads") or self.nh)
        self.hd = int(cfg.get("head_dim") or self.H // self.nh)
        self.V = int(cfg["vocab_size"])
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.theta = _rope_theta(cfg)
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError("only silu Llama targets are supported")
        if self.L < 2:
            raise ValueError("the aux state is the input of layer 1: need 2+ layers")
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed)

    def _layer(self, i, x, pos0, cache, pad=None):
        """One decoder layer over ``x`` ``[B, T, H]`` at positions pos0.. .

        ``pad`` ``[B]``: row r is left-padded by ``pad[r]`` slots (RoPE positions
        shift by it, and its pad keys are masked).
        """
        import torch
        import torch.nn.functional as F

        p = f"model.layers.{i}."
        w = self.w
        B, T, _ = x.shape
        h = _rms(x, w[p + "input_layernorm.weight"], self.eps)
        q = F.linear(h, w[p + "self_attn.q_proj.weight"])
        k = F.linear(h, w[p + "self_attn.k_proj.weight"])
        v = F.linear(h, w[p + "self_attn.v_proj.weight"])
        q = q.view(B, T, self.nh, self.hd).transpose(1, 2)
        k = k.view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = v.view(B, T, self.nkv, self.hd).transpose(1, 2)
        pos = torch.arange(pos0, pos0 + T)
        if pad is not None:
            pos = (pos[None, :] - pad[:, None]).clamp(min=0)
        cos, sin = _rope_cos_sin(pos, self.hd, self.theta)
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]
        q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if cache is not None:
            if i in cache:
                pk, pv = cache[i]
                k, v = torch.cat([pk, k], 2), torch.cat([pv, v], 2)
            cache[i] = (k, v)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        S = k.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        if pad is not None:
            mask = (
                mask[None, None]
                & (torch.arange(S)[None, :] >= pad[:, None])[:, None, None]
            )
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        a = a.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        x = x + F.linear(a, w[p + "self_attn.o_proj.weight"])
        h = _rms(x, w[p + "post_attention_layernorm.weight"], self.eps)
        return x + _silu_mlp(
            h,
            w[p + "mlp.gate_proj.weight"],
            w[p + "mlp.up_proj.weight"],
            w[p + "mlp.down_proj.weight"],
        )

    def forward(self, ids, pos0=0, cache=None, pad=None):
        """``ids`` ``[B, T]`` -> (logits ``[B, T, V]``, aux ``[B, T, H]``, normed
        final hidden ``[B, T, H]``: what ``lm_head`` reads)."""
        import torch.nn.functional as F

        x = self.embed[ids]
        aux = None
        for i in range(self.L):
            if i == 1:
                aux = x
            x = self._layer(i, x, pos0, cache, pad)
        x = _rms(x, self.w["model.norm.weight"], self.eps)
        return F.linear(x, self.lm_head), aux, x

    def greedy(self, prompts: list[list[int]], n_new: int):
        """Greedy continuations (``[B, n_new]``) of ``prompts`` (left-padded batch)."""
        import torch

        P = max(len(p) for p in prompts)
        pad = torch.tensor([P - len(p) for p in prompts])
        ids = torch.tensor([[0] * (P - len(p)) + list(p) for p in prompts])
        cache: dict = {}
        logits, _, _ = self.forward(ids, 0, cache, pad)
        nxt = logits[:, -1].argmax(-1)
        out = [nxt]
        for k in range(n_new - 1):
            logits, _, _ = self.forward(nxt[:, None], P + k, cache, pad)
            nxt = logits[:, -1].argmax(-1)
            out.append(nxt)
        return torch.stack(out, 1)

    def check_against_transformers(self, ids) -> float:
        """Max abs logit difference to ``AutoModelForCausalLM`` on ``ids``."""
        import torch
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(self.dir, dtype=torch.float32)
        m.eval()
        with torch.no_grad():
            ref = m(ids, output_hidden_states=True)
            mine, aux, _ = self.forward(ids)
        d_logits = (ref.logits - mine).abs().max().item()
        d_aux = (ref.hidden_states[1] - aux).abs().max().item()
        return max(d_logits, d_aux)


# --------------------------------------------------------------------------
# the draft
# --------------------------------------------------------------------------


def _rep(model, t):
    """GQA: repeat each KV head for the query heads it serves."""
    return t.repeat_interleave(model.nh // model.nkv, dim=1)


def teacher_forced_chains(draft, tokens, aux, steps=NUM_STEPS, history="keep"):
    """Teacher-forced chains of ``draft`` from every anchor position at once.

    ``draft`` gives ``qkv(tok, hidden, positions) -> (q, k, v, residual)``,
    ``rest(attn, residual) -> (normed, next_hidden)``, ``nh``, ``nkv``, ``hd``:
    the EAGLE-3 head here and the MTP layer of ``support.trained_mtp`` share
    this training-time test.

    ``tokens`` ``[B, L]`` (target's tokens), ``aux`` ``[B, L, H]`` (target
    aux states). Step ``s`` (1-based) at anchor ``i`` sits at draft position
    ``i+s-1``, reads ``tokens[i+s]`` and (s=1) ``aux[i]`` or (s>1) the draft's
    own ``out`` from step s-1 at anchor i, attends to the target-filled
    positions ``0..i`` and its own steps ``2..s`` of the same chain, and
    predicts ``tokens[i+s+1]``. Returns, per step, what ``lm_head`` reads
    (``head()`` gives logits), step s as ``[B, L-s, H]`` (anchors
    ``0..L-s-1``).

    ``history``: "keep" (as SGLang), "none" (an anchor's chain cannot see
    positions ``< i``), "shuffle" (positions ``< i`` come from another
    sequence of the batch).
    """
    import torch
    import torch.nn.functional as F

    B, L = tokens.shape
    scale = 1.0 / math.sqrt(draft.hd)
    pos = torch.arange(L)
    # step 1: the draft extend (target aux) -> KV of positions 0..L-2
    n1 = L - 1
    q1, k1, v1, r1 = draft.qkv(tokens[:, 1:], aux[:, :n1], pos[:n1])
    k1r, v1r = _rep(draft, k1), _rep(draft, v1)
    if history == "shuffle":
        k1o, v1o = k1r.roll(1, 0), v1r.roll(1, 0)
    causal = torch.ones(n1, n1, dtype=torch.bool).tril()
    diag = torch.eye(n1, dtype=torch.bool)
    if history == "none":
        causal = diag

    def hist_scores(q, n):
        # q: [B, nh, n, d] for anchors 0..n-1 -> scores vs positions 0..n-1
        s = (q @ k1r[:, :, :n].transpose(-1, -2)) * scale
        if history == "shuffle":
            so = (q @ k1o[:, :, :n].transpose(-1, -2)) * scale
            s = torch.where(diag[:n, :n], s, so)
        return s.masked_fill(~causal[:n, :n], float("-inf"))

    def hist_values(p, n):
        if history == "shuffle":
            d = diag[:n, :n].to(p.dtype)
            return (p * d) @ v1r[:, :, :n] + (p * (1 - d)) @ v1o[:, :, :n]
        return p @ v1r[:, :, :n]

    s1 = hist_scores(q1, n1)
    p1 = F.softmax(s1, -1)
    normed, out = draft.rest(hist_values(p1, n1), r1)
    result = [normed]
    own_k, own_v = [], []
    hidden = out
    for s in range(2, steps + 1):
        n = L - s  # anchors 0..n-1
        hidden = hidden[:, :n]
        q, k, v, r = draft.qkv(tokens[:, s : s + n], hidden, pos[s - 1 : s - 1 + n])
        own_k = [t[:, :, :n] for t in own_k] + [_rep(draft, k)]
        own_v = [t[:, :, :n] for t in own_v] + [_rep(draft, v)]
        sh = hist_scores(q, n)  # [B, nh, n, n]
        so = torch.stack([(q * kk).sum(-1) for kk in own_k], -1) * scale
        p = F.softmax(torch.cat([sh, so], -1), -1)
        ph, po = p[..., :n], p[..., n:]
        attn = hist_values(ph, n) + sum(
            po[..., j : j + 1] * vv for j, vv in enumerate(own_v)
        )
        normed, hidden = draft.rest(attn, r)
        result.append(normed)
    return result


def _make_draft_module(H, nh, nkv, hd, inter, V, eps, theta, embed):
    import torch
    from torch import nn

    class Eagle3Draft(nn.Module):
        """SGLang's one-layer ``LlamaForCausalLMEagle3`` forward, plain torch."""

        # parameter name -> checkpoint name
        CKPT = {
            "hidden_norm": "midlayer.hidden_norm.weight",
            "input_layernorm": "midlayer.input_layernorm.weight",
            "post_attention_layernorm": "midlayer.post_attention_layernorm.weight",
            "q_proj": "midlayer.self_attn.q_proj.weight",
            "k_proj": "midlayer.self_attn.k_proj.weight",
            "v_proj": "midlayer.self_attn.v_proj.weight",
            "o_proj": "midlayer.self_attn.o_proj.weight",
            "gate_proj": "midlayer.mlp.gate_proj.weight",
            "up_proj": "midlayer.mlp.up_proj.weight",
            "down_proj": "midlayer.mlp.down_proj.weight",
            "norm": "norm.weight",
            "lm_head": "lm_head.weight",
        }

        def __init__(self):
            super().__init__()
            self.H, self.nh, self.nkv, self.hd = H, nh, nkv, hd
            self.inter, self.V, self.eps, self.theta = inter, V, eps, theta
            self.register_buffer("embed", embed.clone(), persistent=False)

            def lin(o, i):
                return nn.Parameter(torch.randn(o, i) / math.sqrt(i))

            self.hidden_norm = nn.Parameter(torch.ones(H))
            self.input_layernorm = nn.Parameter(torch.ones(H))
            self.post_attention_layernorm = nn.Parameter(torch.ones(H))
            self.q_proj = lin(nh * hd, 2 * H)
            self.k_proj = lin(nkv * hd, 2 * H)
            self.v_proj = lin(nkv * hd, 2 * H)
            self.o_proj = nn.Parameter(torch.randn(H, nh * hd) / math.sqrt(nh * hd) / 2)
            self.gate_proj = lin(inter, H)
            self.up_proj = lin(inter, H)
            self.down_proj = nn.Parameter(torch.randn(H, inter) / math.sqrt(inter) / 2)
            self.norm = nn.Parameter(torch.ones(H))
            self.lm_head = lin(V, H)

        # -- pieces of the layer ------------------------------------------
        def qkv(self, tok, hidden, positions):
            """q ``[B,nh,T,d]``, k/v ``[B,nkv,T,d]`` for draft inputs at
            ``positions``, and the layer's residual stream (the hidden input).

            ``positions``: ``[T]`` or ``[B, T]``.
            """
            import torch.nn.functional as F

            B, T = tok.shape
            x = torch.cat(
                [
                    _rms(self.embed[tok], self.input_layernorm, self.eps),
                    _rms(hidden, self.hidden_norm, self.eps),
                ],
                -1,
            )
            q = F.linear(x, self.q_proj).view(B, T, self.nh, self.hd).transpose(1, 2)
            k = F.linear(x, self.k_proj).view(B, T, self.nkv, self.hd).transpose(1, 2)
            v = F.linear(x, self.v_proj).view(B, T, self.nkv, self.hd).transpose(1, 2)
            cos, sin = _rope_cos_sin(positions, self.hd, self.theta)
            if cos.dim() == 3:  # [B, T, d] -> [B, 1, T, d]
                cos, sin = cos[:, None], sin[:, None]
            return _apply_rope(q, cos, sin), _apply_rope(k, cos, sin), v, hidden

        def rest(self, attn, residual):
            """``attn`` ``[B, nh, T, d]`` -> (normed, out): o_proj, MLP, norms.

            ``normed`` is what ``lm_head`` reads; ``out`` (pre-norm) is the hidden
            input of the next draft step.
            """
            import torch.nn.functional as F

            B, _, T, _ = attn.shape
            a = attn.transpose(1, 2).reshape(B, T, self.nh * self.hd)
            residual = residual + F.linear(a, self.o_proj)
            h = _rms(residual, self.post_attention_layernorm, self.eps)
            out = residual + _silu_mlp(h, self.gate_proj, self.up_proj, self.down_proj)
            return _rms(out, self.norm, self.eps), out

        def head(self, normed):
            import torch.nn.functional as F

            return F.linear(normed, self.lm_head)

        def _rep(self, t):
            return t.repeat_interleave(self.nh // self.nkv, dim=1)

        def ttt(self, tokens, aux, steps=NUM_STEPS, history="keep"):
            """``teacher_forced_chains`` of this draft (``aux``: target aux states)."""
            return teacher_forced_chains(self, tokens, aux, steps, history)

        # -- SGLang-style incremental decoding (for cross-checks) -----------
        def extend(self, tokens_shifted, aux, pos0, cache):
            """Draft extend: inputs at positions pos0..; appends to ``cache``."""
            import torch.nn.functional as F

            T = tokens_shifted.shape[1]
            q, k, v, r = self.qkv(tokens_shifted, aux, torch.arange(pos0, pos0 + T))
            if cache.get("k") is not None:
                k = torch.cat([cache["k"][:, :, :pos0], k], 2)
                v = torch.cat([cache["v"][:, :, :pos0], v], 2)
            cache["k"], cache["v"] = k, v
            S = k.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
            a = F.scaled_dot_product_attention(
                q, self._rep(k), self._rep(v), attn_mask=mask
            )
            normed, out = self.rest(a, r)
            return self.head(normed), out

        def decode_chain(self, first_logits, first_out, pos, cache, steps):
            """Draft decode steps 2..steps after an extend ending at ``pos - 1``."""
            tok = first_logits[:, -1].argmax(-1)
            chain = [tok]
            hidden = first_out[:, -1:]
            ck, cv = cache["k"][:, :, :pos], cache["v"][:, :, :pos]
            for _ in range(steps - 1):
                q, k, v, r = self.qkv(tok[:, None], hidden, torch.tensor([pos]))
                ck, cv = torch.cat([ck, k], 2), torch.cat([cv, v], 2)
                a = torch.nn.functional.scaled_dot_product_attention(
                    q, self._rep(ck), self._rep(cv)
                )
                normed, hidden = self.rest(a, r)
                tok = self.head(normed)[:, -1].argmax(-1)
                chain.append(tok)
                pos += 1
            return torch.stack(chain, 1)

    return Eagle3Draft()


def new_draft(target: TinyTarget, inter: int = DRAFT_INTERMEDIATE):
    """An untrained draft for ``target`` (lm_head and norm start as the target's)."""
    d = _make_draft_module(
        target.H,
        target.nh,
        target.nkv,
        target.hd,
        inter,
        target.V,
        target.eps,
        target.theta,
        target.embed,
    )
    with __import__("torch").no_grad():
        d.lm_head.copy_(target.lm_head)
        d.norm.copy_(target.w["model.norm.weight"])
    # The draft learns to reproduce what the target's lm_head reads.
    d.lm_head.requires_grad_(False)
    d.norm.requires_grad_(False)
    return d


def load_draft(draft_dir: Path | str):
    """Load a draft written by ``build_trained_eagle3_draft`` (plain torch)."""
    import torch
    from safetensors.torch import load_file

    draft_dir = Path(draft_dir)
    cfg = json.loads((draft_dir / "config.json").read_text())
    w = load_file(str(draft_dir / WEIGHTS_FILE))
    H = int(cfg["hidden_size"])
    nh = int(cfg["num_attention_heads"])
    d = _make_draft_module(
        H,
        nh,
        int(cfg.get("num_key_value_heads") or nh),
        int(cfg.get("head_dim") or H // nh),
        int(cfg["intermediate_size"]),
        int(cfg["draft_vocab_size"]),
        float(cfg.get("rms_norm_eps", 1e-6)),
        _rope_theta(cfg),
        w["embed_tokens.weight"].float(),
    )
    with torch.no_grad():
        for name, key in d.CKPT.items():
            getattr(d, name).copy_(w[key].float())
    d.eval()
    return d


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------


def _prompt_pool(target_dir: Path, rng: random.Random, n: int, V: int, bos: int):
    """``n`` varied prompts (token id lists, 2..24 tokens, mostly BOS-first)."""
    tok = None
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    except Exception:
        tok = None
    try:
        from .tiny_model import _WORDS as words
    except Exception:
        words = "the quick brown fox jumps over a lazy dog and runs".split()
    prompts = []
    for k in range(n):
        kind = k % 4
        if tok is not None and kind in (0, 1, 2):
            ws = [rng.choice(words) for _ in range(rng.randint(1, 16))]
            if rng.random() < 0.2:
                ws.insert(rng.randrange(len(ws) + 1), str(rng.randint(0, 2048)))
            text = " ".join(ws)
            if kind == 0:
                text = text.capitalize() + rng.choice([".", "?", "!", ","])
            elif kind == 2:
                text = f"<|user|>\n{text}</s>\n<|assistant|>\n"
            ids = tok.encode(text).ids  # the post-processor adds BOS
            if not ids or ids[0] != bos:
                ids = [bos] + ids
        else:
            ids = [bos] + [rng.randrange(4, V) for _ in range(rng.randint(1, 24))]
            if rng.random() < 0.1:
                ids = ids[1:]
        prompts.append(ids[:24] if len(ids) > 1 else ids + [rng.randrange(4, V)])
    return prompts


def _head(data, n):
    return DraftData(data.tokens[:n], data.aux[:n], data.final[:n], data.prompt_len[:n])


@dataclass
class DraftData:
    tokens: object  # LongTensor [N, L]: prompt + greedy continuation
    aux: object  # FloatTensor [N, L, H]: target aux states
    final: object  # FloatTensor [N, L, H]: what the target's lm_head reads
    prompt_len: object  # LongTensor [N]


def make_data(target: TinyTarget, n: int, total_len: int, seed: int) -> DraftData:
    """``n`` sequences of ``total_len`` tokens: prompt + the target's greedy tokens."""
    import torch

    rng = random.Random(seed)
    bos = int(target.cfg.get("bos_token_id") or 1)
    prompts = _prompt_pool(target.dir, rng, n, target.V, bos)
    tokens = torch.zeros(n, total_len, dtype=torch.long)
    plen = torch.tensor([len(p) for p in prompts])
    n_new = total_len - int(plen.min())
    aux, final = [], []
    with torch.no_grad():
        for b in range(0, n, 256):
            chunk = prompts[b : b + 256]
            cont = target.greedy(chunk, n_new)
            for r, p in enumerate(chunk):
                row = list(p) + cont[r, : total_len - len(p)].tolist()
                tokens[b + r] = torch.tensor(row)
            _, a, f = target.forward(tokens[b : b + 256])
            aux.append(a)
            final.append(f)
    return DraftData(tokens, torch.cat(aux), torch.cat(final), plen)


# --------------------------------------------------------------------------
# acceptance
# --------------------------------------------------------------------------


def chain_predictions(draft, data: DraftData, steps=NUM_STEPS, history="keep"):
    """Argmax per step and anchor, ``[N, steps, L]`` (-1 where undefined)."""
    import torch

    N, L = data.tokens.shape
    out = torch.full((N, steps, L), -1, dtype=torch.long)
    with torch.no_grad():
        for b in range(0, N, 64):
            sl = slice(b, b + 64)
            res = draft.ttt(data.tokens[sl], data.aux[sl], steps, history)
            for s, normed in enumerate(res):
                out[sl, s, : normed.shape[1]] = draft.head(normed).argmax(-1)
    return out


def offline_accept_length(
    draft, data: DraftData, steps=NUM_STEPS, history="keep"
) -> dict:
    """Simulate greedy EAGLE decoding (topk 1, ``steps`` draft tokens) offline.

    Each request starts after its prompt (prefill gave the first token), each
    verify accepts the matching prefix of the chain plus the bonus token, the
    next chain starts from the last accepted token. Returns the mean accept
    length (bonus included, as SGLang's ``spec_accept_length``), per-step
    accuracies over all continuation anchors, and the counts.
    """
    pred = chain_predictions(draft, data, steps, history)
    tok = data.tokens
    N, L = tok.shape
    total_acc, rounds = 0, 0
    step_hits = [0] * steps
    step_n = [0] * steps
    for r in range(N):
        n = int(data.prompt_len[r])
        row, pr = tok[r].tolist(), pred[r].tolist()
        for i in range(n - 1, L - 1):
            for s in range(steps):
                if i + s + 2 <= L - 1 and pr[s][i] >= 0:
                    step_n[s] += 1
                    step_hits[s] += int(pr[s][i] == row[i + s + 2])
        m = n  # tokens 0..m are known; the chain anchors at draft position m-1
        while m - 1 + steps + 1 <= L - 1:
            i = m - 1
            a = 1
            for s in range(steps):
                if pr[s][i] == row[i + s + 2]:
                    a += 1
                else:
                    break
            total_acc += a
            rounds += 1
            m += a
    return {
        "accept_length": total_acc / max(rounds, 1),
        "rounds": rounds,
        "step_accuracy": [
            h / max(c, 1) for h, c in zip(step_hits, step_n, strict=True)
        ],
    }


# --------------------------------------------------------------------------
# training and the checkpoint
# --------------------------------------------------------------------------


def _train(draft, data: DraftData, *, phase_steps, deadline, seed, batch=32, lr=3e-3):
    """Fit every step's ``normed`` output to the target's, in logit space.

    The draft shares the target's ``lm_head`` and final norm, so matching what
    ``lm_head`` reads matches the target's logits; the loss is the squared logit
    error ``d^T (W^T W / V) d`` (cheap: ``W^T W`` is ``H x H``), weighted to the
    continuation positions. Phase 1 (``phase_steps[0]`` steps) trains step 1
    only (a third of the cost); phase 2 (``phase_steps[1]``) unrolls all
    ``NUM_STEPS``. On a slow machine phase 1 yields at 40% of the time left and
    phase 2 stops at ``deadline``. Returns (steps per phase, sampled losses).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    N, L = data.tokens.shape
    W = draft.lm_head.detach()
    metric = W.T @ W / W.shape[0]
    # position j of the target's final state predicts token j+1: count it once
    # that token is a generated one (j >= prompt_len - 1)
    gen_mask = (torch.arange(L)[None, :] >= data.prompt_len[:, None] - 1).float()
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    weights = [1.0, 0.6, 0.4, 0.3, 0.2][:NUM_STEPS]
    done = [0, 0]
    losses = []
    draft.train()
    t_start = time.monotonic()
    phase1_end = t_start + 0.4 * max(0.0, deadline - t_start)
    for phase, (n_steps, end) in enumerate(
        zip(phase_steps, (phase1_end, deadline), strict=True)
    ):
        steps = 1 if phase == 0 else NUM_STEPS
        for step in range(n_steps):
            if time.monotonic() > end:
                break
            frac = step / max(n_steps, 1)
            warm = min(1.0, (step + 1) / 30)
            cos = 0.5 * (1 + math.cos(math.pi * frac))
            for pg in opt.param_groups:
                pg["lr"] = (
                    lr * warm * (0.05 + 0.95 * cos) * (1.0 if phase == 0 else 0.5)
                )
            idx = torch.randint(0, N, (batch,), generator=g)
            tokens, aux, final = data.tokens[idx], data.aux[idx], data.final[idx]
            mask = gen_mask[idx]
            res = draft.ttt(tokens, aux, steps)
            loss = 0.0
            for s, normed in enumerate(res, start=1):
                n = normed.shape[1]
                d = normed - final[:, s : s + n]
                err = ((d @ metric) * d).sum(-1)
                m = mask[:, s : s + n]
                loss = loss + weights[s - 1] * (err * m).sum() / m.sum().clamp(min=1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            done[phase] += 1
            if step % 100 == 0:
                losses.append(round(loss.item(), 5))
    draft.eval()
    return done, losses


def _save(draft, target: TinyTarget, out_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file

    H, V = target.H, target.V
    fc = torch.zeros(H, 3 * H)
    fc[:, :H] = torch.eye(H)  # never applied (aux width == H); would pass through
    w = {key: getattr(draft, name).detach().float() for name, key in draft.CKPT.items()}
    w.update(
        {
            "fc.weight": fc,
            "embed_tokens.weight": target.embed.detach().float(),
            "d2t": torch.zeros(V, dtype=torch.int64),
            "t2d": torch.ones(V, dtype=torch.bool),
        }
    )
    save_file(
        {k: v.contiguous() for k, v in w.items()},
        str(out_dir / WEIGHTS_FILE),
        metadata={"format": "pt"},
    )
    cfg = dict(target.cfg)
    cfg.update(
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        intermediate_size=int(draft.inter),
        draft_vocab_size=V,
        target_hidden_size=H,
        tie_word_embeddings=False,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS)},
    )
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in _TOKENIZER_FILES:
        if (target.dir / f).exists():
            shutil.copy(target.dir / f, out_dir / f)


def build_trained_eagle3_draft(
    target_dir: Path | str,
    out_dir: Path | str,
    *,
    seconds_budget: float = 170.0,
    train_steps: tuple[int, int] = (1500, 700),
    num_sequences: int = 1024,
    seq_len: int = 64,
    seed: int = SEED,
    threads: int = 1,
) -> Path:
    """Train (or reuse) a tiny EAGLE-3 draft for ``target_dir``; return ``out_dir``.

    ``out_dir/eagle_gate_draft.json`` records the target hash, ``VERSION``, the
    offline accept length on held-out prompts (``accept_length``, 3 draft steps,
    topk 1), the same with the draft's KV history hidden or swapped
    (``accept_length_no_history`` / ``accept_length_shuffled_history``), and the
    training time. Training stops early at ``seconds_budget`` (then the result
    depends on machine speed: ``stopped_by_budget`` says so).

    ``threads`` defaults to ONE torch thread: on a shared 2-core machine a 2-thread
    pool ran 25-100x slower whenever other processes took a core (OpenMP threads
    waiting on a descheduled peer); one thread keeps the build near 2 minutes.
    """
    import torch

    target_dir, out_dir = Path(target_dir), Path(out_dir)
    fp = target_fingerprint(target_dir)
    info = read_draft_info(out_dir)
    if (
        info
        and info.get("version") == VERSION
        and info.get("target_sha256") == fp
        and (out_dir / WEIGHTS_FILE).exists()
        and (out_dir / "config.json").exists()
    ):
        return out_dir

    t0 = time.monotonic()
    deadline = t0 + seconds_budget
    old_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, old_threads)))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            target = TinyTarget(target_dir)
            data = make_data(target, num_sequences, seq_len, seed)
            held = make_data(target, 128, seq_len, seed + 1)
            t_data = time.monotonic() - t0
            draft = new_draft(target)
            steps, losses = _train(
                draft,
                data,
                phase_steps=train_steps,
                deadline=deadline - 10.0,  # leave time for the estimates
                seed=seed,
            )
            t_train = time.monotonic() - t0 - t_data
            est = offline_accept_length(draft, held)
            est_train = offline_accept_length(draft, _head(data, 256))
            none = offline_accept_length(draft, held, history="none")
            shuf = offline_accept_length(draft, held, history="shuffle")
            pred = chain_predictions(draft, held)
            pred_none = chain_predictions(draft, held, history="none")
            valid = pred[:, 0] >= 0
            changed = float((pred[:, 0] != pred_none[:, 0])[valid].float().mean())
    finally:
        torch.set_num_threads(old_threads)

    tmp = out_dir.with_name(f"{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save(draft, target, tmp)
    info = {
        "version": VERSION,
        "target_sha256": fp,
        "seed": seed,
        "num_steps": NUM_STEPS,
        "accept_length": round(est["accept_length"], 4),
        "accept_length_train": round(est_train["accept_length"], 4),
        "step_accuracy": [round(a, 4) for a in est["step_accuracy"]],
        "accept_length_no_history": round(none["accept_length"], 4),
        "accept_length_shuffled_history": round(shuf["accept_length"], 4),
        "step1_changed_without_history": round(changed, 4),
        "train_steps": steps,
        "stopped_by_budget": list(steps) != list(train_steps),
        "losses": losses,
        "data_seconds": round(t_data, 1),
        "train_seconds": round(t_train, 1),
        "total_seconds": round(time.monotonic() - t0, 1),
        "num_sequences": num_sequences,
        "seq_len": seq_len,
        "torch_threads": max(1, min(threads, old_threads)),
    }
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
