"""CI only: let SGLang's real EAGLE-3 speculative path serve on a CPU-only host.

Loaded in every Python process of a CI environment by ``eagle_gate_ci_spec.pth``
(which .ci/make-sglang-env.sh writes into the environment's site-packages: a
path line naming this checkout's ``ci/cpu_spec``, then ``import
eagle_gate_ci_spec``, so edits here take effect without rebuilding) and inert
unless ``EAGLE_GATE_CI_SPEC=1``. It is never part of the installed
``eagle_gate`` package. When on, it reads the installed SGLang version (package
metadata; SGLang is not imported here) and installs, lazily through post-import
hooks so every spawned SGLang process gets them too:

* stand-ins for GPU kernels and GPU-only calls that SGLang's CPU code path
  reaches: torch versions of the ``sgl_kernel`` CPU ops (the CPU build of
  sgl_kernel is not on PyPI), and CPU paths where a kernel dispatcher has no
  CPU branch (0.5.9: the sampled verify's top-k / top-p renormalisation and
  chain speculative sampling, so sampled requests serve; the grammar mask);
* torch versions of SGLang's two Triton attention kernels, decode and extend
  (``attention``): interpreted, they were most of a server's step; any call
  with a feature they do not cover goes to the real kernel, and
  ``EAGLE_GATE_CI_ATTENTION=triton`` keeps the real kernels throughout;
* one logic fix for 0.5.23 (the verify tree-mask layout, see
  ``v0_5_23._cpu_tree_mask_mode``), because SGLang's CPU default is the layout of
  another attention backend than the one this CI serves with.

Stand-ins replace kernels only, never SGLang logic a GPU would run too; each
says what it replaces and why it is exact. Test-only switches, off by default:

* ``EAGLE_GATE_CI_FORCE_OVERLAP=1`` (0.5.23): keep the overlap scheduler on
  for speculation on CPU (SGLang turns it off there by itself).
* ``EAGLE_GATE_CI_CPU_SEQLENS=1`` or ``0`` (0.5.23): whether the overlap
  scheduler's FutureMap publishes host sequence lengths. SGLang decides it from
  the attention backends' ``needs_cpu_seq_lens``: Triton (the CPU speculative
  backend), FA3 and trtllm_mha declare False, FlashInfer and most others True.
  ``1`` makes the scheduler run as with FlashInfer, ``0`` as with FA3; unset,
  SGLang's own decision stands.
* ``EAGLE_GATE_CI_PLAIN_GRAPHS=construct`` (both versions): after the gate
  decided its plain-step CUDA graphs (off on CPU: ``device_not_cuda``), build
  the real plain attention backend and the real plain DECODE runner of the
  gate's adapter (the plain-graphs design record, T2) with the runner's ``capture()`` a
  no-op, check them, record the checks in ``plain_graphs.report`` of the
  gate's status and drop them again. The plain step stays eager.
* ``EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE=PATH`` (both versions): a deliberate
  fault for the sampling distribution test. While PATH exists, each plain
  step of the gate samples with its batch's temperatures multiplied by the
  number in PATH (restored after the step); SPEC steps and servers without
  the gate are untouched. Absent, the plain step runs as it is.

``EAGLE_GATE_CI_DP=1`` (both versions, independent of ``EAGLE_GATE_CI_SPEC``)
installs the stand-ins that let SGLang's DP attention (``--enable-dp-attention
--dp-size 2 --tp 2``) serve on CPU: the padded-row sequence length the CPU's
backends do not declare, and, on 0.5.9, a torch row copy for the Triton
``memcpy_triton`` of the DP gather/scatter, unpinned host tensors, and direct
calls of two collectives whose custom-op wrappers have no CPU kernel. The
target must be a model SGLang builds for DP attention (Qwen3 here, not Llama;
see ``tests/support/qwen3_target.py``).

The switches that reach into the gate do so through its test hooks
(``eagle_gate.adapters.plain.testing``), never by rebinding its functions.

Every stand-in counts its calls per process (``calls()``); with
``EAGLE_GATE_CI_SPEC_LOG=1`` the first call of each, and every patch applied,
is logged to stderr as ``[eagle_gate_ci_spec] pid N ...`` so a test can show
from a server log that the real speculative path ran.

Environment the speculative path needs besides this module: ``TRITON_INTERPRET=1``
(SGLang's own ``@triton.jit`` kernels then run interpreted on CPU tensors),
``SGLANG_USE_CPU_ENGINE=1``, and the Triton attention backend.

Modules, one concern each: ``core`` (switches, counters, log), ``kernels``
(exact torch versions of integer kernels), ``v0_5_23``, ``v0_5_9`` and
``v0_5_9_sampling`` (each version's stand-ins and post-import hooks),
``gate_probes`` (the two switches that reach into the gate) and ``dp``
(``EAGLE_GATE_CI_DP``). Only ``core`` is imported at start; the stand-ins'
modules when installed, or when a name of theirs is read from this package
(``eagle_gate_ci_spec.build_tree_topk1`` and so on, as tests do).
"""

from __future__ import annotations

import importlib
import os
import sys

from eagle_gate_ci_spec.core import (
    ATTENTION,
    ATTENTION_CHOICES,
    CPU_SEQLENS,
    DP,
    ENABLED,
    FORCE_OVERLAP,
    LOG,
    PLAIN_GRAPHS,
    PLAIN_TEMPERATURE_FILE,
    PREFIX,
    STUB_MARK,
    _log,
    calls,
    installed,
    sglang_version,
)

__all__ = [
    "ATTENTION",
    "CPU_SEQLENS",
    "DP",
    "ENABLED",
    "FORCE_OVERLAP",
    "LOG",
    "PLAIN_GRAPHS",
    "PLAIN_TEMPERATURE_FILE",
    "PREFIX",
    "STUB_MARK",
    "calls",
    "install",
    "install_dp",
    "installed",
    "sglang_version",
]

#: the module of each SGLang version's stand-ins (its ``hooks()``).
VERSION_MODULES = {"0.5.9": "v0_5_9", "0.5.23": "v0_5_23"}
#: the stand-in modules whose public names this package offers (lazily).
_STAND_IN_MODULES = (
    "kernels",
    "attention",
    "v0_5_9_sampling",
    "v0_5_23",
    "v0_5_9",
    "dp",
    "gate_probes",
)


def _module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def __getattr__(name: str):
    """A stand-in by its old flat name (``eagle_gate_ci_spec.top_k_renorm_prob``),
    importing its module on first use."""
    if not name.startswith("__"):
        for module in _STAND_IN_MODULES:
            mod = _module(module)
            if hasattr(mod, name):
                return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register(hooks: dict) -> None:
    import wrapt

    for module_name, hook in hooks.items():
        wrapt.register_post_import_hook(hook, module_name)


def install() -> bool:
    """Register the post-import hooks for the installed SGLang; True if any."""
    version = sglang_version()
    module = VERSION_MODULES.get(version or "")
    if module is None:
        print(
            f"{PREFIX} EAGLE_GATE_CI_SPEC=1 but SGLang {version} has no CPU "
            f"speculative shims (known: {', '.join(VERSION_MODULES)})",
            file=sys.stderr,
        )
        return False
    if os.environ.get("TRITON_INTERPRET") != "1":
        _log("TRITON_INTERPRET is not 1: SGLang's Triton kernels need it on CPU")
    if ATTENTION not in ATTENTION_CHOICES:
        raise ValueError(
            f"EAGLE_GATE_CI_ATTENTION={ATTENTION!r}: allowed "
            f"{', '.join(ATTENTION_CHOICES)}"
        )
    hooks = _module(module).hooks()
    hooks.update(_module("gate_probes").hooks())
    hooks.update(_module("attention").hooks(version))
    _register(hooks)
    _log(f"installed for SGLang {version}")
    return True


def install_dp() -> bool:
    """Register the DP-attention hooks for the installed SGLang; True if any."""
    version = sglang_version()
    by_version = _module("dp").HOOKS_BY_VERSION
    make_hooks = by_version.get(version or "")
    if make_hooks is None:
        print(
            f"{PREFIX} EAGLE_GATE_CI_DP=1 but SGLang {version} has no CPU "
            f"DP-attention shims (known: {', '.join(by_version)})",
            file=sys.stderr,
        )
        return False
    _register(make_hooks())
    _log(f"installed DP-attention stand-ins for SGLang {version}")
    return True


if ENABLED:
    install()
if DP:
    install_dp()
