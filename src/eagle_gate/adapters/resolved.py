"""The speculative setup exactly as SGLang will run it.

Why: SGLang rewrites its speculative arguments after parsing. ``NEXTN`` runs
as ``EAGLE``; with no shape flags it chooses the draft shape itself (a Llama
target gets 5 steps, topk 4, 8 draft tokens: a draft tree); some models turn
multi-layer EAGLE on; 0.5.23 may switch ``--speculative-adaptive`` off, and
turns overlap scheduling off for speculation on CPU. A gate that judged the
raw arguments refused setups SGLang runs as plain EAGLE and let through draft
trees it cannot keep exact. So every reader (the launcher's refusals, the
scheduler's activation, ``eagle-gate doctor``, the status) reads one
:class:`ResolvedSpec`, which each version package computes by running that
version's own resolution (``resolve_spec`` in ``sglang_0_5_9/resolve.py`` and
``sglang_0_5_23/resolve.py``).

This module imports neither SGLang nor torch.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "ResolvedSpec",
    "sglang_decisions",
    "requested_flags",
    "export_requested",
    "requested_from_environment",
    "sglang_flag",
    "server_args_check",
]

#: the launcher's raw speculative flags, for SGLang's scheduler processes:
#: 0.5.9 resolves its record in place, so a scheduler's status could not say
#: what SGLang decided itself (NEXTN runs as EAGLE) without them.
REQUESTED_ENV = "EAGLE_GATE_REQUESTED_SPEC"


@dataclass(frozen=True)
class ResolvedSpec:
    """SGLang's resolved speculative setup, as the gate judges and reports it."""

    #: the algorithm SGLang runs ("EAGLE" for NEXTN); None: no speculation.
    algorithm: str | None
    #: draft steps, draft tree width and tokens verified per request.
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    #: multi-layer EAGLE (SGLang builds MultiLayerEagleWorkerV2).
    multi_layer: bool = False
    #: SGLang's own adaptive speculation (0.5.23), after SGLang's own switch-off.
    adaptive: bool = False
    #: attention data-parallel width (1: none), DP replicas, pipeline stages.
    attn_dp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    #: overlap scheduling on (SGLang 0.5.23 turns it off on CPU by itself).
    overlap: bool = True
    #: rejection sampling in verify (0.5.23's default for EAGLE on ROCm).
    rejection_sampling: bool = False
    #: PD disaggregation role: "null", "prefill" or "decode".
    disaggregation_mode: str = "null"
    #: what SGLang decided itself, in words ("NEXTN runs as EAGLE", ...): why
    #: the view differs from the command line.
    decided_by_sglang: tuple[str, ...] = ()
    #: the model class SGLang builds as the draft (its own rule for a draft
    #: config: ``MiMoForCausalLM`` -> ``MiMoMTP``, ...); None: not known.
    draft_model: str | None = None
    #: the draft is an MTP layer of the target checkpoint (NEXTN), not a
    #: separate EAGLE head.
    mtp: bool = False

    @property
    def speculating(self) -> bool:
        return self.algorithm is not None and self.algorithm.upper() != "NONE"

    @property
    def shape_auto(self) -> bool:
        """Whether SGLang chose the draft shape (no shape flags were given)."""
        return any(d.startswith("draft shape chosen") for d in self.decided_by_sglang)

    def shape(self) -> str:
        """The draft shape in words, e.g. ``3 steps, topk 1, 4 draft tokens``."""
        return (
            f"{self.num_steps} steps, topk {self.topk}, "
            f"{self.num_draft_tokens} draft tokens"
        )

    def describe(self) -> str:
        """One line for the log, doctor and the status."""
        if not self.speculating:
            return "no speculation"
        parts = [f"{self.algorithm}, {self.shape()}"]
        if self.multi_layer:
            parts.append("multi-layer")
        if self.adaptive:
            parts.append("adaptive")
        parts.append("overlap on" if self.overlap else "overlap off")
        if self.dp_size > 1:
            parts.append(f"{self.dp_size} DP replicas")
        if self.attn_dp_size > 1:
            parts.append(f"attention DP {self.attn_dp_size}")
        if self.pp_size > 1:
            parts.append(f"PP {self.pp_size}")
        if self.rejection_sampling:
            parts.append("rejection sampling")
        if self.disaggregation_mode not in ("null", "", None):
            parts.append(f"PD {self.disaggregation_mode}")
        if self.draft_model:
            parts.append(f"{'MTP ' if self.mtp else ''}draft {self.draft_model}")
        text = ", ".join(parts)
        if self.decided_by_sglang:
            text += " (SGLang: " + "; ".join(self.decided_by_sglang) + ")"
        return text

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready fields (status record, doctor --json)."""
        data = asdict(self)
        data["decided_by_sglang"] = list(self.decided_by_sglang)
        return data


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def sglang_decisions(requested: Any, spec: ResolvedSpec) -> tuple[str, ...]:
    """What SGLang changed between the command line (``requested``: an object
    with the raw ``speculative_*`` / ``enable_multi_layer_eagle`` /
    ``speculative_adaptive`` attributes; None: unknown) and ``spec``."""
    if requested is None or not spec.speculating:
        return ()
    out = []
    asked = getattr(requested, "speculative_algorithm", None)
    if asked and str(asked).upper() != spec.algorithm:
        out.append(f"--speculative-algorithm {asked} runs as {spec.algorithm}")
    shape = (
        getattr(requested, "speculative_num_steps", None),
        getattr(requested, "speculative_eagle_topk", None),
        getattr(requested, "speculative_num_draft_tokens", None),
    )
    if shape == (None, None, None) and spec.num_steps is not None:
        out.append(f"draft shape chosen by SGLang: {spec.shape()}")
    elif (
        _int(shape[2]) is not None
        and spec.num_draft_tokens is not None
        and _int(shape[2]) != spec.num_draft_tokens
    ):
        out.append(f"draft tokens adjusted to {spec.num_draft_tokens}")
    if getattr(requested, "speculative_adaptive", False) and not spec.adaptive:
        out.append("--speculative-adaptive switched off")
    if spec.multi_layer and not getattr(requested, "enable_multi_layer_eagle", False):
        out.append("multi-layer EAGLE enabled for this model")
    return tuple(out)


def requested_flags(argv: Sequence[str]) -> argparse.Namespace:
    """The raw speculative flags of an SGLang command line. Never judged: only
    compared with the resolved view to say what SGLang decided itself (0.5.9
    resolves its record in place, so the record cannot say)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--speculative-algorithm")
    for flag in (
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
    ):
        parser.add_argument(flag, type=int)
    for flag in ("--enable-multi-layer-eagle", "--speculative-adaptive"):
        parser.add_argument(flag, action="store_true")
    flags, _ = parser.parse_known_args(list(argv))
    return flags


def export_requested(argv: Sequence[str], environ: MutableMapping[str, str]) -> None:
    """Hand ``argv``'s raw speculative flags to every process SGLang starts."""
    environ[REQUESTED_ENV] = json.dumps(vars(requested_flags(argv)), sort_keys=True)


def requested_from_environment(
    environ: Mapping[str, str] | None = None,
) -> argparse.Namespace | None:
    """The flags :func:`export_requested` handed over; None where there are
    none or they cannot be read (a report only: the status then says less)."""
    import os

    raw = (os.environ if environ is None else environ).get(REQUESTED_ENV)
    if not raw:
        return None
    try:
        values = json.loads(raw)
    except ValueError:
        return None
    return argparse.Namespace(**values) if isinstance(values, dict) else None


def sglang_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """SGLang's boolean environment switch ``name`` as SGLang itself reads it:
    parsed by its own ``envs.<name>`` field (both versions accept "true",
    "1", "yes", "y"), its default when unset or malformed. ``environ``: the
    environment a launch hands SGLang (the process's own when None)."""
    import os

    from sglang.srt.environ import envs

    field = getattr(envs, name)
    raw = (os.environ if environ is None else environ).get(name)
    default = field.default() if callable(field.default) else field.default
    if raw is None:
        return bool(default)
    try:
        return bool(field.parse(raw))
    except ValueError:
        return bool(default)


def server_args_check(
    check_spec: Callable[..., tuple[bool, str]], resolve_spec: Callable[[Any], Any]
) -> Callable[..., tuple[bool, str]]:
    """A version's ``check_server_args``: its ``check_spec`` of a record's
    resolved view (``resolve_spec``), with the same gate settings."""

    def check_server_args(
        server_args: Any,
        environ: dict | None = None,
        *,
        draft_sync: str | None = None,
        depths: str = "off",
    ) -> tuple[bool, str]:
        spec = resolve_spec(server_args)
        return check_spec(spec, environ, draft_sync=draft_sync, depths=depths)

    return check_server_args
