"""Command lines and environments for real SGLang servers that speculate on CPU.

Tests start these servers with ``support.server.serve`` (``draft_dir`` given:
speculative). Two kinds of server, both built on ``support.server``
(``cpu_server_args``, ``cpu_server_env``, ``running_server``):

* a baseline: no speculation, the ``torch_native`` attention backend, nothing
  CI-specific;
* a speculative EAGLE-3 server: SGLang's real ``EAGLEWorkerV2`` (draft forward,
  TARGET_VERIFY, draft extend) on the Triton attention backend, whose kernels
  run under the Triton interpreter, with the CPU stand-ins of
  ``ci/cpu_spec/eagle_gate_ci_spec`` switched on (the CI environments import
  that package from the checkout; ``.ci/make-sglang-env.sh`` writes its .pth):
  its two attention kernels as torch stand-ins unless
  ``EAGLE_GATE_CI_ATTENTION=triton`` (``INTERPRETED_ATTENTION`` below).

``launcher`` picks ``"sglang"`` (stock ``python -m sglang.launch_server``,
entry-point plugins off) or ``"gate"`` (``python -m eagle_gate.launch``, with
``gate_args`` such as ``--gate-policy`` passed through). ``overlap`` picks the
scheduler: on 0.5.23 overlap is on only through the test switch
``EAGLE_GATE_CI_FORCE_OVERLAP=1`` (SGLang turns it off for speculation on CPU)
and off with ``--disable-overlap-schedule``; 0.5.9 runs speculation (spec v2)
with the overlap scheduler only.

A verify step takes about 0.5 s on two cores: keep requests few and short.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from support.server import AUTO, NO_PLUGINS, cpu_server_args, cpu_server_env

LAUNCHERS = ("sglang", "gate")

# Chain drafts (topk 1), the only shape the gate speculates with.
SPEC_STEPS = 3
SPEC_TOPK = 1
SPEC_DRAFT_TOKENS = 4


#: the draft-shape flags; without them SGLang chooses a shape itself.
SHAPE_FLAGS = (
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)


def without_shape(args: Sequence[str]) -> list[str]:
    """``args`` without the draft-shape flags and their values (SGLang then
    chooses the shape: a tree of 5 steps, topk 4, 8 draft tokens for a
    Llama target)."""
    out = list(args)
    for flag in SHAPE_FLAGS:
        at = out.index(flag)
        del out[at : at + 2]
    return out


def sglang_version() -> str:
    return metadata.version("sglang")


def _launch(stock: list[str], launcher: str, gate_args: Sequence[str]) -> list[str]:
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    assert stock[1:3] == ["-m", "sglang.launch_server"], stock[:3]
    if launcher == "sglang":
        if gate_args:
            raise ValueError("gate_args need launcher='gate'")
        return stock
    return [stock[0], "-m", "eagle_gate.launch", *stock[3:], *gate_args]


def _set_flag(args: list[str], flag: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


#: what Triton attention needs on CPU besides ``--attention-backend triton``:
#: no CUDA graphs, and one KV split (the interpreted decode kernel is ~1.5x
#: faster; the torch stand-in ignores it) ...
TRITON_CPU_ARGS = ("--disable-cuda-graph", "--triton-attention-num-kv-splits", "1")
#: ... and in the environment: Triton interpreted, the CPU stand-ins of
#: ``ci/cpu_spec`` on (every speculative server, and baselines that share
#: their kernels)
TRITON_CPU_ENV = {"TRITON_INTERPRET": "1", "EAGLE_GATE_CI_SPEC": "1"}


def baseline_server_args(
    model_dir: Path | str,
    port: int,
    *,
    launcher: str = "sglang",
    gate_args: Sequence[str] = (),
    python: str | None = None,
    host: str = "127.0.0.1",
) -> list[str]:
    """A server without speculation (torch_native attention)."""
    args = cpu_server_args(model_dir, port, python=python, host=host)
    return _launch(args, launcher, gate_args)


def _plugins(launcher: str, plugins: str | None) -> str | None:
    """``SGLANG_PLUGINS`` for ``cpu_server_env``: ``AUTO`` is none under the
    stock launcher and inherited under the gate's."""
    if plugins != AUTO:
        return plugins
    return NO_PLUGINS if launcher == "sglang" else None


def baseline_server_env(
    *, launcher: str = "sglang", plugins: str | None = AUTO, **extra: str
) -> dict[str, str]:
    """Environment of the baseline; by default the stock launcher loads no
    plugins (``plugins=None`` inherits ``SGLANG_PLUGINS``)."""
    return cpu_server_env(plugins=_plugins(launcher, plugins), **extra)


def spec_server_args(
    target_dir: Path | str,
    draft_dir: Path | str,
    port: int,
    *,
    launcher: str = "sglang",
    overlap: bool = True,
    gate_args: Sequence[str] = (),
    python: str | None = None,
    host: str = "127.0.0.1",
    algorithm: str = "EAGLE3",
) -> list[str]:
    """A speculative server on the Triton backend (topk 1, 3 steps, 4 draft
    tokens): ``algorithm`` EAGLE3 (an EAGLE-3 head in ``draft_dir``) or NEXTN
    (an MTP model: ``draft_dir`` is the target's own directory)."""
    if algorithm not in ("EAGLE3", "NEXTN"):
        raise ValueError(f"algorithm must be EAGLE3 or NEXTN, got {algorithm!r}")
    if not overlap and sglang_version() == "0.5.9":
        raise ValueError("SGLang 0.5.9 speculates on CPU with overlap on only")
    args = cpu_server_args(target_dir, port, python=python, host=host)
    args = _set_flag(args, "--attention-backend", "triton")
    args += [
        *TRITON_CPU_ARGS,
        "--speculative-algorithm",
        algorithm,
        "--speculative-draft-model-path",
        str(draft_dir),
        "--speculative-num-steps",
        str(SPEC_STEPS),
        "--speculative-eagle-topk",
        str(SPEC_TOPK),
        "--speculative-num-draft-tokens",
        str(SPEC_DRAFT_TOKENS),
    ]
    if not overlap:
        args.append("--disable-overlap-schedule")
    return _launch(args, launcher, gate_args)


def spec_server_env(
    *,
    launcher: str = "sglang",
    overlap: bool = True,
    shim_log: bool = True,
    plugins: str | None = AUTO,
    **extra: str,
) -> dict[str, str]:
    """Environment of a speculative server: CPU stand-ins on, Triton interpreted.

    ``shim_log`` logs each stand-in's first call to the server log
    (``[eagle_gate_ci_spec] pid N first call: ...``).
    """
    env = {**TRITON_CPU_ENV, "EAGLE_GATE_CI_SPEC_LOG": "1" if shim_log else "0"}
    if sglang_version() == "0.5.9":
        env["SGLANG_ENABLE_SPEC_V2"] = "1"
    elif overlap:
        env["EAGLE_GATE_CI_FORCE_OVERLAP"] = "1"
    env.update(extra)
    return cpu_server_env(plugins=_plugins(launcher, plugins), **env)


def generate_greedy(
    base_url: str,
    prompt: str,
    max_new_tokens: int,
    *,
    timeout_s: float = 300.0,
) -> dict:
    """One greedy ``/generate`` that runs to ``max_new_tokens`` (EOS ignored):
    ``support.gated_server.generate`` with a 300 s timeout.

    Returns ``{"output_ids": [...], "meta_info": {...}}``.
    """
    from support.gated_server import generate

    return generate(base_url, prompt, max_new_tokens, timeout_s=timeout_s)


def generate_concurrent(
    base_url: str,
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    timeout_s: float = 300.0,
) -> list[dict]:
    """``generate_greedy`` for all prompts at once (one thread each), in order."""
    with ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
        futures = [
            pool.submit(
                generate_greedy, base_url, p, max_new_tokens, timeout_s=timeout_s
            )
            for p in prompts
        ]
        return [f.result() for f in futures]


#: a speculative server's attention (``EAGLE_GATE_CI_ATTENTION``): the torch
#: stand-ins of ``ci/cpu_spec`` (the default), or SGLang's own Triton kernels,
#: interpreted (``triton``): the first calls its log shows
TORCH_ATTENTION = {"decode_attention_fwd(torch)", "extend_attention_fwd(torch)"}
INTERPRETED_ATTENTION = {
    "decode_attention_fwd(interpreted)",
    "extend_attention_fwd(interpreted)",
}


def shim_first_calls(log_text: str) -> set[str]:
    """Names of the CPU stand-ins a server log shows were called."""
    mark = "first call: "
    return {
        line.split(mark, 1)[1].strip()
        for line in log_text.splitlines()
        if "[eagle_gate_ci_spec]" in line and mark in line
    }
