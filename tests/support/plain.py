"""The plain-step harness of the installed SGLang version.

Each test environment holds one SGLang; ``installed_harness`` builds that
version's harness (``support.plain_harness`` for 0.5.9,
``support.plain_harness_0_5_23`` for 0.5.23). Both give the same names for
what a plain-step test does: ``prefill``, ``prepare_for_decode``,
``worker_batch`` (what the scheduler hands the worker), ``isolation``,
``plain_step``, ``run``, ``spec_step``, ``commit``, ``draft.extend_calls``,
``adapter`` and ``version``.
"""

from __future__ import annotations

from pathlib import Path

import sglang_env


def installed_harness(model_dir: Path):
    version = sglang_env.version()
    if version == "0.5.9":
        from support.plain_harness import Harness
    elif version == "0.5.23":
        from support.plain_harness_0_5_23 import Harness
    else:
        raise RuntimeError(f"no plain-step harness for SGLang {version}")
    return Harness(model_dir)
