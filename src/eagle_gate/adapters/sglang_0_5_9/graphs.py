"""SGLang 0.5.9: the plain step's own DECODE CUDA graphs (docs/plain-graphs.md).
What 0.5.9 keeps where: the target's verify-shaped ``CudaGraphRunner``
under ``model_runner.graph_runner``, its memory in GB, a second attention
backend from ``_get_attention_backend``; the shared build is
:mod:`eagle_gate.adapters.plain.capture`.

What this relies on in 0.5.9 (read from the wheel, paths under
``sglang/srt/``; line numbers and the options weighed are in the design
record docs/design/2026-12-plain-graphs.md §2):

* ``model_executor/cuda_graph_runner.py``: ``CudaGraphRunner(model_runner)``
  takes no options. Its constructor picks TARGET_VERIFY and
  ``speculative_num_draft_tokens`` tokens per request for a speculative
  target, calls ``attn_backend.init_cuda_graph_state`` and captures, into the
  module-global graph pool every runner shares. ``can_run`` checks the batch
  size, MLP sync, encoder lengths, the hidden mode and TBO, not the forward
  mode; ``recapture_if_needed`` re-captures the whole set when the hidden
  mode differs; replay reads ``model_runner.attn_backend`` at replay time.
  Hence the subclass: DECODE, width 1 and a hidden capture of at least LAST
  pinned through properties, no spec info, no re-capture; built while
  ``model_runner.attn_backend`` is the plain backend and
  ``eagle_use_aux_hidden_state`` is False (the constructor would reset the
  EAGLE-3 capture layers to their defaults).
* ``model_executor/model_runner.py``: ``_forward_raw`` replays
  ``self.graph_runner`` when the mode is a CUDA-graph mode and ``can_run``
  holds; ``ForwardBatch.init_new`` stores ``model_runner.attn_backend`` in
  the batch, so the swap is in place before the target's forward. Every
  other reader of ``graph_runner`` is on the SPEC path.
  ``_get_attention_backend(init_new_workspace=False)`` builds a second
  backend as the pdmux decode group does (and rewrites
  ``init_new_workspace``); ``graph_mem_usage`` is the graphs' memory in GB.
  Sampling is outside the graph (``TpModelWorker`` -> ``model_runner.sample``).
* Attention backends (``layers/attention/``): FlashInfer, FA3 and
  trtllm_mha keep DECODE and verify graph metadata per mode, but
  ``init_cuda_graph_state`` rebinds Triton's buffers and replaces FA3's and
  trtllm_mha's per-mode dicts (the next verify replay would raise
  ``KeyError``): the plain graphs need a backend of their own.
* Each runner owns its input buffers, with a ``[max_bs, vocab]`` fp32 logits
  buffer (about 125 MiB at batch 256 and a 128k vocabulary). A second runner
  re-initialises LoRA's graph batch info and pdmux's backends (blockers
  ``lora``, ``pdmux``); ``--enable-return-hidden-states`` would capture FULL.
* Draft side (``speculative/eagle_worker_v2.py``): SGLang captures its
  draft-extend graph on CUDA only with the Triton (or trtllm_mla) draft
  backend; ``_draft_extend_for_decode`` replays it when its ``can_run`` (the
  batch size) holds. FlashInfer, FA3 and trtllm_mha extend eagerly.
* ``model_executor/cpu_graph_runner.py``: only with ``--enable-torch-compile``,
  it asserts no speculation and needs intel_amx's hooks: no CPU test captures.
"""

from __future__ import annotations

from typing import Any

from eagle_gate.adapters.patching import PatchTarget
from eagle_gate.adapters.plain.capture import (
    ATTENTION_BACKEND_TARGET,
    check_plain_runner,
)
from eagle_gate.adapters.plain.graphs import plain_decode_pins
from eagle_gate.adapters.plain.tensors import swap_attrs

#: what the plain step's DECODE CUDA graphs use: checked, not wrapped.
GRAPH_RUNNER_MODULE = "sglang.srt.model_executor.cuda_graph_runner"
PLAIN_RUNNER_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "CudaGraphRunner.__init__", ("self", "model_runner")
)
PLAIN_CAN_RUN_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "CudaGraphRunner.can_run", ("self", "forward_batch")
)
PLAIN_REPLAY_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "CudaGraphRunner.replay", ("self", "forward_batch")
)
PLAIN_RECAPTURE_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE,
    "CudaGraphRunner.recapture_if_needed",
    ("self", "forward_batch"),
)
PLAIN_SPEC_INFO_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "CudaGraphRunner.get_spec_info", ("self", "num_tokens")
)
#: where the target keeps its graph runner (verify-shaped with speculation).
GRAPH_ATTR = "graph_runner"
TARGETS = (
    PLAIN_RUNNER_TARGET,
    PLAIN_CAN_RUN_TARGET,
    PLAIN_REPLAY_TARGET,
    PLAIN_RECAPTURE_TARGET,
    PLAIN_SPEC_INFO_TARGET,
    ATTENTION_BACKEND_TARGET,
)


_PLAIN_RUNNER_CLS: Any = None


def _plain_runner_cls() -> Any:
    """``PlainDecodeCudaGraphRunner(CudaGraphRunner)``, built on first use.

    0.5.9's runner takes no options and picks TARGET_VERIFY with
    ``num_draft_tokens`` per request for a speculative target inside its
    constructor (which also captures). The subclass pins DECODE, one token per
    request and a hidden-state capture of at least LAST through properties
    whose setters ignore (or raise to LAST) the constructor's assignments,
    gives no spec info and never re-captures (a LAST graph serves NULL and
    LAST requests; FULL never reaches the plain step).
    """
    global _PLAIN_RUNNER_CLS
    if _PLAIN_RUNNER_CLS is not None:
        return _PLAIN_RUNNER_CLS
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    class PlainDecodeCudaGraphRunner(plain_decode_pins(), CudaGraphRunner):
        @property
        def num_tokens_per_bs(self):
            return 1

        @num_tokens_per_bs.setter
        def num_tokens_per_bs(self, value):
            pass  # the constructor's num_draft_tokens

        def recapture_if_needed(self, forward_batch):
            return None

    _PLAIN_RUNNER_CLS = PlainDecodeCudaGraphRunner
    return _PLAIN_RUNNER_CLS


def version_blockers(model_runner: Any, server_args: Any) -> str | None:
    """0.5.9's reasons the plain step gets no DECODE graphs
    (docs/plain-graphs.md, "Why the set stays off")."""
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner

    if getattr(server_args, "disable_cuda_graph", False):
        return "cuda_graph_disabled"
    if not isinstance(getattr(model_runner, GRAPH_ATTR, None), CudaGraphRunner):
        return "no_target_graphs"
    if getattr(server_args, "enable_return_hidden_states", False):
        # the runner would capture FULL and decline every LAST plain step
        return "return_hidden_states"
    if getattr(server_args, "forward_hooks", None):
        # registered after SGLang's capture; a later capture would trace them
        return "forward_hooks"
    return None


def verify_graph_mib(model_runner: Any) -> float:
    """SGLang's measured graph memory of the target (GB in 0.5.9) in MiB."""
    return float(getattr(model_runner, "graph_mem_usage", 0) or 0) * 1024


def build_plain_backend(model_runner: Any) -> Any:
    """A second target attention backend (0.5.9's pdmux precedent); the
    workspace stays shared. ``_get_attention_backend`` rewrites
    ``init_new_workspace`` on the model runner: put back afterwards."""
    with swap_attrs(model_runner, init_new_workspace=model_runner.init_new_workspace):
        return model_runner._get_attention_backend(init_new_workspace=False)


def build_plain_runner(model_runner: Any, backend: Any, cls: Any = None) -> Any:
    """Construct (and so capture) the plain DECODE runner bound to ``backend``.

    During construction the model runner's ``attn_backend`` is the plain one
    (read for ``init_cuda_graph_state``, capture and replay metadata) and
    ``eagle_use_aux_hidden_state`` is False so the constructor does not reset
    the EAGLE3 capture layers to their defaults."""
    cls = cls or _plain_runner_cls()
    verify = getattr(model_runner, GRAPH_ATTR)
    with swap_attrs(
        model_runner, attn_backend=backend, eagle_use_aux_hidden_state=False
    ):
        runner = cls(model_runner)
    too_big = runner.max_bs > verify.max_bs
    check_plain_runner(
        runner,
        verify,
        width=runner.num_tokens_per_bs,
        more=[f"max_bs {runner.max_bs} > verify's {verify.max_bs}"] if too_big else [],
    )
    return runner
