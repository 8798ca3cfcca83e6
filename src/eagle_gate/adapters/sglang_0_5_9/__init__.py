"""Adapter for SGLang 0.5.9 (the spec-v2 overlap path of the reference runs).

What this version needs (read from the 0.5.9 wheel):

* EAGLE / EAGLE3 run through ``EAGLEWorkerV2`` only when the environment has
  ``SGLANG_ENABLE_SPEC_V2=1`` and overlap scheduling is on; otherwise SGLang
  falls back to the v1 worker, which the gate does not patch (refused).
* ``EAGLEWorkerV2.forward_batch_generation(self, model_worker_batch)``.
* The resolver ``SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids``
  takes a FIXED stride ``self.draft_worker.speculative_num_draft_tokens``.
* No plugin mechanism: schedulers are spawned, so the launcher hands SGLang
  :func:`run_scheduler_process`, which instruments the child and then runs
  SGLang's own entry function.
* One 0.5.9 bug kills an EAGLE-3 server on a request with input logprobs;
  :mod:`.fixes` carries the fix, applied where the installed code has it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from eagle_gate.adapters.hooks import version_patches
from eagle_gate.adapters.patching import PatchTarget
from eagle_gate.adapters.refusals import GateRefused, check_speculation
from eagle_gate.adapters.resolved import (
    ResolvedSpec,
    server_args_check,
    sglang_flag,
)
from eagle_gate.adapters.sglang_0_5_9 import dp, fixes, graphs, plain  # noqa: F401
from eagle_gate.adapters.sglang_0_5_9.resolve import (  # noqa: F401 (adapter API)
    resolve_argv,
    resolve_spec,
)

SGLANG_VERSIONS = ("0.5.9",)
#: no per-depth runtime states in 0.5.9: the gate stays binary (check_spec
#: refuses --gate-depths other than off)
depths = None
#: SGLang's switch that drops the MLP-sync gather under DP attention.
SKIP_ALL_GATHER = "SGLANG_SCHEDULER_SKIP_ALL_GATHER"
NAME = "sglang-0.5.9"

WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
RESOLVER_MODULE = "sglang.srt.managers.scheduler_output_processor_mixin"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"

WORKER_TARGET = PatchTarget(
    WORKER_MODULE,
    "EAGLEWorkerV2.forward_batch_generation",
    ("self", "model_worker_batch"),
)
#: the name of the worker's batch parameter (keyword or position 1).
WORKER_BATCH_PARAM = "model_worker_batch"
RESOLVER_TARGET = PatchTarget(
    RESOLVER_MODULE,
    "SchedulerOutputProcessorMixin._resolve_spec_overlap_token_ids",
    ("self", "result", "batch"),
)
SCHEDULER_INIT_TARGET = PatchTarget(
    SCHEDULER_MODULE,
    "Scheduler.__init__",
    ("self", "server_args", "port_args", "gpu_id", "tp_rank"),
)
LAUNCH_TARGET = PatchTarget(
    "sglang.srt.entrypoints.http_server",
    "launch_server",
    ("server_args", "init_tokenizer_manager_func", "run_scheduler_process_func"),
)

#: environment SGLang 0.5.9 reads to choose the spec-v2 worker.
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"
#: the environment 0.5.9 reads while resolving its arguments: doctor resolves
#: a command line with these as the launcher would leave them.
LAUNCH_ENV_KEYS: tuple[str, ...] = (SPEC_V2_ENV,)
#: 0.5.9 has no ``sglang.srt.plugins`` loader (see :func:`load_sglang_plugins`).
HAS_SGLANG_PLUGINS = False


#: this package, as the shared code sees it (eagle_gate.adapters.protocol).
ADAPTER = sys.modules[__name__]
#: the wrappers, and every target this adapter relies on (doctor; untested
#: versions).
INSTRUMENTOR, TARGETS = version_patches(ADAPTER, LAUNCH_TARGET)
_instrument, _uninstrument = INSTRUMENTOR.instrument, INSTRUMENTOR.uninstrument


def launch_environment(requested: argparse.Namespace) -> dict[str, str]:
    """The environment the launcher sets before SGLang parses anything, given
    the raw flags (``resolved.requested_flags``): with speculation requested,
    ``SGLANG_ENABLE_SPEC_V2=1``, because 0.5.9 resolves its arguments and
    chooses its worker from that variable, and the gate patches only the
    spec-v2 worker. Not a judgement: :func:`check_spec` judges the result."""
    return {SPEC_V2_ENV: "1"} if requested.speculative_algorithm else {}


def load_sglang_plugins() -> None:
    """Nothing to load: 0.5.9 has no ``sglang.srt.plugins`` loader, so the
    launcher instruments schedulers itself (:func:`run_scheduler_process`)."""


def check_spec(
    spec: ResolvedSpec,
    environ: dict | None = None,
    *,
    draft_sync: str | None = None,
    depths: str = "off",
) -> tuple[bool, str]:
    """Refuse speculative setups the gate cannot run on 0.5.9 (see module doc),
    judged on SGLang's resolution (:func:`resolve.resolve_spec`)."""
    import os

    env = os.environ if environ is None else environ
    gated, state = check_speculation(
        spec,
        extra_refusals=[
            (
                not spec.overlap,
                "eagle_gate on SGLang 0.5.9 needs the spec-v2 worker, which SGLang "
                "only uses with overlap scheduling: drop --disable-overlap-schedule",
            ),
            (
                spec.attn_dp_size > 1 and sglang_flag(SKIP_ALL_GATHER, env),
                f"{SKIP_ALL_GATHER}=1 with data-parallel attention is refused: "
                "the DP ranks then run without the MLP-sync gather that carries "
                "the gate's vote on the mode; unset it",
            ),
            (
                depths != "off",
                f"--gate-depths {depths}: SGLang 0.5.9 has no per-depth runtime "
                "states, so the gate cannot change the draft depth per batch there "
                "(supported on SGLang 0.5.23); use --gate-depths off",
            ),
        ],
        draft_sync=draft_sync,
        gates_dp_attention=dp.GATES_DP_ATTENTION,
    )
    if gated:
        if env.get(SPEC_V2_ENV, "").lower() not in {"1", "true", "yes", "on"}:
            raise GateRefused(
                f"{SPEC_V2_ENV}=1 is required on SGLang 0.5.9 (without it SGLang runs "
                "the v1 EAGLE worker); python -m eagle_gate.launch sets it for you"
            )
    return gated, state


#: :func:`check_spec` of a record's resolved view
check_server_args = server_args_check(check_spec, resolve_spec)


def api_keys(http_server: Any) -> tuple[str | None, str | None] | None:
    """SGLang's ``(api_key, admin_api_key)`` as 0.5.9's HTTP server keeps them
    (its tokenizer manager's server args; ``http_server`` is
    ``sglang.srt.entrypoints.http_server``), None before it has them. The
    control endpoint defers to SGLang's key check when one is set."""
    try:
        args = http_server._global_state.tokenizer_manager.server_args
        return args.api_key, getattr(args, "admin_api_key", None)
    except Exception:
        return None


def committed_len(req: Any) -> int:
    """A request's committed KV length (CPU bookkeeping). 0.5.9 always hands
    the worker CPU sequence lengths, so this estimate is never needed there."""
    return req.kv_committed_len


def activate_in_scheduler(scheduler: Any, config=None):
    """Runs right after ``Scheduler.__init__`` in each scheduler process."""
    from eagle_gate.adapters.activation import activate_scheduler

    return activate_scheduler(
        ADAPTER,
        scheduler,
        tp_rank=int(getattr(scheduler, "tp_rank", 0) or 0),
        tp_size=int(getattr(scheduler, "tp_size", 1) or 1),
        dp_rank=getattr(scheduler, "dp_rank", None),
        worker_hint=f"the gate needs the spec-v2 path ({SPEC_V2_ENV}=1, overlap "
        "scheduling on)",
        config=config,
    )


def check_scheduler(scheduler: Any, config: Any) -> None:
    """Nothing to refuse on 0.5.9 once the scheduler is built: it always
    hands the worker CPU sequence lengths (lazy draft sync's bookkeeping)."""


def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """Scheduler entry handed to SGLang: instrument this (spawned) process, then
    run SGLang's own ``run_scheduler_process``. A patch or version fix that
    cannot be applied raises here, the scheduler dies before reporting ready,
    and the launch stops.
    """
    _instrument()
    INSTRUMENTOR.require_applied([SCHEDULER_MODULE, RESOLVER_MODULE])
    fixes.apply_fixes()
    from sglang.srt.managers.scheduler import run_scheduler_process as original

    return original(*args, **kwargs)


def serve(server_args: Any) -> None:
    """Run SGLang's HTTP server with our scheduler entry function."""
    if getattr(server_args, "grpc_mode", False) or getattr(
        server_args, "encoder_only", False
    ):
        raise GateRefused(
            "python -m eagle_gate.launch runs SGLang's HTTP server; --grpc-mode "
            "and --encoder-only are not supported on SGLang 0.5.9"
        )
    from sglang.srt.entrypoints.http_server import launch_server

    launch_server(server_args, run_scheduler_process_func=run_scheduler_process)
