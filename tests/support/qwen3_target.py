"""A tiny Qwen3 target, built from the tiny Llama target, for DP-attention tests.

SGLang's DP attention (``--enable-dp-attention``) needs a target whose layers
know the attention-TP group: the token embedding must reduce over it and the
attention heads must be split over it, because DP ranks hold different
tokens. ``models/qwen3.py`` does both (its heads follow ``attn_tp_size``, its
embedding is Qwen2Model's, built with ``use_attn_tp_group``), in 0.5.9 and
0.5.23. ``models/llama.py`` does neither: a Llama target all-reduces its
embedding over the whole TP group, across ranks that hold different tokens
(an idle rank skips that all-reduce and the ranks' collectives stop
matching), and ``models/qwen2.py`` splits heads over the whole TP group
(outputs differ from a server without DP attention). Both are SGLang model
code a GPU runs too, so the DP-attention tests serve Qwen3.

Qwen3 is Llama plus an RMSNorm on each head's query and key. The target here
takes every Llama weight under the same name and norm weights of one, so it
is a different (still deterministic) model than the Llama target: tests
compare a DP-attention server with a server without DP attention, both
serving this model. The EAGLE-3 draft trained on the Llama target still fits
its shapes (hidden size, vocabulary); it proposes worse, which changes
acceptance, never the greedy output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

COPIED = (
    "generation_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
CONFIG_KEYS = (
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "hidden_act",
    "hidden_size",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
    "vocab_size",
    "initializer_range",
)


def build_qwen3_target(llama_dir: Path | str, dest: Path | str) -> Path:
    """Write the Qwen3 target made of ``llama_dir``'s weights to ``dest``
    (once); return ``dest``."""
    import torch
    from safetensors.torch import load_file, save_file

    llama_dir, dest = Path(llama_dir), Path(dest)
    if (dest / "model.safetensors").exists():
        return dest
    src = json.loads((llama_dir / "config.json").read_text())
    if src.get("attention_bias") or src.get("mlp_bias"):
        raise ValueError("the Llama target has biases, which Qwen3 lacks")
    if src.get("rope_scaling"):
        raise ValueError("rope scaling is not carried over")
    head_dim = src.get("head_dim", src["hidden_size"] // src["num_attention_heads"])
    config = {k: src[k] for k in CONFIG_KEYS if k in src}
    config.update(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        head_dim=head_dim,
        attention_bias=False,
        attention_dropout=0.0,
        torch_dtype=src.get("dtype", src.get("torch_dtype", "float32")),
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=src["num_hidden_layers"],
    )
    weights = load_file(str(llama_dir / "model.safetensors"))
    dtype = weights["model.embed_tokens.weight"].dtype
    for i in range(src["num_hidden_layers"]):
        for norm in ("q_norm", "k_norm"):
            weights[f"model.layers.{i}.self_attn.{norm}.weight"] = torch.ones(
                head_dim, dtype=dtype
            )
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in COPIED:
        if (llama_dir / name).exists():
            shutil.copy(llama_dir / name, tmp / name)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
