"""What every SGLang adapter shares: patch targets, wrapt instrumentation,
the two gate wrappers and per-process activation.

Version knowledge (module paths, signatures, argument names, how a version
builds its results) lives in one module per SGLang version family; this module
only holds the mechanism.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import wrapt

from eagle_gate.config import GateConfig, config_from_environment
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime, default_status_dir
from eagle_gate.status import write_process_status

logger = logging.getLogger("eagle_gate")

__all__ = [
    "GatePatchError",
    "GateRefused",
    "PatchTarget",
    "Instrumentor",
    "ACTIVE",
]

#: attributes the worker wrapper sets on a result for the resolver wrapper.
RESULT_MODE_ATTR = "eagle_gate_mode"
RESULT_STEP_ATTR = "eagle_gate_step"


class GatePatchError(RuntimeError):
    """A patch target is missing or has an unexpected signature."""


class GateRefused(RuntimeError):
    """The server configuration is one the gate does not handle."""


@dataclass(frozen=True)
class PatchTarget:
    """A function or method the gate wraps, and the signature it expects."""

    module: str
    qualname: str
    #: the leading parameter names the adapter relies on, in order.
    params: tuple[str, ...]

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"

    def owner_and_name(self, module: Any | None = None) -> tuple[Any, str]:
        if module is None:
            try:
                module = importlib.import_module(self.module)
            except Exception as exc:
                raise GatePatchError(
                    f"patch target {self.dotted}: module {self.module!r} does not "
                    f"import: {exc!r}"
                ) from exc
        owner: Any = module
        *path, name = self.qualname.split(".")
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                raise GatePatchError(
                    f"patch target {self.dotted}: {part!r} not found in {self.module}"
                )
        if name not in vars(owner) and not hasattr(owner, name):
            raise GatePatchError(f"patch target {self.dotted} does not exist")
        return owner, name

    def check(self, module: Any | None = None) -> None:
        """Raise GatePatchError unless the target exists with our signature."""
        owner, name = self.owner_and_name(module)
        func = inspect.getattr_static(owner, name)
        func = getattr(func, "__wrapped__", func)
        try:
            params = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError) as exc:
            raise GatePatchError(f"patch target {self.dotted}: {exc}") from exc
        if params[: len(self.params)] != self.params:
            raise GatePatchError(
                f"patch target {self.dotted} has parameters {params}; "
                f"eagle_gate expects them to start with {self.params}"
            )


class _GateWrapper(wrapt.FunctionWrapper):
    """Marks wrappers installed by eagle_gate (idempotence, removal)."""


class Instrumentor:
    """Installs wrapt wrappers when their target modules are imported.

    Modelled on OpenTelemetry's instrumentors: ``instrument()`` registers
    post-import hooks (applied at once for modules already imported) and is
    idempotent; ``uninstrument()`` restores the original functions.
    """

    def __init__(self, patches: Sequence[tuple[PatchTarget, Callable]]) -> None:
        self.patches = tuple(patches)
        self._enabled = False
        self._hooks_registered = False
        self._applied: dict[str, tuple[Any, str, Any]] = {}

    @property
    def is_instrumented(self) -> bool:
        return self._enabled

    def applied(self) -> list[str]:
        return sorted(self._applied)

    def instrument(self) -> None:
        if self._enabled:
            return
        self._enabled = True
        if not self._hooks_registered:
            self._hooks_registered = True
            for target, wrapper in self.patches:
                wrapt.register_post_import_hook(
                    self._hook(target, wrapper), target.module
                )
        else:  # re-instrument after uninstrument: modules already imported
            for target, wrapper in self.patches:
                if target.module in sys.modules:
                    self._apply(target, wrapper, sys.modules[target.module])

    def _hook(self, target: PatchTarget, wrapper: Callable) -> Callable[[Any], None]:
        def on_import(module: Any) -> None:
            if self._enabled:
                self._apply(target, wrapper, module)

        return on_import

    def _apply(self, target: PatchTarget, wrapper: Callable, module: Any) -> None:
        target.check(module)
        owner, name = target.owner_and_name(module)
        current = vars(owner).get(name)
        if isinstance(current, _GateWrapper):
            self._applied.setdefault(target.dotted, (owner, name, current.__wrapped__))
            return
        if current is None:
            raise GatePatchError(
                f"patch target {target.dotted} is inherited, not defined on "
                f"{owner.__name__}; eagle_gate will not patch a base class by accident"
            )
        setattr(owner, name, _GateWrapper(current, wrapper))
        self._applied[target.dotted] = (owner, name, current)

    def uninstrument(self) -> None:
        self._enabled = False
        for owner, name, original in self._applied.values():
            if isinstance(vars(owner).get(name), _GateWrapper):
                setattr(owner, name, original)
        self._applied.clear()

    def require_applied(self, modules: Sequence[str] | None = None) -> None:
        """Import the target modules (all, or those named) and insist that
        every wrapper in them is in place; raise GatePatchError naming the
        first target that is not."""
        for target, wrapper in self.patches:
            if modules is not None and target.module not in modules:
                continue
            module = importlib.import_module(target.module)
            if target.dotted not in self._applied:
                # The hook did not run (instrument() not called): apply now.
                if not self._enabled:
                    raise GatePatchError(
                        f"eagle_gate is not instrumented; {target.dotted} unpatched"
                    )
                self._apply(target, wrapper, module)


class _Active:
    """The gate of this process (one per scheduler process)."""

    runtime: GateRuntime | None = None
    #: the plain-step function of the active adapter, if it has one.
    plain_step: Callable[..., Any] | None = None
    internal_errors = 0


ACTIVE = _Active()


def _batch_arg(args: tuple, kwargs: dict, name: str, instance: Any) -> Any:
    # See resolver_wrapper for why ``instance is None`` shifts the position.
    return kwargs[name] if name in kwargs else args[instance is None]


def make_worker_wrapper(batch_param: str) -> Callable:
    """The wrapper around ``EAGLEWorkerV2.forward_batch_generation``.

    Decode batches go through the policy; everything else passes untouched.
    Any failure of the gate's own logic runs the stock step (never a crash).
    """

    def forward_batch_generation(wrapped, instance, args, kwargs):
        runtime = ACTIVE.runtime
        if runtime is None:
            return wrapped(*args, **kwargs)
        try:
            batch = _batch_arg(args, kwargs, batch_param, instance)
            fm = batch.forward_mode
            if fm.is_extend() or batch.is_extend_in_batch or fm.is_idle():
                if not fm.is_idle():
                    runtime.note_non_decode_batch()
                return wrapped(*args, **kwargs)
            mode, step = runtime.decide(
                batch.seq_lens.shape[0], batch.seq_lens_sum, batch.seq_lens_cpu
            )
        except Exception as exc:
            _internal_error("deciding", exc)
            return wrapped(*args, **kwargs)
        if mode is Mode.PLAIN and ACTIVE.plain_step is not None:
            result = ACTIVE.plain_step(instance, *args, **kwargs)
        else:
            mode = Mode.SPEC
            result = wrapped(*args, **kwargs)
        setattr(result, RESULT_MODE_ATTR, mode)
        setattr(result, RESULT_STEP_ATTR, step)
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
        runtime.observe(
            mode, getattr(result, RESULT_STEP_ATTR), [len(t) for t in tokens]
        )
    except Exception as exc:
        _internal_error("observing", exc)
    return tokens


def _internal_error(what: str, exc: BaseException) -> None:
    ACTIVE.internal_errors += 1
    if ACTIVE.internal_errors == 1 or ACTIVE.internal_errors % 1000 == 0:
        logger.exception(
            "eagle_gate: internal error while %s (%d so far); this step runs "
            "SGLang's stock path",
            what,
            ACTIVE.internal_errors,
            exc_info=exc,
        )


def activate(
    *,
    adapter_name: str,
    sglang_version: str,
    gated: bool,
    state: str,
    tp_rank: int,
    tp_size: int,
    dp_rank: int | None,
    num_draft_tokens: int,
    speculative_algorithm: str | None,
    plain_step: Callable[..., Any] | None = None,
    config: GateConfig | None = None,
) -> GateRuntime:
    """Create this process's gate, log it once and write its status record."""
    config = config or config_from_environment()
    runtime = GateRuntime(
        config,
        config.create_policy(),
        sglang_version=sglang_version,
        adapter=adapter_name,
        tp_rank=tp_rank,
        tp_size=tp_size,
        num_draft_tokens=num_draft_tokens,
        plain_step_available=plain_step is not None,
    )
    ACTIVE.runtime = runtime if gated else None
    ACTIVE.plain_step = plain_step
    record = runtime.status()
    record.update(
        state=state,
        gated=gated,
        dp_rank=dp_rank,
        speculative_algorithm=speculative_algorithm,
    )
    status_dir = config.status_dir or str(default_status_dir(record["server_pid"]))
    path = write_process_status(status_dir, record)
    logger.info(
        "eagle_gate active in scheduler pid %d (TP %d/%d): SGLang %s, adapter %s, "
        "policy %r %s, state: %s, status: %s",
        record["pid"],
        tp_rank,
        tp_size,
        sglang_version,
        adapter_name,
        config.policy,
        config.settings,
        state,
        path,
    )
    return runtime


def check_speculation(
    server_args: Any, *, extra_refusals: Sequence[tuple[str, str]] = ()
) -> tuple[bool, str]:
    """Decide what the gate does with this server's speculative settings.

    Returns ``(gated, state)``. Raises GateRefused for speculative setups the
    gate does not handle, because passing them through silently would leave an
    operator believing the gate is at work. ``extra_refusals`` are
    ``(server_args attribute, reason)`` pairs refused when truthy.
    """
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if algorithm is None or str(algorithm).upper() == "NONE":
        return False, "idle: speculation is off, every step is SGLang's own"
    name = str(algorithm).upper()
    if name not in {"EAGLE", "EAGLE3"}:
        raise GateRefused(
            f"--speculative-algorithm {algorithm} is not handled by eagle_gate; "
            "supported: EAGLE, EAGLE3 (or no speculation). Launch without "
            "eagle_gate to use it."
        )
    for attribute, reason in extra_refusals:
        if getattr(server_args, attribute, None):
            raise GateRefused(reason)
    return True, f"gating {name}"


def flat_plain_tokens(next_token_ids: Any, stride: int) -> tuple[Any, Any]:
    """One token per request -> (flat ``bs*stride`` int32 tokens, int32 ones).

    The flat speculative layout every spec-v2 resolver reads: request i's token
    at ``i * stride``; the other slots are padding the resolver never reads
    because every accept length is 1.
    """
    import torch

    bs = int(next_token_ids.shape[0])
    device = next_token_ids.device
    flat = torch.zeros(bs * stride, dtype=torch.int32, device=device)
    flat[::stride] = next_token_ids.to(torch.int32)
    return flat, torch.ones(bs, dtype=torch.int32, device=device)
