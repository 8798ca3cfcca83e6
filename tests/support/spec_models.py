"""A tiny target and a rigged EAGLE-3 draft whose proposals get accepted.

A random draft accepts almost nothing (accept length about 1.03), which would
not show that the speculative path commits multi-token steps. These models are
built from the repo's tiny Llama (``support.tiny_model``):

* the target: the tiny Llama with row ``RUN_TOKEN`` of ``lm_head`` scaled by
  ``RUN_SCALE``, so its greedy output holds runs of that token between other
  tokens;
* the draft: an EAGLE-3 head (``LlamaForCausalLMEagle3`` layout) with a zero
  final-norm weight, so every draft logit is exactly 0 and the argmax is draft
  id 0, which ``d2t[0]`` maps to ``RUN_TOKEN``. It always proposes that token:
  the target accepts it while its run lasts and rejects it elsewhere.

Such a draft ignores its own state, so it cannot show stale draft KV; it shows
that the real draft / verify / accept path runs and keeps outputs exact.
Both transformers 4.57 and 5.x load the results (the tokenizer files are the
tiny model's, written in a format both read).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from support.tiny_model import build_tiny_llama

RUN_TOKEN = 300
# Measured on the tiny model (greedy, 16 new tokens, PROMPTS below): about half
# the outputs are RUN_TOKEN, and a 3-step chain accepts ~2 tokens per verify.
RUN_SCALE = 6.5

PROMPTS = (
    "The quick brown fox",
    "Speculative decoding drafts tokens and",
    "One two three four five",
)

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


@dataclass(frozen=True)
class SpecModels:
    target: Path
    draft: Path
    run_token: int
    run_scale: float


def build_run_target(
    tiny_dir: Path, dest: Path, *, token: int = RUN_TOKEN, scale: float = RUN_SCALE
) -> Path:
    """Copy the tiny model to ``dest``, ``lm_head`` row ``token`` times ``scale``."""
    from safetensors.torch import load_file, save_file

    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tiny_dir, dest)
    path = dest / "model.safetensors"
    weights = load_file(str(path))
    weights["lm_head.weight"][token] *= scale
    save_file(weights, str(path), metadata={"format": "pt"})
    return dest


def build_rigged_eagle3_draft(
    target_dir: Path, dest: Path, *, token: int = RUN_TOKEN, seed: int = 7
) -> Path:
    """Write an EAGLE-3 draft for ``target_dir`` that always proposes ``token``.

    Random weights everywhere (fixed seed), except the final norm (zero: all
    logits are exactly 0, argmax is draft id 0) and ``d2t`` (identity, except
    draft id 0 -> ``token``; SGLang reads it as target id = draft id + d2t).
    """
    import torch
    from safetensors.torch import save_file

    target_dir, dest = Path(target_dir), Path(dest)
    cfg = json.loads((target_dir / "config.json").read_text())
    hidden, inter, vocab = (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
    )
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = hidden // heads
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).float()

    d2t = torch.zeros(vocab, dtype=torch.int64)
    d2t[0] = token
    weights = {
        "fc.weight": rand(hidden, 3 * hidden),
        "norm.weight": torch.zeros(hidden),
        "lm_head.weight": rand(vocab, hidden),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden),
        "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "d2t": d2t,
        "t2d": torch.ones(vocab, dtype=torch.bool),
    }
    draft_cfg = dict(
        cfg,
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        draft_vocab_size=vocab,
        target_hidden_size=hidden,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 0, 0]},
    )
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps(draft_cfg, indent=2) + "\n")
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    for name in _TOKENIZER_FILES:
        shutil.copy(target_dir / name, dest / name)
    return dest


def build_spec_models(
    root: Path, *, token: int = RUN_TOKEN, scale: float = RUN_SCALE
) -> SpecModels:
    """Build the tiny Llama, the run target and the rigged draft under ``root``."""
    root = Path(root)
    tiny = build_tiny_llama(root / "tiny-llama")
    target = build_run_target(tiny, root / "target-runs", token=token, scale=scale)
    draft = build_rigged_eagle3_draft(target, root / "draft-eagle3", token=token)
    return SpecModels(target=target, draft=draft, run_token=token, run_scale=scale)


def chain_accept_lengths(output_ids, token: int, steps: int = 3) -> list[int]:
    """Accept lengths a chain draft of ``steps`` copies of ``token`` would get.

    Each verify commits the run of ``token`` (at most ``steps``) the greedy
    output continues with, plus one bonus token. Used to pick ``RUN_SCALE``.
    """
    lengths, i = [], 0
    while i < len(output_ids):
        run = 0
        while (
            run < steps and i + run < len(output_ids) and output_ids[i + run] == token
        ):
            run += 1
        lengths.append(run + 1)
        i += run + 1
    return lengths
