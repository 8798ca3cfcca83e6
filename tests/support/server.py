"""Helpers for end-to-end tests that run a real SGLang server on CPU.

``serve`` is the one way tests start a server: stock SGLang, gated
(``python -m eagle_gate.launch``) or speculative (EAGLE-3 with a draft, see
``support.spec_server``), on a free port; it waits for health, yields the
running server (URL, port, PID, log) and tears the whole process tree down.
The pieces it is made of stay public for tests that need only a command line:
``running_server`` starts a command in its own session, waits (bounded) for
``GET /health`` to return 200, and on exit kills the whole process tree by PID
(SGLang spawns a scheduler and a detokenizer process), checking that nothing is
left behind. ``cpu_server_args`` / ``cpu_server_env`` hold the flags that make
stock ``python -m sglang.launch_server`` serve a tiny model on a CPU-only host.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from support.ports import reserve_port

#: how long a test server may take to answer ``GET /health`` before its start
#: counts as failed: one bound for every server the suite starts
#: (``EAGLE_GATE_TEST_READY_TIMEOUT_S`` overrides it), where bounds of 240-500 s
#: had been set call by call. It has to catch a server that hangs, with the
#: server's log tail, before pytest-timeout's 600 s per test (pyproject.toml)
#: ends the test with a bare timeout; and never a start that is merely slow
#: (starts took 40-220 s with four sessions on two cores).
READY_TIMEOUT_S = float(os.environ.get("EAGLE_GATE_TEST_READY_TIMEOUT_S", "480"))


# Plugin names listed in SGLANG_PLUGINS are the only entry-point plugins SGLang
# (0.5.23+) loads; a name no plugin has disables them all.
NO_PLUGINS = "__none__"


def free_port() -> int:
    """A TCP port on 127.0.0.1 for a server: free now, and not handed to any
    concurrent test session recently (``support.ports``)."""
    return reserve_port()


def cpu_server_args(
    model_dir: Path | str,
    port: int,
    *,
    python: str | None = None,
    host: str = "127.0.0.1",
) -> list[str]:
    """Command line for stock ``sglang.launch_server`` serving a tiny model on CPU.

    ``python`` defaults to the interpreter running the tests; ``host`` is the
    address the server listens on (tests reach it on 127.0.0.1 either way).
    """
    return [
        python or sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_dir),
        "--host",
        host,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        # Without this the KV cache is sized from total RAM (15 GB seen).
        "--mem-fraction-static",
        "0.05",
        # ... and 0.05 of RAM is still ~2M tokens (1 GB, 3 s to allocate).
        "--max-total-tokens",
        "65536",
        "--attention-backend",
        "torch_native",
        "--sampling-backend",
        "pytorch",
        "--skip-server-warmup",
        "--random-seed",
        "0",
        "--log-level",
        "info",
        # An idle scheduler polls its sockets in a busy loop (a whole core);
        # tests run up to three servers at once on two cores. SGLang's own
        # switch makes it wait on the sockets instead (it wakes at once on a
        # request) after its idle checks, the memory check included.
        "--sleep-on-idle",
    ]


def cpu_server_env(
    *, plugins: str | None = None, torch_compile: bool = False, **extra: str
) -> dict[str, str]:
    """Environment for a CPU SGLang server: a copy of ``os.environ`` plus fixes.

    ``plugins`` sets ``SGLANG_PLUGINS`` (comma-separated names; ``NO_PLUGINS``
    turns entry-point plugins off); ``None`` leaves it as inherited.
    ``torch_compile=False`` sets ``TORCHDYNAMO_DISABLE=1``: SGLang wraps a few
    small index helpers in ``torch.compile``, and on CPU inductor builds them
    with a C++ compiler on the first request (about 20 s on 2 cores, the
    first ``/health`` times out meanwhile); eager mode gives the same results.
    """
    env = dict(os.environ)
    env.update(
        {
            # Else rotary-embedding init looks for vllm / GPU kernels.
            "SGLANG_USE_CPU_ENGINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    if not torch_compile:
        env["TORCHDYNAMO_DISABLE"] = "1"
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    env.update(extra)
    return env


@dataclass
class RunningServer:
    pid: int
    base_url: str
    log_path: Path
    startup_s: float = 0.0
    port: int = 0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n_chars: int = 4000) -> str:
        return _tail(self.log_path, n_chars)


def _tail(path: Path, n_chars: int = 4000) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return data[-n_chars:].decode("utf-8", "replace")


def _health_ok(base_url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants, children first."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    try:
        children = root.children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    return list(reversed(children)) + [root]


def kill_tree(pid: int, grace_s: float = 10.0) -> list[str]:
    """SIGTERM the tree of ``pid`` (children first), SIGKILL what outlives
    ``grace_s``; return descriptions of processes still alive afterwards."""
    procs = _tree(pid)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    _, alive = psutil.wait_procs(alive, timeout=5.0)
    return [f"{p.pid} {_describe(p)}" for p in alive]


def _describe(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:200]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"


@contextlib.contextmanager
def running_server(
    cmd: Sequence[str],
    port: int,
    env: dict[str, str],
    log_path: Path,
    ready_timeout_s: float = READY_TIMEOUT_S,
    *,
    grace_s: float = 10.0,
) -> Iterator[RunningServer]:
    """Run ``cmd`` (a server listening on 127.0.0.1:``port``) for a ``with`` block.

    Output goes to ``log_path``. Raises ``RuntimeError`` with the log tail if the
    process exits before it is healthy or ``ready_timeout_s`` passes. On exit the
    whole process tree is killed and checked gone.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    base_url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(cmd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # Remember descendants as they appear, so orphans (re-parented to init when
    # the launcher dies first) are still found and killed.
    seen: dict[int, psutil.Process] = {}

    def remember() -> None:
        for p in _tree(proc.pid):
            seen.setdefault(p.pid, p)

    server = RunningServer(
        pid=proc.pid, base_url=base_url, log_path=log_path, port=port
    )
    try:
        deadline = t0 + ready_timeout_s
        while True:
            remember()
            if proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with code {proc.returncode} before it was "
                    f"healthy; log {log_path} ends:\n{_tail(log_path)}"
                )
            if _health_ok(base_url):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"server not healthy after {ready_timeout_s:.0f}s; "
                    f"log {log_path} ends:\n{_tail(log_path)}"
                )
            time.sleep(0.5)
        server.startup_s = time.monotonic() - t0
        remember()
        yield server
    finally:
        remember()
        left = kill_tree(proc.pid, grace_s=grace_s)
        # Orphans that left the tree: kill them by PID too (only ones we saw,
        # and only if they are still the same process).
        stray = []
        for p in seen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    stray.append(p)
        for p in stray:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        _, still = psutil.wait_procs(stray, timeout=5.0)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5.0)
        left += [f"{p.pid} {_describe(p)}" for p in still]
        if left:
            raise RuntimeError(f"processes left after stopping the server: {left}")


#: ``serve(plugins=AUTO)``: SGLang's entry-point plugins off under the stock
#: launcher (a baseline is plain SGLang), inherited under the gate launcher.
AUTO = "auto"


@contextlib.contextmanager
def serve(
    model_dir: Path | str,
    log_path: Path | str,
    *,
    draft_dir: Path | str | None = None,
    launcher: str = "sglang",
    gate_args: Sequence[str] = (),
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    plugins: str | None = AUTO,
    pythonpath: Sequence[Path | str] = (),
    overlap: bool = True,
    shape: bool = True,
    algorithm: str = "EAGLE3",
    host: str = "127.0.0.1",
    ready_timeout_s: float = READY_TIMEOUT_S,
    grace_s: float = 10.0,
) -> Iterator[RunningServer]:
    """Start a real SGLang server on CPU for a ``with`` block, on a free port.

    * without ``draft_dir``: a server without speculation (``torch_native``
      attention; ``support.spec_server.baseline_server_args``);
    * with ``draft_dir``: an EAGLE-3 server on SGLang's real speculative path
      (``support.spec_server.spec_server_args`` / ``spec_server_env``:
      ``overlap`` picks the scheduler, ``shape=False`` leaves the draft shape
      to SGLang, ``algorithm="NEXTN"`` serves an MTP model whose
      ``draft_dir`` is its own directory).

    ``launcher`` is ``"sglang"`` (stock ``sglang.launch_server``) or ``"gate"``
    (``python -m eagle_gate.launch`` with ``gate_args``). ``args`` are more
    SGLang flags, ``env`` more environment variables, ``pythonpath`` folders
    put first on the server's ``PYTHONPATH``. ``plugins`` sets
    ``SGLANG_PLUGINS``: ``AUTO`` (off under the stock launcher, inherited
    under the gate's), ``None`` (inherited: a stock 0.5.23 server then loads
    the gate through its entry point), or names. Yields the
    :class:`RunningServer` once ``GET /health`` answers 200 (``running_server``
    raises with the log's tail if it never does); on exit the process tree is
    killed and checked gone.
    """
    from support.spec_server import (
        baseline_server_args,
        baseline_server_env,
        spec_server_args,
        spec_server_env,
        without_shape,
    )

    port = free_port()
    if draft_dir is None:
        cmd = baseline_server_args(
            model_dir, port, launcher=launcher, gate_args=gate_args, host=host
        )
        environment = baseline_server_env(
            launcher=launcher, plugins=plugins, **(env or {})
        )
    else:
        cmd = spec_server_args(
            model_dir, draft_dir, port, launcher=launcher, overlap=overlap,
            gate_args=gate_args, host=host, algorithm=algorithm,
        )  # fmt: skip
        if not shape:
            cmd = without_shape(cmd)
        environment = spec_server_env(
            launcher=launcher, overlap=overlap, plugins=plugins, **(env or {})
        )
    for path in reversed(list(pythonpath)):
        environment["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(path), environment.get("PYTHONPATH", "")) if p
        )
    with running_server(
        [*cmd, *args],
        port,
        environment,
        Path(log_path),
        ready_timeout_s,
        grace_s=grace_s,
    ) as server:
        yield server


#: what the gated NEXTN test servers get besides their draft sync: runtime
#: changes at the next step, status every 0.2 s, every decision logged,
#: SGLang's CI asserts and its strict idle memory check.
E2E_GATE_ENV = {
    "EAGLE_GATE_CONTROL_EVERY": "1",
    "EAGLE_GATE_OPS_INTERVAL_S": "0.2",
    "EAGLE_GATE_DECISION_LOG_RATE": "100000",
    "SGLANG_IS_IN_CI": "1",
    "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
}


def nextn_server(
    model: Path, root: Path, draft_sync: str, test_plugins: Path
) -> contextlib.AbstractContextManager[RunningServer]:
    """A gated NEXTN server of an MTP ``model`` (its own draft; policy
    ``never`` until a test sets one, the test plugins on its path), its log in
    ``root/server.log``, decision log in ``root/decisions``, status in
    ``root/status``."""
    gate_args = [
        "--gate-policy", "never",
        "--gate-draft-sync", draft_sync,
        "--gate-decision-log", str(root / "decisions"),
        "--gate-status-dir", str(root / "status"),
    ]  # fmt: skip
    return serve(
        model,
        root / "server.log",
        draft_dir=model,
        algorithm="NEXTN",
        launcher="gate",
        overlap=True,
        gate_args=gate_args,
        env=E2E_GATE_ENV,
        pythonpath=[test_plugins],
    )


@contextlib.contextmanager
def serve_together(
    managers: Sequence[contextlib.AbstractContextManager],
) -> Iterator[list[RunningServer]]:
    """Enter several :func:`serve` managers at once (their imports and model
    loads overlap: about a server start saved per extra server on two cores);
    each one that came up is stopped on the way out, whatever happened to
    the others. Yields the servers in order."""
    from concurrent.futures import ThreadPoolExecutor

    with contextlib.ExitStack() as stack:
        with ThreadPoolExecutor(max(1, len(managers))) as pool:
            futures = [pool.submit(m.__enter__) for m in managers]
        started, errors = [], []
        for manager, future in zip(managers, futures, strict=True):
            try:
                started.append(future.result())
                stack.push(manager.__exit__)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        yield started


def generate(
    base_url: str, text: str, max_new_tokens: int, *, timeout_s: float = 120.0
) -> dict:
    """POST ``/generate`` with greedy sampling; return the decoded JSON reply."""
    body = {
        "text": text,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": max_new_tokens,
        },
    }
    req = urllib.request.Request(
        f"{base_url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read().decode())
