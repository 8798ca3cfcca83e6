"""Two real processes as two TP ranks over a gloo CPU group
(:func:`run_ranks`), and the runtime-control agreement run that way, exactly
as schedulers do it (``eagle_gate.control.torch_broadcast``).

In :func:`run_two_ranks` each rank runs a GateRuntime for 24 decode steps
with control checked every 4; rank 0 writes a valid request (policy
``never``) before step ``write_step``. Both ranks report the step at which
their configuration changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import datetime, json, sys
import torch.distributed as dist
from eagle_gate.config import GateConfig
from eagle_gate.control import ControlAgreement, ControlFile, torch_broadcast
from eagle_gate.control import validate_change, write_request
from eagle_gate.ops import OpsSettings
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime

rank, init, d, write_step = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
group = dist.new_group([0, 1], backend="gloo")

class P:
    name = "p"
    def decide(self, view): return Mode.SPEC
    def observe(self, outcome): pass

rt = GateRuntime(GateConfig("threshold"), P(), sglang_version="t", adapter="t",
                 tp_rank=rank, tp_size=2, settings=OpsSettings(tick_every=4),
                 on_tick=ControlAgreement(ControlFile(d), is_source=rank == 0,
                                          broadcast=torch_broadcast(group)))
switched = None
for step in range(24):
    if rank == 0 and step == write_step:
        write_request(d, validate_change({"policy": "never"}, GateConfig("threshold")))
    rt.decide(1, 1)
    if rt.config_version and switched is None:
        switched = step
print(json.dumps({"rank": rank, "switched": switched, "policy": rt.config.policy}))
# both ranks reach the teardown together: gloo aborts a process ("terminate
# called without an active exception") whose peer tears down mid-exchange
dist.barrier()
dist.destroy_process_group()
"""


def run_ranks(
    workdir: Path, script_text: str, *args: str, timeout_s: float = 240
) -> list[dict]:
    """Run ``script_text`` as two processes, ``argv``: rank, a gloo
    ``init_method`` under ``workdir``, then ``args``; return the JSON each
    printed last (rank 0 first). Fails the test, naming the hang, if a rank
    does not finish in time."""
    script = workdir / f"ranks-{abs(hash(script_text))}.py"
    script.write_text(script_text)
    init = f"file://{workdir / 'store'}"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), init, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung in a collective")
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def run_two_ranks(
    status_dir: Path, write_step: int, *, timeout_s: float = 240
) -> list[dict]:
    """The control agreement (:data:`SCRIPT`) on ``status_dir``; the ranks'
    reports, rank 0 first."""
    return run_ranks(
        status_dir, SCRIPT, str(status_dir), str(write_step), timeout_s=timeout_s
    )
