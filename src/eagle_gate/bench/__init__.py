"""Benchmarks against real servers: ``python -m eagle_gate.bench``.

Two jobs, both for a user with GPU servers running:

* ``run`` (the default): drive SGLang's own ``sglang.bench_serving`` against
  several servers (for example no speculation, always speculation and the
  gate) over a closed-loop concurrency grid, print the reference-style table
  with ratios to the first server, write ``results.json`` and, when matplotlib
  is installed, ``throughput.png``. See :mod:`eagle_gate.bench.runner`.
* ``capture``: turn such measurements (a PLAIN server and a SPEC server of the
  same model on the same hardware) into a cost-profile file that the simulator
  reads with ``python -m eagle_gate.sim --profile-file``. See
  :mod:`eagle_gate.bench.capture` for the method and its limits.

Nothing here imports sglang or torch: the benchmark runs as a subprocess
(``python -m sglang.bench_serving``) and the servers are asked over HTTP.
"""

from eagle_gate.bench.capture import derive_profile, write_profile
from eagle_gate.bench.runner import (
    BenchOptions,
    RunResult,
    ServerSpec,
    format_table,
    load_results,
    parse_server,
    run_grid,
)

__all__ = [
    "BenchOptions",
    "RunResult",
    "ServerSpec",
    "derive_profile",
    "format_table",
    "load_results",
    "parse_server",
    "run_grid",
    "write_profile",
]
