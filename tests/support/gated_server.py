"""Talking to real servers in end-to-end tests: requests, runtime control,
status, the decision log, and the test-only policy plugins.

The servers themselves come from ``support.spec_server`` (command lines and
environments) and ``support.server`` (``running_server``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: the test-only policies' project (schedule, coin, flaky)
TEST_POLICIES = REPO / "tests" / "policies"
#: test-only policies and the example ``alternate``.
PLUGIN_SOURCES = (TEST_POLICIES, REPO / "examples" / "third_party_policy")


def install_test_plugins(target: Path) -> Path:
    """Install the test policy plugins into ``target`` (not into the
    environment); servers find them through ``PYTHONPATH``."""
    for source in PLUGIN_SOURCES:
        install_plugin(source, target)
    return target


def install_plugin(source: Path, target: Path) -> None:
    """``pip install --target target`` of the plugin project ``source``, built
    from a private copy: setuptools writes ``build/`` and ``*.egg-info`` into
    the source tree, and the test sessions that run side by side
    (``scripts/test.sh``) would otherwise build in the same folder at once
    and break each other's wheels (a module missing from one of them)."""
    import shutil
    import tempfile

    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eagle-gate-plugin-") as tmp:
        copy = Path(tmp) / Path(source).name
        shutil.copytree(
            source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info")
        )
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                "--no-build-isolation", "--target", str(target), str(copy),
            ],
            check=True,
        )  # fmt: skip


def with_pythonpath(env: dict[str, str], path: Path) -> dict[str, str]:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(path), env.get("PYTHONPATH", "")) if p
    )
    return env


#: what must never show in a gated server's log (SGLang logs a harmless
#: traceback at start on CPU, so tracebacks as such are not a signal).
LOG_FAILURES = (
    "memory leak detected",
    "resolve without a fresh forward publish",
    "eagle_gate: internal error",
    "the plain step failed",
    "DEGRADED",
    "AssertionError",
)


def log_failures(text: str, markers: Sequence[str] = LOG_FAILURES) -> list[str]:
    """The ``markers`` found in a server log."""
    return [marker for marker in markers if marker in text]


def _request(
    url: str, body: dict | bytes | None = None, *, timeout_s: float = 600.0
) -> tuple[int, dict | str]:
    """GET (no body) or POST ``body`` (a dict as JSON, or raw bytes such as
    malformed JSON); ``(status, reply)``, the reply parsed where it is JSON."""
    if body is None or isinstance(body, bytes):
        data = body
    else:
        data = json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        headers={"Content-Type": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read().decode(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def generate(
    base_url: str,
    prompt: str | Sequence[int],
    max_new_tokens: int,
    *,
    rid: str | None = None,
    timeout_s: float = 600.0,
) -> dict:
    """One greedy ``/generate`` (EOS ignored) from text or token ids."""
    body: dict = {
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": True,
        }
    }
    if isinstance(prompt, str):
        body["text"] = prompt
    else:
        body["input_ids"] = list(prompt)
    if rid is not None:
        body["rid"] = rid
    status, reply = _request(f"{base_url}/generate", body, timeout_s=timeout_s)
    if status != 200:
        raise RuntimeError(f"/generate answered {status}: {reply}")
    return {"output_ids": reply["output_ids"], "meta_info": reply["meta_info"]}


def generate_many(
    base_url: str,
    requests: Sequence[tuple[str | Sequence[int], int]],
    *,
    stagger_s: float = 0.0,
) -> list[dict]:
    """Requests ``(prompt, max_new_tokens)`` at once, or ``stagger_s`` apart,
    each on its own thread; results in order."""
    with ThreadPoolExecutor(max_workers=max(1, len(requests))) as pool:
        futures = []
        for i, (prompt, n) in enumerate(requests):
            if i and stagger_s:
                time.sleep(stagger_s)
            futures.append(pool.submit(generate, base_url, prompt, n))
        return [f.result() for f in futures]


def abort(base_url: str, rid: str) -> int:
    status, _ = _request(f"{base_url}/abort_request", {"rid": rid})
    return status


def set_policy(
    base_url: str,
    policy: str | None = None,
    *,
    shadow: bool | None = None,
    **settings,
) -> int:
    """Request a runtime change; returns its config version (asserts 202)."""
    body: dict = {"settings": settings}
    if policy is not None:
        body["policy"] = policy
    if shadow is not None:
        body["shadow"] = shadow
    status, reply = _request(f"{base_url}/eagle_gate/policy", body)
    if status != 202:
        raise RuntimeError(f"policy change refused: {status} {reply}")
    return int(reply["version"])


def status(base_url: str) -> dict:
    code, reply = _request(f"{base_url}/eagle_gate/status")
    if code != 200:
        raise RuntimeError(f"status answered {code}: {reply}")
    return reply


def scheduler_status(base_url: str, *, settle_s: float = 0.6) -> dict:
    """The (single) scheduler's status record, after the ops thread had time
    to rewrite it (the e2e servers set EAGLE_GATE_OPS_INTERVAL_S=0.2)."""
    time.sleep(settle_s)
    (record,) = status(base_url)["schedulers"]
    return record


def metrics_text(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=60) as r:
        return r.read().decode()


def decision_records(log_dir: Path) -> list[dict]:
    """Every record of every scheduler's decision log in ``log_dir``."""
    records = []
    for path in sorted(Path(log_dir).glob("decisions-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records
