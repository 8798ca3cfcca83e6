"""A tiny random-weight GLM-4.5 MoE target with its NextN (MTP) layer.

``--speculative-algorithm NEXTN`` on a ``Glm4MoeForCausalLM`` target runs the
checkpoint's own NextN layer as an EAGLE draft: SGLang fills the draft path in
(the target's directory) and builds ``Glm4MoeForCausalLMNextN`` for it
(``configs/model_config.py``: a draft whose architecture is
``Glm4MoeForCausalLM``). What SGLang reads (``models/glm4_moe.py``,
``models/glm4_moe_nextn.py``, the same names in 0.5.9 and 0.5.23):

* the target: ``num_hidden_layers`` decoder layers, GQA attention with q/k/v
  biases and partial rotary (``partial_rotary_factor`` 0.5: half of each head's
  dims rotate); layers below ``first_k_dense_replace`` have a dense SiLU MLP,
  the rest a ``Glm4MoeSparseMoeBlock``: a float32 router ``mlp.gate.weight``
  with a sigmoid score correction bias ``mlp.gate.e_score_correction_bias``
  (grouped top-k, DeepSeek-V3 routing), routed experts
  ``mlp.experts.{e}.{gate,up,down}_proj.weight`` and one shared expert
  ``mlp.shared_experts.*``. The per-expert names are written here by hand with
  safetensors (newer transformers fuse experts into one tensor);
* the NextN layer is ``model.layers.{num_hidden_layers}.*``: a decoder layer
  that is always MoE, behind ``eh_proj(cat(enorm(embed(tok)), hnorm(h)))`` and
  followed by ``shared_head.norm``; SGLang's loader maps ``eh_proj``,
  ``enorm``, ``hnorm`` and ``shared_head.norm`` to the NextN model and the
  rest of the layer to its ``decoder``, and skips the layer's
  ``embed_tokens`` and ``shared_head.head`` (it shares the target's). The
  target's loader skips every layer at or past ``num_hidden_layers``.

The weights are random (fixed seed, fan-in scaled so the activations, the
router's choices and the greedy tokens have clear margins) but shaped so that
the NextN layer's proposals are sometimes right without training: the head
reads the embedding back through a fixed random permutation (a state that is
mostly token t's embedding scores t's successor highest), and what attention
and the MLPs write into the residual stream is scaled by ``NOISE``, so the
target follows the successor chain about 2 steps in 3 and leaves it where its
context says so; the NextN layer passes its input token's embedding through
``eh_proj`` (plus a little of the target's state) and so proposes successors.
Served with 3 draft steps, topk 1, the accept length is about 2 (1.85-2.4 per
request on four prompts, both versions): SPEC steps accept whole chains, part
chains and nothing. The tokenizer is the tiny Llama's (``support.tiny_model``).

``build_glm_moe(llama_dir, out_dir)`` caches: ``out_dir/eagle_gate_glm_moe.json``
records ``VERSION``, the seed and the Llama tokenizer's hash; a directory that
matches is reused as it is. SGLang's no-spec CPU server gives the greedy tokens
of transformers 4.57's ``Glm4MoeForCausalLM`` for this checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

VERSION = "eagle_gate-tiny-glm4-moe-v1"
INFO_FILE = "eagle_gate_glm_moe.json"
WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "Glm4MoeForCausalLM"
#: the class SGLang builds for the NextN draft of such a target
DRAFT_ARCHITECTURE = "Glm4MoeForCausalLMNextN"
SEED = 20241206

HIDDEN = 64
LAYERS = 2  # layer 0 dense, layer 1 MoE; the NextN layer is layer 2
FIRST_K_DENSE = 1
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128  # the dense MLP
MOE_INTERMEDIATE = 32  # each routed expert and the shared one
EXPERTS = 4
TOP_K = 2
VOCAB = 1000
MAX_POS = 2048
ROPE_THETA = 10000.0
PARTIAL_ROTARY = 0.5
EPS = 1e-5
#: scale of what attention and the MLPs write into the residual stream: at
#: 1.75 the target's greedy token is its input token's successor 66% of the time
#: (1.0: 99%, 2.0: 51%)
NOISE = 1.75
#: how much of the target's state the NextN layer mixes into its input
NEXTN_HIDDEN = 0.3

_COPIED = (
    "generation_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def is_glm_moe(model_dir: Path | str) -> bool:
    return (Path(model_dir) / INFO_FILE).exists()


def read_glm_info(model_dir: Path | str) -> dict | None:
    try:
        return json.loads((Path(model_dir) / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None


def _tokenizer_hash(llama_dir: Path) -> str:
    h = hashlib.sha256()
    for name in _COPIED:
        path = llama_dir / name
        if path.exists():
            h.update(name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def config(llama_dir: Path) -> dict:
    """The ``config.json``: a ``glm4_moe`` config both transformers versions
    read (4.57: ``rope_theta`` / ``partial_rotary_factor``; 5.x:
    ``rope_parameters``), with the Llama tokenizer's special ids."""
    src = json.loads((llama_dir / "config.json").read_text())
    if src["vocab_size"] != VOCAB:
        raise ValueError(f"the Llama tokenizer has {src['vocab_size']} ids")
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "glm4_moe",
        "bos_token_id": src["bos_token_id"],
        "eos_token_id": src["eos_token_id"],
        "pad_token_id": src["pad_token_id"],
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "moe_intermediate_size": MOE_INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "first_k_dense_replace": FIRST_K_DENSE,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "attention_bias": True,
        "use_qk_norm": False,
        "partial_rotary_factor": PARTIAL_ROTARY,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "rope_parameters": {
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": PARTIAL_ROTARY,
            "rope_type": "default",
        },
        "max_position_embeddings": MAX_POS,
        "hidden_act": "silu",
        "rms_norm_eps": EPS,
        "n_routed_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "tie_word_embeddings": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def weights(seed: int = SEED) -> dict:
    """Every tensor of the checkpoint, by its name, deterministic in ``seed``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}

    def lin(name: str, rows: int, cols: int, scale: float = 1.0) -> None:
        out[name] = torch.randn(rows, cols, generator=g) * (scale / cols**0.5)

    def vec(name: str, n: int, std: float, mean: float = 0.0) -> None:
        out[name] = mean + torch.randn(n, generator=g) * std

    def mlp(prefix: str, inter: int) -> None:
        lin(f"{prefix}.gate_proj.weight", inter, HIDDEN)
        lin(f"{prefix}.up_proj.weight", inter, HIDDEN)
        lin(f"{prefix}.down_proj.weight", HIDDEN, inter, NOISE)

    def layer(i: int, sparse: bool) -> None:
        p = f"model.layers.{i}"
        vec(f"{p}.input_layernorm.weight", HIDDEN, 0.1, 1.0)
        vec(f"{p}.post_attention_layernorm.weight", HIDDEN, 0.1, 1.0)
        for proj, rows in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
            lin(f"{p}.self_attn.{proj}_proj.weight", rows * HEAD_DIM, HIDDEN)
            vec(f"{p}.self_attn.{proj}_proj.bias", rows * HEAD_DIM, 0.1)
        lin(f"{p}.self_attn.o_proj.weight", HIDDEN, HEADS * HEAD_DIM, NOISE)
        if not sparse:
            mlp(f"{p}.mlp", INTERMEDIATE)
            return
        # the router: sigmoid scores of well separated logits, a small bias
        lin(f"{p}.mlp.gate.weight", EXPERTS, HIDDEN, 4.0)
        vec(f"{p}.mlp.gate.e_score_correction_bias", EXPERTS, 0.05)
        for e in range(EXPERTS):
            mlp(f"{p}.mlp.experts.{e}", MOE_INTERMEDIATE)
        mlp(f"{p}.mlp.shared_experts", MOE_INTERMEDIATE)

    embed = torch.randn(VOCAB, HIDDEN, generator=g)
    out["model.embed_tokens.weight"] = embed
    for i in range(LAYERS):
        layer(i, sparse=i >= FIRST_K_DENSE)
    vec("model.norm.weight", HIDDEN, 0.1, 1.0)
    # the head reads the embedding back through a permutation: a state that
    # is mostly token t's embedding scores token SUCCESSOR[t] highest
    successor = torch.randperm(VOCAB, generator=g)
    head = torch.empty_like(embed)
    head[successor] = embed
    out["lm_head.weight"] = head / HIDDEN**0.5

    # the NextN layer: always MoE
    nextn = f"model.layers.{LAYERS}"
    layer(LAYERS, sparse=True)
    # the token's embedding passes through, the target's state is a nudge
    eh = torch.randn(HIDDEN, 2 * HIDDEN, generator=g) * (NEXTN_HIDDEN / HIDDEN**0.5)
    eh[:, :HIDDEN] += torch.eye(HIDDEN)
    out[f"{nextn}.eh_proj.weight"] = eh
    vec(f"{nextn}.enorm.weight", HIDDEN, 0.1, 1.0)
    vec(f"{nextn}.hnorm.weight", HIDDEN, 0.1, 1.0)
    vec(f"{nextn}.shared_head.norm.weight", HIDDEN, 0.1, 1.0)
    # copies of the target's, as GLM-4.5 checkpoints carry them (SGLang skips
    # both and shares the target's embedding and head)
    out[f"{nextn}.embed_tokens.weight"] = out["model.embed_tokens.weight"].clone()
    out[f"{nextn}.shared_head.head.weight"] = out["lm_head.weight"].clone()
    return {k: v.float().contiguous() for k, v in out.items()}


def build_glm_moe(
    llama_dir: Path | str, out_dir: Path | str, *, seed: int = SEED
) -> Path:
    """Write (or reuse) the tiny GLM-4.5 MoE checkpoint; return ``out_dir``.

    Serve it as its own NEXTN draft: ``--speculative-algorithm NEXTN`` (SGLang
    fills ``--speculative-draft-model-path`` in with the target's directory;
    passing that directory changes nothing but a warning).
    """
    from safetensors.torch import save_file

    llama_dir, out_dir = Path(llama_dir), Path(out_dir)
    fp = _tokenizer_hash(llama_dir)

    def built() -> bool:
        info = read_glm_info(out_dir)
        return bool(
            info
            and info.get("version") == VERSION
            and info.get("tokenizer_sha256") == fp
            and info.get("seed") == seed
            and (out_dir / WEIGHTS_FILE).exists()
        )

    if built():
        return out_dir

    tmp = out_dir.with_name(f"{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config(llama_dir), indent=2) + "\n")
    save_file(weights(seed), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    for name in _COPIED:
        if (llama_dir / name).exists():
            shutil.copy(llama_dir / name, tmp / name)
    info = {"version": VERSION, "tokenizer_sha256": fp, "seed": seed}
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    # sessions side by side (both SGLang versions) may build it at once: a
    # finished build is never removed, only a stale one
    if built():
        shutil.rmtree(tmp, ignore_errors=True)
        return out_dir
    if out_dir.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
