"""SGLang 0.5.23: the plain step's own DECODE CUDA graphs (docs/plain-graphs.md).
What 0.5.23 keeps where: the target's verify-shaped
``DecodeCudaGraphRunner`` under ``model_runner.decode_cuda_graph_runner``,
its memory per phase, a second attention backend bound to the KV index
translator; the shared build is :mod:`eagle_gate.adapters.plain.capture`.

What this relies on in 0.5.23 (read from the wheel, paths under
``sglang/srt/``; line numbers and the options weighed are in the design
record docs/design/2026-12-plain-graphs.md §3 and §4):

* ``model_executor/runner/decode_cuda_graph_runner.py``:
  ``DecodeCudaGraphRunner(model_runner, *, attn_backend=None,
  speculative_num_steps=None, speculative_num_draft_tokens=None, ...)``.
  ``speculative_num_draft_tokens=1`` gives width 1, but the constructor
  still switches a speculative target to TARGET_VERIFY, calls
  ``self.attn_backend.init_cuda_graph_state`` and captures; hence the
  subclass that pins DECODE, a hidden capture of at least LAST and no spec
  info, as SGLang's ``EAGLEDraftExtendCudaGraphRunner`` and
  ``UnoDecodeCudaGraphRunner`` specialise the same class. Nothing else is
  swapped during construction: capture uses the runner's own backend.
  ``can_run_graph`` checks the width, the batch size, MLP sync, encoder
  lengths and TBO, not the forward mode; ``load_batch`` refuses a runtime
  hidden mode above the captured one, and nothing re-captures. The logits
  buffer is a view of one process-shared buffer, and equal input buffers
  are shared across runners (filled right before each replay).
* ``model_executor/model_runner.py``: ``_forward_raw`` runs
  ``decode_cuda_graph_runner.execute`` when ``can_run_graph`` holds, else
  the eager runner with ``model_runner.attn_backend``, so the backend is
  swapped together with the runner. ``_get_attention_backend`` builds a
  second backend, bound with ``kv_index_translator.bind_and_verify_backends``
  as ``init_attention_backends`` binds the first; ``graph_memory_usage``
  holds the graphs' memory per phase. SGLang swaps the same two attributes
  itself (``EAGLEWorkerV2.apply_runtime_state``, UNO); adaptive speculation's
  "off" state is a 1-token verify, not a plain decode, and needs
  ``--speculative-adaptive``, which the gate refuses.
* Attention backends: as on 0.5.9, ``init_cuda_graph_state`` replaces the
  graph state (Triton's buffers, FA3's and trtllm_mha's per-mode dicts);
  SGLang itself builds a new backend for every extra graph set.
* Blockers read here: ``check_cuda_graph_backend(Phase.DECODE,
  Backend.DISABLED)``, LoRA (shared graph batch info), forward hooks
  (registered after SGLang's capture), elastic EP (resets the graph pool),
  graph-pool borrowing (extents carved at capture).
* Draft side (``speculative/eagle_worker_v2.py``): the draft-extend graph is
  captured on CUDA for Triton, FlashInfer, FA3, trtllm_mha and more, unless
  ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH``; ``_draft_extend_for_decode``
  replays it when the width equals ``num_draft_tokens`` (true for the plain
  step's flat layout) and the batch fits.
* ``model_executor/cpu_graph_runner.py``: chosen on CPU only with
  ``--enable-torch-compile``; it asserts no speculation, and only intel_amx
  has its hooks: no CPU test captures.
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
from eagle_gate.adapters.resolved import sglang_flag

#: what the plain step's DECODE CUDA graphs use: checked, not wrapped.
GRAPH_RUNNER_MODULE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
PLAIN_RUNNER_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE,
    "DecodeCudaGraphRunner.__init__",
    (
        "self",
        "model_runner",
        "attn_backend",
        "speculative_num_steps",
        "speculative_num_draft_tokens",
    ),
)
PLAIN_CAN_RUN_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE,
    "DecodeCudaGraphRunner.can_run_graph",
    ("self", "forward_batch"),
)
PLAIN_SPEC_INFO_TARGET = PatchTarget(
    GRAPH_RUNNER_MODULE, "DecodeCudaGraphRunner.get_spec_info", ("self", "num_tokens")
)
#: where the target keeps its decode graph runner (verify-shaped with speculation).
GRAPH_ATTR = "decode_cuda_graph_runner"
#: 0.5.23 environment switches that carve graph-pool extents at capture.
POOL_BORROW_ENV = (
    "SGLANG_ENABLE_GRAPH_POOL_BORROW",
    "SGLANG_ENABLE_GRAPH_POOL_PRECARVE",
)
TARGETS = (
    PLAIN_RUNNER_TARGET,
    PLAIN_CAN_RUN_TARGET,
    PLAIN_SPEC_INFO_TARGET,
    ATTENTION_BACKEND_TARGET,
)


_PLAIN_RUNNER_CLS: Any = None


def _plain_runner_cls() -> Any:
    """``PlainDecodeGraphRunner(DecodeCudaGraphRunner)``, built on first use.

    0.5.23's runner switches a speculative target to TARGET_VERIFY inside its
    constructor (which also captures); ``speculative_num_draft_tokens=1``
    gives width 1 but not the mode. The subclass pins DECODE (every reader
    sees it from the start), keeps the hidden-state capture at least LAST and
    gives no spec info, as SGLang's own ``EAGLEDraftExtendCudaGraphRunner`` and
    ``UnoDecodeCudaGraphRunner`` specialise the same class.
    """
    global _PLAIN_RUNNER_CLS
    if _PLAIN_RUNNER_CLS is not None:
        return _PLAIN_RUNNER_CLS
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    class PlainDecodeGraphRunner(plain_decode_pins(), DecodeCudaGraphRunner):
        pass

    _PLAIN_RUNNER_CLS = PlainDecodeGraphRunner
    return _PLAIN_RUNNER_CLS


def version_blockers(model_runner: Any, server_args: Any) -> str | None:
    """0.5.23's reasons the plain step gets no DECODE graphs
    (docs/plain-graphs.md, "Why the set stays off")."""
    from sglang.srt.model_executor.cuda_graph_config import (
        Backend,
        Phase,
        check_cuda_graph_backend,
    )
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    if getattr(server_args, "disable_cuda_graph", False) or check_cuda_graph_backend(
        Phase.DECODE, Backend.DISABLED
    ):
        return "cuda_graph_disabled"
    if not isinstance(getattr(model_runner, GRAPH_ATTR, None), DecodeCudaGraphRunner):
        return "no_target_graphs"
    if getattr(model_runner, "lora_manager", None) is not None:
        return "lora"
    if getattr(model_runner, "enable_elastic_ep", False):
        return "elastic_ep"
    try:
        from sglang.srt.runtime_context import get_observability

        if get_observability().forward_hooks:
            return "forward_hooks"
    except (ImportError, ValueError):
        pass
    if any(sglang_flag(name) for name in POOL_BORROW_ENV):
        return "graph_pool_borrow"
    return None


def verify_graph_mib(model_runner: Any) -> float:
    """SGLang's measured decode/verify graph memory of the target (GB, as the
    capture records it; inferred) in MiB."""
    usage = getattr(model_runner, "graph_memory_usage", None) or {}
    return sum(float(usage.get(k, 0) or 0) for k in ("decode", "target_verify")) * 1024


def build_plain_backend(model_runner: Any) -> Any:
    """A second target attention backend bound to the model runner's KV index
    translator, as ``init_attention_backends`` binds the first; the workspace
    stays shared and ``init_new_workspace`` is put back."""
    with swap_attrs(
        model_runner,
        init_new_workspace=getattr(model_runner, "init_new_workspace", False),
    ):
        backend = model_runner._get_attention_backend(init_new_workspace=False)
    translator = getattr(model_runner, "kv_index_translator", None)
    if translator is not None:
        translator.bind_and_verify_backends([backend])
    return backend


def build_plain_runner(model_runner: Any, backend: Any, cls: Any = None) -> Any:
    """Construct (and so capture) the plain DECODE runner on ``backend``:
    ``attn_backend=`` and one token per request, as adaptive speculation and
    UNO construct theirs."""
    cls = cls or _plain_runner_cls()
    verify = getattr(model_runner, GRAPH_ATTR)
    runner = cls(
        model_runner,
        attn_backend=backend,
        speculative_num_steps=0,
        speculative_num_draft_tokens=1,
    )
    unbound = runner.attn_backend is not backend
    check_plain_runner(
        runner,
        verify,
        width=runner.captured_req_width,
        more=["not bound to the plain attention backend"] if unbound else [],
    )
    return runner
