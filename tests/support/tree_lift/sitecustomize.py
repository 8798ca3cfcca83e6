"""Lift the gate's refusal of draft trees (topk > 1), for measuring what the
plain step does to a tree's draft state (issue #22, scripts/measure_tree_draft.py).
Never part of the package.

How it gets in: the measurement puts this directory on its gated server's
``PYTHONPATH``, so every Python process of that server imports this
``sitecustomize`` at start. It lets ``check_speculation`` and the built-worker
check judge a tree as if it were a chain (every other refusal still applies),
and leaves everything else as shipped.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace


def _install() -> None:
    import wrapt

    from eagle_gate.adapters import refusals

    real_check = refusals.check_speculation
    tree_prefix = "SGLang would run a draft tree"

    def check_speculation(spec, **kwargs):
        if spec.topk is not None and spec.topk > 1:
            gated, state = real_check(replace(spec, topk=1), **kwargs)
            return gated, f"{state} [tree topk {spec.topk}: refusal lifted]"
        return real_check(spec, **kwargs)

    refusals.check_speculation = check_speculation

    def lift_version(module):  # imported check_speculation by name
        module.check_speculation = check_speculation

    def lift_worker_check(module):
        real_worker_check = module.check_built_worker

        def check_built_worker(worker, spec, worker_hint):
            try:
                real_worker_check(worker, spec, worker_hint)
            except refusals.GateRefused as exc:
                if not str(exc).startswith(tree_prefix):
                    raise

        module.check_built_worker = check_built_worker

    for name in (
        "eagle_gate.adapters.sglang_0_5_9",
        "eagle_gate.adapters.sglang_0_5_23",
    ):
        wrapt.register_post_import_hook(lift_version, name)
    wrapt.register_post_import_hook(lift_worker_check, "eagle_gate.adapters.activation")
    print(f"[eagle_gate tree lift] pid {os.getpid()}", file=sys.stderr)


_install()
