"""Operations you can trust, without a server: a restart starts
clean, the status directory is private, control is no CSRF target, bad values
never get in, the plugin stops a launch it cannot serve, data-parallel
schedulers are found, ops failures neither hide nor kill, and no control file
can leave TP ranks waiting."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest
from packaging.version import Version
from support.two_ranks import run_two_ranks

from eagle_gate import http_api
from eagle_gate.adapters import installed_sglang_version
from eagle_gate.adapters.activation import ProcessInfo, activate
from eagle_gate.adapters.hooks import ACTIVE
from eagle_gate.config import ConfigError, GateConfig, resolve_config
from eagle_gate.control import (
    ControlAgreement,
    ControlError,
    ControlFile,
    read_request,
    validate_change,
    write_request,
)
from eagle_gate.launch import prepare
from eagle_gate.ops import OpsService, OpsSettings
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime
from eagle_gate.status import aggregate, read_status

JSON = {"content-type": "application/json"}


def gate_env(tmp_path, monkeypatch, *gate_args: str, **environ: str) -> dict:
    """Run the launcher's preparation (as ``python -m eagle_gate.launch``
    does) with ``environ`` as the gate's environment, and put what it exports
    into this process's environment, with ``$TMPDIR`` under ``tmp_path``."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    for name in list(os.environ):
        if name.startswith("EAGLE_GATE_"):
            monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    env = dict(os.environ)
    before = dict(env)
    prepare(["--model-path", "x", *gate_args], environ=env)
    for key, value in env.items():
        if before.get(key) != value:
            monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def fresh_active():
    yield
    if ACTIVE.ops is not None:
        ACTIVE.ops.stop()
    ACTIVE.ops = ACTIVE.runtime = ACTIVE.gate = None


def idle_scheduler() -> GateRuntime:
    """What an idle scheduler process does at start (no speculation)."""
    return activate(
        ProcessInfo(
            adapter_name="t",
            sglang_version="t",
            tp_rank=0,
            tp_size=1,
            dp_rank=None,
            num_draft_tokens=1,
            speculative_algorithm=None,
        ),
        gated=False,
        state="idle: test",
    )


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def make(policy=None, **kwargs) -> GateRuntime:
    class Fixed:
        name = "fixed"

        def decide(self, view):
            return Mode.SPEC

        def observe(self, outcome):
            pass

    return GateRuntime(
        GateConfig("threshold", {}),
        policy or Fixed(),
        sglang_version="t",
        adapter="t",
        **kwargs,
    )


# -- 1. a restart starts from its own configuration ----------------------------
def test_a_restart_starts_from_its_own_configuration(
    tmp_path, monkeypatch, fresh_active
):
    status = tmp_path / "status"  # a fixed directory, as README's /run/eagle_gate
    args = ("--gate-policy", "threshold", "--gate-status-dir", str(status))
    slow = {"EAGLE_GATE_OPS_INTERVAL_S": "3600"}  # rounds run by hand here
    # run A: a runtime change, and a scheduler that is gone
    gate_env(tmp_path, monkeypatch, *args, **slow)
    write_request(status, validate_change({"policy": "never"}, GateConfig("x")))
    gone = dead_pid()
    (status / f"scheduler-{gone}.json").write_text(
        json.dumps({"pid": gone, "policy": "never", "updated_at": time.time()})
    )
    # run B, same directory
    gate_env(tmp_path, monkeypatch, *args, "--gate-set", "plain_above=12", **slow)
    rt = idle_scheduler()
    ACTIVE.ops.run_once()  # an idle gate would apply a request at once
    assert (rt.config.policy, rt.config_version) == ("threshold", 0)
    assert rt.config.settings["plain_above"] == 12
    view = http_api.status_payload()
    assert [r["pid"] for r in view["schedulers"]] == [os.getpid()], view
    assert view["ok"] and view["requested"] is None
    # a request of another launch (the old HTTP process, late) never applies
    write_request(status, validate_change({"policy": "never"}, GateConfig("x")))
    ACTIVE.ops.run_once()
    assert rt.config.policy == "threshold"
    # this launch's own request does
    code, reply = http_api.handle_change({"policy": "always"}, "127.0.0.1", JSON)
    assert (code, reply["version"]) == (202, 1)
    ACTIVE.ops.run_once()
    assert (rt.config.policy, rt.config_version) == ("always", 1)


# -- 2. the status directory is private ------------------------------------------
def test_the_default_status_directory_is_fresh_and_private(
    tmp_path, monkeypatch, fresh_active
):
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    # someone else made the old predictable directories and planted a request
    for pid in (os.getpid(), os.getppid()):
        planted = tmp / f"eagle_gate-{pid}"
        planted.mkdir()
        planted.chmod(0o777)
        (planted / "control.json").write_text(
            json.dumps({"version": 1, "policy": "never", "settings": {}})
        )
    env = gate_env(
        tmp_path,
        monkeypatch,
        "--gate-policy",
        "threshold",
        EAGLE_GATE_OPS_INTERVAL_S="3600",
    )
    rt = idle_scheduler()
    ACTIVE.ops.run_once()
    assert rt.config.policy == "threshold"
    launch = json.loads(env["EAGLE_GATE_LAUNCH"])
    mode = os.lstat(launch["status_dir"]).st_mode
    assert mode & 0o777 == 0o700
    assert os.path.dirname(launch["status_dir"]) == str(tmp)
    assert sorted(os.listdir(launch["status_dir"])) == [
        "launch.json",
        f"scheduler-{os.getpid()}.json",
    ]
    for pid in (os.getpid(), os.getppid()):
        assert os.listdir(tmp / f"eagle_gate-{pid}") == ["control.json"]


def test_status_by_server_pid_finds_the_private_default_directory(
    tmp_path, monkeypatch
):
    env = gate_env(tmp_path, monkeypatch, "--gate-policy", "threshold")
    launch = json.loads(env["EAGLE_GATE_LAUNCH"])
    ops = OpsService(
        make(launch_id=launch["launch_id"]),
        launch["status_dir"],
        gated=False,
        settings=OpsSettings(),
    )
    ops.write_status()
    decoy = tmp_path / "tmp" / f"eagle_gate-{os.getpid()}-decoy"
    decoy.mkdir(mode=0o755)  # not private: never read
    cli = [sys.executable, "-m", "eagle_gate.cli", "status", "--pid", str(os.getpid())]
    out = subprocess.run(
        cli,
        env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["status_dir"] == launch["status_dir"]
    assert view["launch"]["launch_id"] == launch["launch_id"]
    assert [r["pid"] for r in view["schedulers"]] == [os.getpid()]


@pytest.mark.parametrize("problem", ["open to others", "a symlink", "not mine"])
def test_an_unsafe_status_directory_stops_the_launch(tmp_path, monkeypatch, problem):
    status = tmp_path / "status"
    if problem == "open to others":
        status.mkdir()
        status.chmod(0o777)
        words = "chmod 700"
    elif problem == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        status.symlink_to(tmp_path / "elsewhere")
        words = "symbolic link"
    else:
        # another user's directory without root: this user's directory, seen
        # by a process whose euid differs from its owner's (as test_doctor)
        status.mkdir(mode=0o700)
        owner = os.stat(status).st_uid
        monkeypatch.setattr(os, "geteuid", lambda: owner + 4242)
        words = f"belongs to uid {owner}, not to this user (uid {owner + 4242})"
    with pytest.raises(ConfigError) as err:
        gate_env(tmp_path, monkeypatch, "--gate-status-dir", str(status))
    assert str(status) in str(err.value) and words in str(err.value)


def test_a_planted_symlink_is_never_followed(tmp_path):
    status = tmp_path / "status"
    status.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in (f"scheduler-{os.getpid()}.json.tmp", f"scheduler-{os.getpid()}.json"):
        (status / name).symlink_to(victim)
    ops = OpsService(make(), status, gated=False, settings=OpsSettings())
    ops.write_status()
    assert victim.read_text() == "precious"
    assert json.loads((status / f"scheduler-{os.getpid()}.json").read_text())["pid"]


def test_the_decision_log_never_appends_through_a_planted_symlink(tmp_path):
    from eagle_gate.decision_log import DecisionLog

    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "decisions-7.jsonl").symlink_to(victim)
    log = DecisionLog(tmp_path / "decisions-7.jsonl")
    log.start({"pid": 7})
    with pytest.raises(OSError):
        log.flush()
    assert victim.read_text() == "precious"


def test_files_read_back_are_validated_like_a_request(tmp_path):
    status = tmp_path / "status"
    status.mkdir(mode=0o700)
    control = status / "control.json"
    good = {"version": 1, "policy": "threshold", "settings": {"plain_above": 9}}
    assert read_request(status) is None
    attacker = tmp_path / "attacker.json"
    attacker.write_text(json.dumps(good))
    control.symlink_to(attacker)
    assert read_request(status) is None  # a symlink
    control.unlink()
    bad = [
        '{"version": 1, "policy": "threshold", "settings": {"plain_above": NaN}}',
        json.dumps({**good, "version": 2**64}),
        json.dumps({**good, "version": True}),
        json.dumps({**good, "policy": "turbo"}),
        json.dumps({**good, "settings": {"plain_above": -3}}),
        json.dumps({**good, "extra": 1}),
        "[1, 2]",
    ]
    for text in bad:
        control.write_text(text)
        assert read_request(status) is None, text
        assert ControlFile(status).poll() == (0, ""), text
    os.mkfifo(control.with_name("fifo"))
    control.unlink()
    os.rename(control.with_name("fifo"), control)
    assert read_request(status) is None  # a FIFO: refused, never blocks
    control.unlink()
    control.write_text(json.dumps(good))
    assert read_request(status)["settings"]["plain_above"] == 9
    # status records: a symlink and NaN are skipped
    (status / "scheduler-1.json").symlink_to(attacker)
    (status / "scheduler-2.json").write_text('{"pid": 2, "x": NaN}')
    (status / "scheduler-3.json").write_text('{"pid": 4}')
    assert read_status(status) == []


# -- 3. control is not a CSRF target -------------------------------------------
def asgi_call(app, method, path, *, headers=None, body=b"", client="127.0.0.1"):
    """One HTTP request straight into the ASGI app, from ``client``."""
    headers = dict(headers or {})
    headers.setdefault("host", "127.0.0.1:30000")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": (client, 40000),
        "server": ("127.0.0.1", 30000),
    }
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    code = next(m["status"] for m in sent if m["type"] == "http.response.start")
    raw = b"".join(
        m.get("body", b"") for m in sent if m["type"] == "http.response.body"
    )
    return code, json.loads(raw or b"null")


@pytest.fixture
def app(tmp_path, monkeypatch):
    from fastapi import FastAPI

    gate_env(tmp_path, monkeypatch, "--gate-policy", "threshold")
    application = FastAPI()
    http_api.install(application)
    return application


def post(app, body, **kwargs):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return asgi_call(app, "POST", http_api.POLICY_PATH, body=data, **kwargs)


@pytest.mark.parametrize(
    ("client", "headers", "code", "words"),
    [
        # a cross-origin form or fetch() without preflight: text/plain
        ("127.0.0.1", {"content-type": "text/plain"}, 415, "application/json"),
        ("127.0.0.1", {}, 415, "application/json"),
        # a page the host's browser shows (SGLang allows every CORS origin)
        ("127.0.0.1", {**JSON, "origin": "http://evil.example"}, 403, "Origin"),
        ("127.0.0.1", {**JSON, "origin": "null"}, 403, "Origin"),
        # DNS rebinding: the right address, a foreign name
        (
            "127.0.0.1",
            {**JSON, "origin": "http://rebind.example:30000", "host": "x:30000"},
            403,
            "Origin",
        ),
        # another local web server's page
        ("127.0.0.1", {**JSON, "origin": "http://127.0.0.1:8080"}, 403, "Origin"),
        # through a proxy, and a forged forwarded address
        ("127.0.0.1", {**JSON, "x-forwarded-for": "127.0.0.1"}, 403, "proxied"),
        ("127.0.0.1", {**JSON, "forwarded": "for=127.0.0.1"}, 403, "proxied"),
        ("192.0.2.7", JSON, 403, "loopback"),
        ("::ffff:192.0.2.7", JSON, 403, "loopback"),
    ],
)
def test_control_refuses_what_a_browser_or_proxy_can_send(
    app, client, headers, code, words
):
    got, reply = post(app, {"policy": "never"}, headers=headers, client=client)
    assert got == code and words in reply["error"], reply
    _, view = asgi_call(app, "GET", http_api.STATUS_PATH)
    assert view["requested"] is None  # nothing was written


@pytest.mark.parametrize(
    ("client", "headers"),
    [
        ("127.0.0.1", JSON),
        ("::1", {"content-type": "application/json; charset=utf-8"}),
        ("::ffff:127.0.0.1", JSON),  # IPv4-mapped loopback
        ("127.0.0.1", {**JSON, "origin": "http://127.0.0.1:30000"}),
    ],
)
def test_control_accepts_a_local_json_client(app, client, headers):
    code, reply = post(app, {"policy": "never"}, headers=headers, client=client)
    assert code == 202, reply
    _, view = asgi_call(app, "GET", http_api.STATUS_PATH)
    assert view["requested"]["policy"] == "never"


# -- 4. NaN and overflow never get in ------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        b'{"policy": "goodput", "settings": {"ema_alpha": NaN}}',
        b'{"policy": "goodput", "settings": {"ema_alpha": Infinity}}',
        b'{"policy": "goodput", "settings": {"ema_alpha": 1e999}}',
        b'{"policy": "goodput", "settings": {"ema_alpha": ' + b"9" * 400 + b"}}",
        b'{"policy": "goodput", "settings": {"stale_steps": ' + b"9" * 30 + b"}}",
    ],
)
def test_non_finite_or_huge_values_get_a_400_naming_the_key(app, body):
    code, reply = post(app, body, headers=JSON)
    assert code == 400, reply
    key = "stale_steps" if b"stale_steps" in body else "ema_alpha"
    assert f"'{key}'" in reply["error"]
    code, view = asgi_call(app, "GET", http_api.STATUS_PATH)
    assert code == 200 and view["requested"] is None


def test_non_finite_values_are_refused_at_launch(tmp_path):
    for value in ("nan", "inf", "-inf", "1e999"):
        with pytest.raises(ConfigError, match="'ema_alpha'"):
            resolve_config(environ={}, cli_sets=[f"ema_alpha={value}"])
    path = tmp_path / "gate.toml"
    path.write_text("[settings]\nema_alpha = nan\n")
    with pytest.raises(ConfigError, match="'ema_alpha'"):
        resolve_config(environ={}, cli_config=str(path))
    with pytest.raises(ControlError, match="'ema_alpha'"):
        validate_change({"settings": {"ema_alpha": 10**400}}, GateConfig("goodput"))


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "soon", "1e999"])
def test_ops_tunables_are_refused_at_launch_and_survived_in_a_scheduler(
    tmp_path, monkeypatch, value
):
    env = {"EAGLE_GATE_CONTROL_EVERY": value}
    assert OpsSettings.from_environment(env).tick_every == 64  # never raises
    with pytest.raises(ConfigError, match="EAGLE_GATE_CONTROL_EVERY: value"):
        gate_env(tmp_path, monkeypatch, EAGLE_GATE_CONTROL_EVERY=value)


def test_a_status_record_with_nan_estimates_stays_standard_json(tmp_path):
    class Odd:
        name = "odd"

        def decide(self, view):
            return Mode.SPEC

        def observe(self, outcome):
            pass

        def estimates(self):
            return {"x": float("nan"), "y": 1.5}

    rt = make(Odd())
    rt.counters.max_decide_s = float("inf")  # any number of the record
    ops = OpsService(rt, tmp_path, gated=False, settings=OpsSettings())
    ops.write_status()
    (record,) = read_status(tmp_path)
    assert record["estimates"] == {"y": 1.5} and record["max_decide_s"] is None


# -- 5. the plugin stops a launch it cannot serve -------------------------------
class Picky:
    name = "picky"

    def __init__(self):
        raise ValueError("picky refuses to start")


@pytest.mark.parametrize("problem", ["not utf-8", "plugin error", "value error"])
def test_the_sglang_plugin_turns_every_setup_failure_into_system_exit(
    tmp_path, monkeypatch, problem
):
    from eagle_gate import plugins, sglang_plugin
    from eagle_gate.policy import PolicyFactory

    for name in list(os.environ):
        if name.startswith("EAGLE_GATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if problem == "not utf-8":
        path = tmp_path / "gate.toml"
        path.write_bytes(b'policy = "thr\xe9shold"\n')
        monkeypatch.setenv("EAGLE_GATE_CONFIG", str(path))
        words = "not UTF-8"
    elif problem == "plugin error":

        def broken():
            raise plugins.PluginError("loading an eagle_gate plugin failed: boom")

        monkeypatch.setattr(plugins, "available_policies", broken)
        monkeypatch.setenv("EAGLE_GATE_POLICY", "threshold")
        words = "boom"
    else:
        monkeypatch.setattr(
            plugins,
            "available_policies",
            lambda: {"picky": PolicyFactory("picky", Picky, "", {})},
        )
        monkeypatch.setenv("EAGLE_GATE_POLICY", "picky")
        words = "picky refuses to start"
    with pytest.raises(SystemExit) as exit_:
        sglang_plugin.load()
    assert words in str(exit_.value)
    assert "EAGLE_GATE_LAUNCH" not in os.environ  # nothing was set up


STOCK_LOADER = r"""
import os, sys
from sglang.srt.plugins import load_plugins
load_plugins()  # SGLang 0.5.23's loader: catches Exception, logs, goes on
print("SERVING WITHOUT THE GATE")
"""


def test_sglangs_own_loader_stops_on_a_gate_that_cannot_start(tmp_path):
    # by version, not by import: a 0.5.23 whose plugin loader fails to import
    # must fail here (in the subprocess below), not skip
    if Version(installed_sglang_version()).release < (0, 5, 23):
        pytest.skip("SGLang before 0.5.23 has no plugin loader (sglang.srt.plugins)")
    path = tmp_path / "gate.toml"
    path.write_bytes(b"[settings]\nplain_above = \xff\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_GATE_")}
    env.update(
        EAGLE_GATE_CONFIG=str(path), SGLANG_PLUGINS="eagle_gate", TMPDIR=str(tmp_path)
    )
    out = subprocess.run(
        [sys.executable, "-c", STOCK_LOADER],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "SERVING WITHOUT THE GATE" not in out.stdout
    assert "not UTF-8" in out.stderr and str(path) in out.stderr


# -- 6. data parallelism: schedulers are grandchildren of the server -------------
DP_TREE = r"""
import json, multiprocessing as mp, os, sys, time

def scheduler(done):
    # SGLang's DP controller spawns schedulers (multiprocessing, spawn): a
    # grandchild of the HTTP process, inheriting its environment.
    from eagle_gate.adapters.activation import ProcessInfo, activate
    rt = activate(ProcessInfo(adapter_name="t", sglang_version="t", tp_rank=0,
                              tp_size=1, dp_rank=1, num_draft_tokens=1,
                              speculative_algorithm=None),
                  gated=False, state="idle")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not done.is_set():
        time.sleep(0.05)

def dp_controller(done):
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=scheduler, args=(done,))
    p.start()
    p.join()

if __name__ == "__main__":
    from eagle_gate import http_api
    from eagle_gate.launch import prepare
    prepare(["--model-path", "x", "--gate-policy", "threshold"])
    ctx = mp.get_context("spawn")
    done = ctx.Event()
    controller = ctx.Process(target=dp_controller, args=(done,))
    controller.start()
    out = {"launcher": os.getpid(), "controller": controller.pid}

    def wait(pred, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = http_api.status_payload()
            if pred(view):
                return view
            time.sleep(0.1)
        return view

    view = wait(lambda v: v.get("schedulers"))
    out["records"] = [
        (r["pid"], r["server_pid"], r["dp_rank"]) for r in view["schedulers"]
    ]
    out["ok"] = view.get("ok")
    if view.get("schedulers"):
        code, reply = http_api.handle_change(
            {"policy": "never"}, "127.0.0.1", {"content-type": "application/json"})
        out["code"] = code
        view = wait(lambda v: all(r["policy"] == "never" for r in v["schedulers"]))
        out["policies"] = [r["policy"] for r in view["schedulers"]]
    done.set()
    controller.join(60)
    print(json.dumps(out))
"""


def test_dp_schedulers_two_generations_down_find_the_status_directory(tmp_path):
    script = tmp_path / "dp_tree.py"
    script.write_text(DP_TREE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_GATE_")}
    env.update(TMPDIR=str(tmp_path), EAGLE_GATE_OPS_INTERVAL_S="0.1")
    out = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["records"]) == 1, (result, out.stderr[-3000:])
    pid, server_pid, dp_rank = result["records"][0]
    assert pid not in (result["launcher"], result["controller"])
    assert (server_pid, dp_rank) == (result["launcher"], 1)
    assert result["ok"] and result["code"] == 202
    assert result["policies"] == ["never"]


# -- 7. ops failures are visible and never fatal ---------------------------------------
def test_a_failing_stage_never_skips_the_status_write(tmp_path, caplog):
    class BadMetrics:
        def export(self, rt):
            raise RuntimeError("prometheus gone")

    class BadLog:
        path = tmp_path / "log"

        def flush(self):
            raise OSError("disk full")

    rt = make()
    rt.decision_log = BadLog()
    ops = OpsService(
        rt, tmp_path, gated=False, settings=OpsSettings(), metrics=BadMetrics()
    )
    stamps = []
    for _ in range(3):
        ops.run_once()
        (record,) = read_status(tmp_path)
        stamps.append(record["updated_at"])
    assert stamps == sorted(set(stamps))  # rewritten every round
    assert record["ops"]["errors"]["metrics"] == 3  # failed before this write
    assert "disk full" in record["ops"]["last_errors"]["decision_log"]
    assert sum("prometheus gone" in r.getMessage() for r in caplog.records) == 1


def test_a_stale_record_is_not_ok():
    now = time.time()
    fresh = {
        "pid": os.getpid(),
        "alive": True,
        "policy": "threshold",
        "settings": {},
        "config_version": 0,
        "updated_at": now - 2,
        "ops": {"interval_s": 1.0},
    }
    assert aggregate("d", [dict(fresh)])["ok"]
    # alive, but its ops thread stopped writing a minute ago
    view = aggregate("d", [dict(fresh, updated_at=now - 60)])
    assert not view["ok"] and view["stale"] == [os.getpid()]
    assert view["schedulers"][0]["stale"] and view["schedulers"][0]["age_s"] >= 60
    slow = dict(fresh, updated_at=now - 60, ops={"interval_s": 30.0})
    assert aggregate("d", [slow])["ok"]  # within 5 rounds of its own interval
    assert not aggregate("d", [dict(fresh, updated_at=None)])["ok"]


def test_a_status_directory_that_fails_at_start_does_not_stop_the_scheduler(
    tmp_path, monkeypatch, fresh_active, caplog
):
    (tmp_path / "file").write_text("not a directory")
    unusable = str(tmp_path / "file" / "status")
    for name in list(os.environ):
        if name.startswith("EAGLE_GATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("EAGLE_GATE_OPS_INTERVAL_S", "3600")
    monkeypatch.setenv(
        "EAGLE_GATE_RESOLVED", GateConfig("threshold", status_dir=unusable).to_json()
    )
    monkeypatch.setenv(
        "EAGLE_GATE_LAUNCH",
        json.dumps(
            {"launch_id": "0" * 16, "server_pid": os.getpid(), "status_dir": unusable}
        ),
    )
    rt = idle_scheduler()  # must not raise
    assert rt.config.policy == "threshold"
    assert ACTIVE.ops.stage_errors["status"] == 1
    assert any("decoding is not affected" in r.getMessage() for r in caplog.records)


# -- 8. no control file can leave TP ranks waiting ----------------------------
@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"version": 2**64, "policy": "never", "settings": {}}),
        json.dumps({"version": -1, "policy": "never", "settings": {}}),
        '{"version": 2, "policy": "never", "settings": {"x": NaN}}',
        "not json",
    ],
)
def test_rank0_always_reaches_the_broadcast_with_an_int64(tmp_path, text):
    (tmp_path / "control.json").write_text(text)
    sent = []

    def broadcast(version, conf):
        sent.append(version)
        assert -(2**63) <= version < 2**63
        return version, conf

    rt = make(
        settings=OpsSettings(tick_every=4),
        on_tick=ControlAgreement(
            ControlFile(tmp_path), is_source=True, broadcast=broadcast
        ),
    )
    for _ in range(9):
        rt.decide(1, 1)
    assert sent == [0, 0, 0] and rt.config_version == 0 and rt.counters.tick_errors == 0


def test_rank0_broadcasts_even_when_reading_raises(tmp_path):
    sent = []

    class Broken(ControlFile):
        def poll(self):
            raise MemoryError("no")

    rt = make(
        settings=OpsSettings(tick_every=4),
        on_tick=ControlAgreement(
            Broken(tmp_path),
            is_source=True,
            broadcast=lambda v, t: (sent.append(v), (v, t))[1],
        ),
    )
    for _ in range(5):
        rt.decide(1, 1)
    assert sent == [0, 0] and rt.counters.tick_errors == 0


def test_a_version_beyond_int64_never_hangs_the_other_ranks(tmp_path):
    (tmp_path / "control.json").write_text(
        json.dumps({"version": 2**63 + 5, "policy": "never", "settings": {}})
    )
    results = run_two_ranks(tmp_path, write_step=10)
    # the bad file is ignored; the valid request (version 1, before step 10)
    # applies on both ranks at the next tick, step 12
    assert [r["switched"] for r in results] == [12, 12]
    assert [r["policy"] for r in results] == ["never", "never"]
