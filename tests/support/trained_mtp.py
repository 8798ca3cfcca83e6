"""A tiny MiMo target with one MTP layer, trained like the EAGLE-3 draft.

``--speculative-algorithm NEXTN`` serves MTP models: the draft is a layer the
target checkpoint carries (``model.mtp_layers.0.*``), run by SGLang as plain
EAGLE (one hidden state, no aux layers). MiMo is the smallest such model SGLang
serves without GPU kernels (``models/mimo.py``, ``models/mimo_mtp.py``, the same
in 0.5.9 and 0.5.23):

* the target ``MiMoForCausalLM`` is Qwen2 (Llama plus q/k/v biases). The one
  built here takes every weight of the tiny Llama target (``support.tiny_model``)
  and zero biases, so its greedy outputs are the Llama target's and
  ``support.trained_draft.TinyTarget`` computes it exactly;
* the draft ``MiMoMTP`` (SGLang picks it for a draft whose target architecture is
  ``MiMoForCausalLM``: ``configs/model_config.py``): ``x = input_proj(cat(
  hidden_layernorm(h), token_layernorm(embed(tok))))``, the token embedding
  zeroed at position 0, one ``Qwen2DecoderLayer`` over ``x`` (its residual
  stream starts at ``x``), ``final_layernorm``; logits from the target's
  ``lm_head`` and embedding (``set_embed_and_head``). ``h`` is what the target's
  ``lm_head`` reads (its final, normed state: MiMo captures no pre-norm state);
  the next draft step reads the MTP layer's own ``final_layernorm`` output.

The MTP layer's forward below is that, in plain torch; the training-time test,
data, training and the offline accept length are ``support.trained_draft``'s
(``teacher_forced_chains``, with the target's final state where EAGLE-3 reads
its aux state). ``build_mimo_target(llama_dir, out_dir)`` caches like the
EAGLE-3 draft: ``out_dir/eagle_gate_mtp.json`` records the Llama target's hash,
``VERSION`` and the offline accept lengths.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

from support import trained_draft as td

VERSION = "eagle_gate-trained-mimo-mtp-v1"
INFO_FILE = "eagle_gate_mtp.json"
WEIGHTS_FILE = "model.safetensors"
MTP = "model.mtp_layers.0."
ARCHITECTURE = "MiMoForCausalLM"
SEED = 20241205

_COPIED = (
    "generation_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
_CONFIG_KEYS = (
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
    "tie_word_embeddings",
    "vocab_size",
    "initializer_range",
)


def is_mtp_target(model_dir: Path | str) -> bool:
    """Whether ``model_dir`` is a target built here (its draft is in it)."""
    return (Path(model_dir) / INFO_FILE).exists()


def read_mtp_info(model_dir: Path | str) -> dict | None:
    try:
        return json.loads((Path(model_dir) / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None


def _make_mtp_module(target: td.TinyTarget, inter: int):
    import torch
    from torch import nn

    H, nh, nkv, hd = target.H, target.nh, target.nkv, target.hd
    eps, theta = target.eps, target.theta

    class MtpLayer(nn.Module):
        """SGLang's ``MiMoMultiTokenPredictorLayer`` + shared head, plain torch."""

        # parameter name -> checkpoint name (in the target's safetensors)
        CKPT = {
            "token_layernorm": MTP + "token_layernorm.weight",
            "hidden_layernorm": MTP + "hidden_layernorm.weight",
            "input_proj": MTP + "input_proj.weight",
            "input_layernorm": MTP + "input_layernorm.weight",
            "q_proj": MTP + "self_attn.q_proj.weight",
            "q_bias": MTP + "self_attn.q_proj.bias",
            "k_proj": MTP + "self_attn.k_proj.weight",
            "k_bias": MTP + "self_attn.k_proj.bias",
            "v_proj": MTP + "self_attn.v_proj.weight",
            "v_bias": MTP + "self_attn.v_proj.bias",
            "o_proj": MTP + "self_attn.o_proj.weight",
            "post_attention_layernorm": MTP + "post_attention_layernorm.weight",
            "gate_proj": MTP + "mlp.gate_proj.weight",
            "up_proj": MTP + "mlp.up_proj.weight",
            "down_proj": MTP + "mlp.down_proj.weight",
            "final_layernorm": MTP + "final_layernorm.weight",
        }

        def __init__(self):
            super().__init__()
            self.H, self.nh, self.nkv, self.hd = H, nh, nkv, hd
            self.inter, self.eps, self.theta = inter, eps, theta
            self.register_buffer("embed", target.embed.clone(), persistent=False)
            # the target's head: SGLang shares it (set_embed_and_head); frozen
            self.lm_head = nn.Parameter(target.lm_head.clone(), requires_grad=False)

            def lin(o, i, scale=1.0):
                return nn.Parameter(torch.randn(o, i) / math.sqrt(i) * scale)

            self.token_layernorm = nn.Parameter(torch.ones(H))
            self.hidden_layernorm = nn.Parameter(torch.ones(H))
            # start by passing the target's state through: x = hidden
            proj = torch.zeros(H, 2 * H)
            proj[:, :H] = torch.eye(H)
            self.input_proj = nn.Parameter(proj + torch.randn(H, 2 * H) * 0.02)
            self.input_layernorm = nn.Parameter(torch.ones(H))
            self.q_proj = lin(nh * hd, H)
            self.k_proj = lin(nkv * hd, H)
            self.v_proj = lin(nkv * hd, H)
            self.q_bias = nn.Parameter(torch.zeros(nh * hd))
            self.k_bias = nn.Parameter(torch.zeros(nkv * hd))
            self.v_bias = nn.Parameter(torch.zeros(nkv * hd))
            self.o_proj = lin(H, nh * hd, 0.5)
            self.post_attention_layernorm = nn.Parameter(torch.ones(H))
            self.gate_proj = lin(inter, H)
            self.up_proj = lin(inter, H)
            self.down_proj = lin(H, inter, 0.5)
            self.final_layernorm = nn.Parameter(target.w["model.norm.weight"].clone())

        def qkv(self, tok, hidden, positions):
            """q/k/v for MTP inputs at ``positions`` (``[T]`` or ``[B, T]``) and
            the block's residual stream (the projected input)."""
            import torch.nn.functional as F

            B, T = tok.shape
            emb = self.embed[tok]
            # "masking inputs at position 0, as not needed by MTP"
            emb = emb * (positions != 0).to(emb.dtype)[..., None]
            x = F.linear(
                torch.cat(
                    [
                        td._rms(hidden, self.hidden_layernorm, self.eps),
                        td._rms(emb, self.token_layernorm, self.eps),
                    ],
                    -1,
                ),
                self.input_proj,
            )
            h = td._rms(x, self.input_layernorm, self.eps)
            q = F.linear(h, self.q_proj, self.q_bias)
            k = F.linear(h, self.k_proj, self.k_bias)
            v = F.linear(h, self.v_proj, self.v_bias)
            q = q.view(B, T, self.nh, self.hd).transpose(1, 2)
            k = k.view(B, T, self.nkv, self.hd).transpose(1, 2)
            v = v.view(B, T, self.nkv, self.hd).transpose(1, 2)
            cos, sin = td._rope_cos_sin(positions, self.hd, self.theta)
            if cos.dim() == 3:
                cos, sin = cos[:, None], sin[:, None]
            return td._apply_rope(q, cos, sin), td._apply_rope(k, cos, sin), v, x

        def rest(self, attn, residual):
            """-> (normed, normed): the MTP layer's next hidden input is its own
            ``final_layernorm`` output (what its logits processor captures)."""
            import torch.nn.functional as F

            B, _, T, _ = attn.shape
            a = attn.transpose(1, 2).reshape(B, T, self.nh * self.hd)
            residual = residual + F.linear(a, self.o_proj)
            h = td._rms(residual, self.post_attention_layernorm, self.eps)
            out = residual + td._silu_mlp(
                h, self.gate_proj, self.up_proj, self.down_proj
            )
            normed = td._rms(out, self.final_layernorm, self.eps)
            return normed, normed

        def head(self, normed):
            import torch.nn.functional as F

            return F.linear(normed, self.lm_head)

        def ttt(self, tokens, final, steps=td.NUM_STEPS, history="keep"):
            """``teacher_forced_chains`` (``final``: the target's normed state)."""
            return td.teacher_forced_chains(self, tokens, final, steps, history)

    return MtpLayer()


def load_mtp(model_dir: Path | str):
    """The MTP layer of a target built by ``build_mimo_target`` (plain torch)."""
    import torch
    from safetensors.torch import load_file

    target = td.TinyTarget(model_dir)
    w = load_file(str(Path(model_dir) / WEIGHTS_FILE))
    m = _make_mtp_module(target, int(target.cfg["intermediate_size"]))
    with torch.no_grad():
        for name, key in m.CKPT.items():
            getattr(m, name).copy_(w[key].float())
    m.eval()
    return m


def _as_mtp_data(data: td.DraftData) -> td.DraftData:
    """The MTP layer reads the target's final state where EAGLE-3 reads aux."""
    return td.DraftData(data.tokens, data.final, data.final, data.prompt_len)


def _write_target(llama_dir: Path, mtp, out_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    src = json.loads((llama_dir / "config.json").read_text())
    if src.get("attention_bias") or src.get("mlp_bias"):
        raise ValueError("the Llama target has biases; MiMo's would differ")
    theta = td._rope_theta(src)
    head_dim = src.get("head_dim", src["hidden_size"] // src["num_attention_heads"])
    if head_dim != src["hidden_size"] // src["num_attention_heads"]:
        raise ValueError("Qwen2 layers take head_dim = hidden / heads")
    config = {k: src[k] for k in _CONFIG_KEYS if k in src}
    config.update(
        architectures=[ARCHITECTURE],
        model_type="qwen2",
        num_nextn_predict_layers=1,
        rope_theta=theta,
        rope_parameters={"rope_theta": theta, "rope_type": "default"},
        torch_dtype=src.get("dtype", src.get("torch_dtype", "float32")),
        attention_dropout=0.0,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=src["num_hidden_layers"],
    )
    weights = load_file(str(llama_dir / WEIGHTS_FILE))
    dtype = weights["model.embed_tokens.weight"].dtype
    for i in range(src["num_hidden_layers"]):
        for proj in ("q_proj", "k_proj", "v_proj"):
            rows = weights[f"model.layers.{i}.self_attn.{proj}.weight"].shape[0]
            weights[f"model.layers.{i}.self_attn.{proj}.bias"] = torch.zeros(
                rows, dtype=dtype
            )
    for name, key in mtp.CKPT.items():
        weights[key] = getattr(mtp, name).detach().to(dtype).contiguous()
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    for name in _COPIED:
        if (llama_dir / name).exists():
            shutil.copy(llama_dir / name, out_dir / name)


def build_mimo_target(
    llama_dir: Path | str,
    out_dir: Path | str,
    *,
    seconds_budget: float = 170.0,
    train_steps: tuple[int, int] = (1500, 700),
    num_sequences: int = 1024,
    seq_len: int = 64,
    seed: int = SEED,
    threads: int = 1,
) -> Path:
    """Write (or reuse) the MiMo target with a trained MTP layer; return ``out_dir``.

    Serve it as target and draft: ``--speculative-algorithm NEXTN
    --speculative-draft-model-path out_dir`` (MiMo is not among the models whose
    draft path SGLang fills in). ``out_dir/eagle_gate_mtp.json`` holds the
    offline accept length (3 draft steps, topk 1) on held-out prompts, with the
    MTP layer's KV history hidden or swapped, and the training time.
    """
    import torch

    llama_dir, out_dir = Path(llama_dir), Path(out_dir)
    fp = td.target_fingerprint(llama_dir)
    info = read_mtp_info(out_dir)
    if (
        info
        and info.get("version") == VERSION
        and info.get("llama_sha256") == fp
        and (out_dir / WEIGHTS_FILE).exists()
    ):
        return out_dir

    t0 = time.monotonic()
    deadline = t0 + seconds_budget
    old_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, old_threads)))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            target = td.TinyTarget(llama_dir)
            data = _as_mtp_data(td.make_data(target, num_sequences, seq_len, seed))
            held = _as_mtp_data(td.make_data(target, 128, seq_len, seed + 1))
            t_data = time.monotonic() - t0
            mtp = _make_mtp_module(target, int(target.cfg["intermediate_size"]))
            steps, losses = td._train(
                mtp, data, phase_steps=train_steps, deadline=deadline - 10.0, seed=seed
            )
            t_train = time.monotonic() - t0 - t_data
            est = td.offline_accept_length(mtp, held)
            none = td.offline_accept_length(mtp, held, history="none")
            shuf = td.offline_accept_length(mtp, held, history="shuffle")
    finally:
        torch.set_num_threads(old_threads)

    tmp = out_dir.with_name(f"{out_dir.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _write_target(llama_dir, mtp, tmp)
    info = {
        "version": VERSION,
        "llama_sha256": fp,
        "seed": seed,
        "num_steps": td.NUM_STEPS,
        "accept_length": round(est["accept_length"], 4),
        "step_accuracy": [round(a, 4) for a in est["step_accuracy"]],
        "accept_length_no_history": round(none["accept_length"], 4),
        "accept_length_shuffled_history": round(shuf["accept_length"], 4),
        "train_steps": steps,
        "stopped_by_budget": list(steps) != list(train_steps),
        "losses": losses,
        "data_seconds": round(t_data, 1),
        "train_seconds": round(t_train, 1),
        "total_seconds": round(time.monotonic() - t0, 1),
    }
    (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
