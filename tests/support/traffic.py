"""Two real servers shared by the real-traffic tests (issue #21): a gated
EAGLE-3 server and a server without speculation, of the same tiny target.

``test_logprobs.py``, ``test_sampling_distribution.py`` and
``test_traffic_soak.py`` use the session fixture :func:`traffic_servers`;
starting the pair once (about 40-60 s on two cores) instead of once per file
is most of what keeps them within their CI budget. :func:`order_traffic_last`
(conftest's ``pytest_collection_modifyitems``) runs those files after every
other test, in file order, so the pair is started at the first of them and
stopped at the session's end right after the last: no idle servers sit beside
the other end-to-end tests.

The gated server: ``python -m eagle_gate.launch``, EAGLE-3 with SGLang's real
``EAGLEWorkerV2`` on CPU (``support.spec_server``), the overlap scheduler on
(0.5.9 always; 0.5.23 through the CI switch), draft sync ``eager``, runtime
changes applied at the next step, SGLang's CI asserts and its strict idle
memory check (a leaked KV slot stops the server), and one test switch of
``ci/cpu_spec``: ``EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE``, a file whose number
scales the temperature of PLAIN steps while it exists (the sampling
distribution test's deliberate fault; absent, nothing changes).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support import gated_server
from support.spec_server import TRITON_CPU_ARGS, TRITON_CPU_ENV

#: the test files that share the pair, in the order they run (last).
TRAFFIC_FILES = (
    "test_logprobs.py",
    "test_sampling_distribution.py",
    "test_traffic_soak.py",
)

#: what must never show in the gated server's log: the e2e servers' markers,
#: and SGLang's own scheduler failure (mixed traffic reaches its error paths).
LOG_FAILURES = (*gated_server.LOG_FAILURES, "Scheduler hit an exception")


def log_failures(text: str) -> list[str]:
    return gated_server.log_failures(text, LOG_FAILURES)


@dataclass
class Server:
    base_url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


#: the EAGLE-3 traffic server's SPEC depths on SGLang 0.5.23 (configured 3)
TRAFFIC_DEPTHS = (1, 2, 3)
#: the baseline's attention: the gated server's (the Triton backend, one KV
#: split, with the CPU stand-ins, its two attention kernels in torch:
#: ``support.spec_server``'s ``TRITON_CPU_*``), not the other baselines'
#: torch_native, so that sampled tokens are compared through the same
#: kernels. At the sampling test's temperature (0.04) two backends' rounding
#: on near-tied logits (interpreted Triton against torch_native, then) moved
#: a token's share enough to reach p 0.0016 and 0.00099 (alpha 0.001) in two
#: of seven runs.
TRAFFIC_BASELINE_ARGS = ("--attention-backend", "triton", *TRITON_CPU_ARGS)


@dataclass
class TrafficServers:
    gated: Server
    baseline: Server
    #: write a number here to scale PLAIN-step temperatures (delete to stop).
    temperature_file: Path
    notes: dict = field(default_factory=dict)


def order_traffic_last(items: list) -> None:
    """Stable reorder: the traffic files' tests after all others, in
    ``TRAFFIC_FILES`` order (for ``pytest_collection_modifyitems``)."""

    def rank(item) -> int:
        name = Path(str(item.fspath)).name
        return TRAFFIC_FILES.index(name) + 1 if name in TRAFFIC_FILES else 0

    items[:] = sorted(items, key=rank)  # sorted() is stable


@pytest.fixture(scope="session")
def traffic_servers(spec_models, test_plugins, tmp_path_factory) -> Iterator:
    """The gated server and the baseline, up together for the session."""
    from support.server import serve, serve_together
    from support.spec_server import sglang_version
    from support.timings import note

    target, draft = spec_models
    root = tmp_path_factory.mktemp("traffic")
    temperature_file = root / "plain-temperature-scale"
    gate_args = [
        "--gate-policy", "goodput",
        "--gate-draft-sync", "eager",
        "--gate-status-dir", str(root / "status"),
    ]  # fmt: skip
    if sglang_version() == "0.5.23":
        # depths switch under the soak's and the sampling test's traffic
        gate_args += ["--gate-depths", ",".join(map(str, TRAFFIC_DEPTHS))]
    genv = {
        "EAGLE_GATE_CONTROL_EVERY": "1",
        "EAGLE_GATE_OPS_INTERVAL_S": "0.2",
        "SGLANG_IS_IN_CI": "1",
        "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
        "EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE": str(temperature_file),
    }
    t0 = time.monotonic()
    managers = [
        serve(
            target,
            root / "gated.log",
            draft_dir=draft,
            launcher="gate",
            overlap=True,
            gate_args=gate_args,
            env=genv,
            pythonpath=[test_plugins],
        ),
        serve(
            target,
            root / "baseline.log",
            args=TRAFFIC_BASELINE_ARGS,
            env=TRITON_CPU_ENV,
        ),
    ]
    # both start at once (their imports and loads overlap)
    with serve_together(managers) as started:
        gsrv, bsrv = started
        note(
            f"SGLang {sglang_version()}: traffic servers (gated EAGLE-3 + no-spec) "
            f"up in {time.monotonic() - t0:.0f} s"
        )
        servers = TrafficServers(
            gated=Server(gsrv.base_url, gsrv.log_path),
            baseline=Server(bsrv.base_url, bsrv.log_path),
            temperature_file=temperature_file,
        )
        yield servers
        log = servers.gated.log()
    note(
        f"SGLang {sglang_version()}: traffic servers held {time.monotonic() - t0:.0f} s"
    )
    assert not log_failures(log), log[-4000:]


# -- requests -----------------------------------------------------------------------
def post(
    base_url: str, path: str, body: dict | bytes, *, timeout_s: float = 600.0
) -> tuple[int, dict | str]:
    """POST ``body`` (a dict as JSON, or raw bytes); ``(status, reply)``."""
    return gated_server._request(f"{base_url}{path}", body, timeout_s=timeout_s)


def generate_all(
    base_url: str, bodies: Sequence[dict], *, workers: int = 64
) -> list[tuple[int, dict | str]]:
    """``/generate`` for every body at once (``workers`` in flight), in order."""
    with ThreadPoolExecutor(max(1, min(workers, len(bodies)))) as pool:
        return list(pool.map(lambda b: post(base_url, "/generate", b), bodies))


def health(base_url: str) -> int:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0
