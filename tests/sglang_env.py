"""Helpers for tests that run against the installed, real SGLang.

The suite runs once per supported SGLang version, each in its own virtual
environment (.ci/run builds them); these helpers pick the adapter of the
version installed in the running environment.
"""

from __future__ import annotations

import os

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from eagle_gate.adapters import installed_sglang_version, select_adapter  # noqa: E402


def adapter():
    return select_adapter()


def version() -> str:
    return installed_sglang_version()


def make_reqs(n: int, committed: int = 5):
    """Real SGLang ``Req`` objects, with ``committed`` KV tokens each."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for i in range(n):
        req = Req(
            f"r{i}",
            "",
            list(range(1, committed + 1)),
            SamplingParams(max_new_tokens=64),
        )
        set_committed(req, committed)
        reqs.append(req)
    return reqs


def committed(req) -> int:
    kv = getattr(req, "kv", None)
    return kv.kv_committed_len if kv is not None else req.kv_committed_len


def set_committed(req, value: int) -> None:
    kv = getattr(req, "kv", None)
    if kv is not None:
        kv.kv_committed_len = value
    else:
        req.kv_committed_len = value


def kv_snapshot(harness):
    """A copy of every layer's K and V buffer of the harness's target."""
    pool = harness.target.model_runner.token_to_kv_pool
    return [k.clone() for k in pool.k_buffer], [v.clone() for v in pool.v_buffer]


def changed_slots(before, after) -> set[int]:
    """KV slots whose K or V differs in any layer between two snapshots."""
    import torch

    slots = set()
    for b, a in zip(before[0] + before[1], after[0] + after[1], strict=True):
        diff = (b != a).reshape(b.shape[0], -1).any(dim=1)
        slots |= set(torch.nonzero(diff).flatten().tolist())
    return slots
