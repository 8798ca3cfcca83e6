"""The wrappers the gate installs on SGLang, and the process's gate they use.

Three wrappers, the same for every SGLang version (a version passes only its
patch targets and the name of the worker's batch parameter):

* around ``EAGLEWorkerV2.forward_batch_generation``: decode batches go
  through :meth:`GateRuntime.decide <eagle_gate.runtime.GateRuntime.decide>`
  and then the plain step or SGLang's stock step; everything else passes;
* around the scheduler's spec-v2 result resolver: the resolved accept lengths
  go to :meth:`GateRuntime.observe <eagle_gate.runtime.GateRuntime.observe>`;
* around ``Scheduler.__init__``: the version's activation once SGLang's own
  init has run (it may refuse the setup).

Never breaking the host: a failure of the gate's own logic in a wrapper is
counted (``internal_errors``) and that step runs SGLang's stock path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eagle_gate.adapters.batch import propose_for_batch
from eagle_gate.adapters.dp_vote import after_vote
from eagle_gate.adapters.patching import Instrumentor, PatchTarget
from eagle_gate.adapters.plain.tensors import read_draft_matches
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime

__all__ = [
    "ACTIVE",
    "RESULT_MODE_ATTR",
    "RESULT_STEP_ATTR",
    "SCHEDULER_ENTRY_TARGET",
    "version_patches",
    "make_worker_wrapper",
    "resolver_wrapper",
    "scheduler_init_wrapper",
]

#: attributes the worker wrapper sets on a result for the resolver wrapper.
RESULT_MODE_ATTR = "eagle_gate_mode"
RESULT_STEP_ATTR = "eagle_gate_step"
#: the SPEC depth that ran (0: PLAIN), only where the policy chooses depths.
RESULT_DEPTH_ATTR = "eagle_gate_depth"


class _Active:
    """The gate of this process (one per scheduler process)."""

    #: the runtime the wrappers use: None unless the gate is gating (idle
    #: servers and other processes: the wrappers pass everything through).
    runtime: GateRuntime | None = None
    #: this process's runtime whether gating or idle (status, metrics, control).
    gate: GateRuntime | None = None
    #: the ops thread of this process (eagle_gate.ops.OpsService), if active.
    ops: Any = None


ACTIVE = _Active()


def make_worker_wrapper(batch_param: str) -> Callable:
    """The wrapper around ``EAGLEWorkerV2.forward_batch_generation``;
    ``batch_param``: the name of the version's batch parameter.

    Decode batches go through the policy; everything else passes untouched.
    Any failure of the gate's own logic runs the stock step (never a crash).
    """

    def forward_batch_generation(wrapped, instance, args, kwargs):
        runtime = ACTIVE.runtime
        if runtime is None:
            return wrapped(*args, **kwargs)
        try:
            # see resolver_wrapper for why ``instance is None`` shifts it
            batch = (
                kwargs[batch_param] if batch_param in kwargs else args[instance is None]
            )
            fm = batch.forward_mode
            decode = not (fm.is_extend() or batch.is_extend_in_batch or fm.is_idle())
            if not decode and not fm.is_idle():
                runtime.note_non_decode_batch()
        except Exception as exc:
            runtime.guards.internal_error("inspecting the batch", exc)
            return wrapped(*args, **kwargs)
        vote = runtime.dp_vote
        if vote is not None:
            # DP attention: the mode was voted on at SGLang's MLP-sync gather
            # (adapters/dp_vote.py); every rank runs the agreed one, and this
            # rank's decision is recorded as the vote left it.
            agreed, decision = vote.take()
            if not decode or decision is None or agreed is None:
                return wrapped(*args, **kwargs)  # idle, extend, or no vote
            try:
                runtime.record(after_vote(decision, agreed, runtime.counters))
                mode = decision.mode
            except Exception as exc:
                runtime.guards.internal_error("recording the DP vote", exc)
                mode = agreed
            step = decision.step
        elif not decode:
            return wrapped(*args, **kwargs)
        else:
            try:
                # recorded at once (DP attention: after the vote, above)
                decision = propose_for_batch(runtime, batch)
                runtime.record(decision)
            except Exception as exc:
                runtime.guards.internal_error("deciding", exc)
                return wrapped(*args, **kwargs)
            mode = decision.mode
            step = decision.step
        depths = runtime.depth_control
        if depths is not None and mode is Mode.SPEC:
            # the depth SGLang's own per-batch activation then applies
            # (adapters/sglang_0_5_23/depths.py); 0: the configured one
            depths.depth = decision.depth or depths.configured
        if mode is Mode.PLAIN:
            # A failing plain step runs SGLang's stock step instead (counted;
            # repeated failures degrade the gate to stock for the rest of the run).
            result, mode = runtime.run_plain(instance, wrapped, args, kwargs)
        else:
            plain = runtime.plain_step
            if plain is not None and plain.before_spec is not None:
                try:
                    plain.before_spec(instance, batch)
                except Exception as exc:  # the draft stays stale; outputs do not
                    runtime.guards.internal_error("catching the draft up", exc)
            result = wrapped(*args, **kwargs)
        setattr(result, RESULT_MODE_ATTR, mode)
        setattr(result, RESULT_STEP_ATTR, step)
        if depths is not None:
            # a failed plain step ran the stock step at the control's depth
            ran = 0 if mode is Mode.PLAIN else depths.depth
            setattr(result, RESULT_DEPTH_ATTR, ran)
        return result

    return forward_batch_generation


def resolver_wrapper(wrapped, instance, args, kwargs):
    """The wrapper around the scheduler's spec-v2 result resolver."""
    tokens = wrapped(*args, **kwargs)
    runtime = ACTIVE.runtime
    if runtime is None:
        return tokens
    # Called on an instance, args are (result, batch); called through the
    # class with the instance first (wrapt passes instance=None), one later.
    result = kwargs["result"] if "result" in kwargs else args[instance is None]
    mode = getattr(result, RESULT_MODE_ATTR, None)
    if mode is None:
        return tokens
    try:
        # the accept lengths, counted in C (no bytecodes per request); a
        # plain step under eager sync also carries its draft matches
        runtime.observe(
            mode,
            getattr(result, RESULT_STEP_ATTR),
            list(map(len, tokens)),
            read_draft_matches(result),
            getattr(result, RESULT_DEPTH_ATTR, None),
        )
    except Exception as exc:
        runtime.guards.internal_error("observing", exc)
    return tokens


def dp_cast_wrapper(vote: Any) -> Callable:
    """The wrapper around a version's ``prepare_mlp_sync_batch_raw(local_batch,
    ...)``: this rank's decision cast as its vote before SGLang's MLP-sync
    gather (:func:`eagle_gate.adapters.dp_vote.cast_for`)."""
    from eagle_gate.adapters.dp_vote import cast_for

    def cast(wrapped, instance, args, kwargs):
        batch = kwargs["local_batch"] if "local_batch" in kwargs else args[0]
        cast_for(vote, ACTIVE.runtime, batch)
        return wrapped(*args, **kwargs)

    return cast


def replaced_by(function: Callable) -> Callable:
    """A wrapper that runs the version's own copy ``function(instance, *args,
    **kwargs)`` of a method instead of SGLang's (a gather row with the vote
    in it), still installed and checked like every patch."""

    def replace(wrapped, instance, args, kwargs):
        return function(instance, *args, **kwargs)

    return replace


def scheduler_init_wrapper(activate_in_scheduler: Callable[[Any], Any]) -> Callable:
    """The wrapper around ``Scheduler.__init__``: SGLang's own init, then the
    gate's activation in this scheduler process (which may refuse the setup)."""

    def init(wrapped, instance, args, kwargs):
        wrapped(*args, **kwargs)
        activate_in_scheduler(instance)

    return init


#: SGLang's scheduler process entry (both versions): checked, not wrapped.
#: 0.5.9's launcher hands SGLang a replacement that instruments the spawned
#: process first; 0.5.23 loads plugins (eagle_gate among them) at its start.
SCHEDULER_ENTRY_TARGET = PatchTarget(
    "sglang.srt.managers.scheduler",
    "run_scheduler_process",
    ("server_args", "port_args", "gpu_id", "tp_rank"),
)


def version_patches(
    version: Any,
    *checked: PatchTarget,
    patches: tuple[tuple[PatchTarget, Callable], ...] = (),
) -> tuple[Instrumentor, tuple[PatchTarget, ...]]:
    """A version's instrumentor and every target it relies on.

    The instrumentor puts the three wrappers on the targets the version
    module names (``WORKER_TARGET`` with its ``WORKER_BATCH_PARAM``,
    ``RESOLVER_TARGET``, ``SCHEDULER_INIT_TARGET``) and the DP vote's on its
    MLP-sync gather (``version.dp.PATCHES``); a scheduler being built calls
    the module's ``activate_in_scheduler``. The targets (for doctor and
    untested versions) are those three, the scheduler entry, the version's
    own ``checked`` ones and its plain graphs' (``version.graphs.TARGETS``).
    ``patches``: the version's own further wrappers (0.5.23: measuring each
    depth's runtime-state build, ``sglang_0_5_23.depths.PATCHES``), installed
    and listed like the others.
    """
    instrumentor = Instrumentor(
        [
            (version.WORKER_TARGET, make_worker_wrapper(version.WORKER_BATCH_PARAM)),
            (version.RESOLVER_TARGET, resolver_wrapper),
            (
                version.SCHEDULER_INIT_TARGET,
                scheduler_init_wrapper(lambda s: version.activate_in_scheduler(s)),
            ),
            # DP attention: the vote in SGLang's MLP-sync gather
            *version.dp.PATCHES,
            *patches,
        ]
    )
    targets = (
        *instrumentor.targets,
        SCHEDULER_ENTRY_TARGET,
        *checked,
        *version.graphs.TARGETS,
    )
    return instrumentor, targets
