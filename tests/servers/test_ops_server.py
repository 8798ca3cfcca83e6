"""Operating the gate on a real CPU SGLang server: metrics, status, runtime
control, access rules and a failing third-party policy.

Two servers per SGLang version, each started once for the whole module:

* ``server``: ``python -m eagle_gate.launch`` with ``--enable-metrics``, no API
  key, listening on every address (so a client can also come from a
  non-loopback local address), and a deliberately failing third-party policy
  on its PYTHONPATH;
* ``keyed_server``: ``--api-key`` set (0.5.23: SGLang's stock launcher with the
  gate enabled through the environment, which also proves the plugin entry
  registers the routes; 0.5.9: the gate launcher).

The gate is idle in both (EAGLE cannot run on CPU): the policy is not asked
per step, but status, metrics and runtime control run as in a speculating
server (control applies at once when idle).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import sglang_env
from support.server import generate, serve

from eagle_gate.metrics import DEPTH_METRICS, METRICS

API_KEY = "sk-eagle-gate-test"

FAILING_PLUGIN = '''
import eagle_gate
from eagle_gate import Mode, PolicyFactory, Setting


class Explode:
    """Fails everywhere it can: decide, observe and estimates raise."""

    name = "explode"

    def __init__(self, after: int = 0):
        self.after = after

    def decide(self, view):
        raise RuntimeError("explode: decide")

    def observe(self, outcome):
        raise RuntimeError("explode: observe")

    def estimates(self):
        raise RuntimeError("explode: estimates")


class Estimating:
    """Always SPEC; exposes estimates (the optional policy protocol)."""

    name = "estimating"

    def decide(self, view):
        return Mode.SPEC

    def observe(self, outcome):
        pass

    def estimates(self):
        return {"spec_tokens_per_s": 1.5, "plain_tokens_per_s": 2.0}


@eagle_gate.hookimpl
def eagle_gate_policies():
    return [
        PolicyFactory(
            "explode",
            Explode,
            "a policy that raises everywhere (tests)",
            {"after": Setting(int, 0, "unused", minimum=0)},
        ),
        PolicyFactory("estimating", Estimating, "exposes estimates (tests)", {}),
    ]
'''


def install_failing_plugin(site: Path) -> Path:
    """A minimal installed distribution: module + dist-info with an entry point."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "eagle_gate_explode.py").write_text(FAILING_PLUGIN)
    info = site / "eagle_gate_explode-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: eagle-gate-explode\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[eagle_gate]\nexplode = eagle_gate_explode\n"
    )
    return site


@pytest.fixture(scope="module")
def remote_host():
    """A test host of our own: a network namespace joined to this machine by a
    veth pair (iproute2, as root). Requests run inside it reach the server with
    a non-loopback source address, and traffic stays between the two ends of
    the pair we made. Yields (address of this machine's end, a function that
    runs an HTTP request from inside the namespace)."""
    tag = os.getpid() % 200 + 20
    ns, host_if, peer_if = f"eg_ops_{os.getpid()}", f"egh{tag}", f"egn{tag}"
    host_ip, peer_ip = f"10.211.{tag}.1", f"10.211.{tag}.2"
    steps = [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if],
        ["ip", "link", "set", peer_if, "netns", ns],
        ["ip", "addr", "add", f"{host_ip}/24", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        [
            "ip",
            "netns",
            "exec",
            ns,
            "ip",
            "addr",
            "add",
            f"{peer_ip}/24",
            "dev",
            peer_if,
        ],
        ["ip", "netns", "exec", ns, "ip", "link", "set", peer_if, "up"],
        ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, text=True)

        def request(method: str, url: str, body: dict | None = None):
            code = (
                "import json, sys, urllib.request, urllib.error\n"
                "method, url, body = sys.argv[1], sys.argv[2], sys.argv[3]\n"
                "data = body.encode() if body else None\n"
                "req = urllib.request.Request(url, data=data, method=method,"
                " headers={'Content-Type': 'application/json'})\n"
                "try:\n"
                "    r = urllib.request.urlopen(req, timeout=30); c = r.status\n"
                "except urllib.error.HTTPError as e:\n"
                "    r, c = e, e.code\n"
                "print(json.dumps([c, json.loads(r.read().decode() or 'null')]))\n"
            )
            out = subprocess.run(
                ["ip", "netns", "exec", ns, sys.executable, "-c", code, method, url,
                 json.dumps(body) if body is not None else ""],
                check=True, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            return tuple(json.loads(out.stdout))

        yield host_ip, peer_ip, request
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def http(method, url, body=None, *, key=None, timeout=30):
    headers = {}
    data = None
    if body is not None:
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        headers["Content-Type"] = "application/json"
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            code = r.status
    except urllib.error.HTTPError as exc:
        raw = exc.read().decode(errors="replace")
        code = exc.code
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw


def wait_for(predicate, timeout_s=20.0, every_s=0.25):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def ops_env(**extra):
    # A fast ops thread so status follows changes quickly in tests.
    return {"EAGLE_GATE_OPS_INTERVAL_S": "0.2", **extra}


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    return install_failing_plugin(tmp_path_factory.mktemp("explode-site"))


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory, plugin_site):
    tmp = tmp_path_factory.mktemp("ops-server")
    gate_args = [
        "--gate-policy", "threshold",
        "--gate-set", "plain_above=16",
        "--gate-status-dir", str(tmp / "status"),
    ]  # fmt: skip
    with serve(
        tiny_model,
        tmp / "server.log",
        launcher="gate",
        gate_args=gate_args,
        args=["--enable-metrics"],
        host="0.0.0.0",
        env=ops_env(PYTHONPATH=str(plugin_site)),
    ) as srv:
        srv.status_dir = tmp / "status"
        yield srv


@pytest.fixture(scope="module")
def keyed_server(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keyed-server")
    if sglang_env.version() == "0.5.23":
        # the stock launcher; SGLang loads the gate through its entry point
        how = {"plugins": None, "env": ops_env(EAGLE_GATE_POLICY="never")}
    else:
        how = {"launcher": "gate", "gate_args": ["--gate-policy", "never"]}
        how["env"] = ops_env()
    with serve(
        tiny_model, tmp / "server.log", args=["--api-key", API_KEY], **how
    ) as srv:
        yield srv


# -- metrics ---------------------------------------------------------------------
def test_metrics_are_on_sglangs_metrics_endpoint(server):
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    assert "sglang" in text  # SGLang's own metrics are still there
    families = {
        line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")
    }
    for name in set(METRICS) - {"eagle_gate_policy_estimate", *DEPTH_METRICS}:
        # (estimates appear only for a policy that has them: see below; the
        # depth series only on a server with --gate-depths: test_depths_e2e)
        # the multiprocess collector keeps a counter's _total in the family name
        assert name in families or name.removesuffix("_total") in families, name
    assert 'eagle_gate_decode_steps_total{dp_rank="0",mode="spec"} 0.0' in text
    assert "eagle_gate_dwell_steps_bucket" in text
    info = [ln for ln in text.splitlines() if ln.startswith("eagle_gate_info{")]
    assert any('policy="threshold"' in ln and ln.endswith(" 1.0") for ln in info)


# -- status --------------------------------------------------------------------------
def test_status_over_http_and_cli(server):
    code, view = http("GET", f"{server.base_url}/eagle_gate/status")
    assert code == 200, view
    assert view["ok"] is True and view["agreement"]["all"] is True
    records = view["schedulers"]
    assert len(records) >= 1
    for r in records:
        assert r["alive"] and r["server_pid"] == server.pid
        assert r["sglang_version"] == sglang_env.version()
        assert r["adapter"] == sglang_env.adapter().NAME
        assert r["metrics"] is True and r["gated"] is False
        assert r["steps"] == {"spec": 0, "plain": 0}
        assert isinstance(r["last_decisions"], list)
        assert r["degraded"] is False
    out = subprocess.run(
        [sys.executable, "-m", "eagle_gate.cli", "status", "--url", server.base_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert {r["pid"] for r in json.loads(out.stdout)["schedulers"]} == {
        r["pid"] for r in records
    }


# -- runtime control -----------------------------------------------------------
def scheduler_versions(base_url):
    _, view = http("GET", f"{base_url}/eagle_gate/status")
    return view


def test_runtime_change_from_loopback_takes_effect_on_every_scheduler(server):
    url = f"{server.base_url}/eagle_gate/policy"
    code, reply = http("POST", url, {"settings": {"plain_above": 24}})
    assert code == 202, reply
    version = reply["version"]
    assert reply["settings"]["plain_above"] == 24

    def applied():
        view = scheduler_versions(server.base_url)
        records = view["schedulers"]
        return (
            view
            if all(r["config_version"] == version for r in records)
            and not view["pending"]
            else None
        )

    view = wait_for(applied)
    assert view, scheduler_versions(server.base_url)
    for r in view["schedulers"]:
        assert r["policy"] == "threshold" and r["settings"]["plain_above"] == 24
    assert view["agreement"]["all"]


@pytest.mark.parametrize(
    "body, words",
    [
        ({"policy": "turbo"}, ["unknown policy 'turbo'", "threshold"]),
        ({"settings": {"plain_above": "many"}}, ["'plain_above'", "'many'"]),
        ({"settings": {"nope": 1}}, ["unknown setting 'nope'"]),
        ({"policy": "threshold", "mode": 1}, ["unknown key 'mode'"]),
        (b"{not json", ["not valid JSON"]),
    ],
)
def test_invalid_change_is_refused_naming_the_problem(server, body, words):
    before = scheduler_versions(server.base_url)
    code, reply = http("POST", f"{server.base_url}/eagle_gate/policy", body)
    assert code == 400, reply
    for w in words:
        assert w in reply["error"]
    after = scheduler_versions(server.base_url)
    assert [r["policy"] for r in after["schedulers"]] == [
        r["policy"] for r in before["schedulers"]
    ]
    assert (after["requested"] or {}).get("version") == (before["requested"] or {}).get(
        "version"
    )


def test_change_without_key_is_refused_from_a_non_loopback_address(server, remote_host):
    host_ip, peer_ip, request = remote_host
    base = f"http://{host_ip}:{server.port}"
    code, view = request("GET", f"{base}/eagle_gate/status")
    assert code == 200  # reading is allowed (no key configured)
    code, reply = request("POST", f"{base}/eagle_gate/policy", {"policy": "never"})
    assert code == 403, reply
    assert "loopback" in reply["error"] and peer_ip in reply["error"]
    assert all(r["policy"] != "never" for r in scheduler_versions(base)["schedulers"])


def test_failing_third_party_policy_never_stops_generation(server):
    code, reply = http(
        "POST", f"{server.base_url}/eagle_gate/policy", {"policy": "explode"}
    )
    assert code == 202, reply

    def applied():
        view = scheduler_versions(server.base_url)
        return (
            view if all(r["policy"] == "explode" for r in view["schedulers"]) else None
        )

    assert wait_for(applied), scheduler_versions(server.base_url)
    out = generate(server.base_url, "The quick brown fox", max_new_tokens=5)
    assert len(out["output_ids"]) == 5
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as r:
        assert 'policy="explode"' in r.read().decode()
    view = scheduler_versions(server.base_url)
    assert all(r["alive"] and r["estimates"] == {} for r in view["schedulers"])
    # and back, so the order of tests does not matter
    code, _ = http(
        "POST", f"{server.base_url}/eagle_gate/policy", {"policy": "threshold"}
    )
    assert code == 202


def test_policy_estimates_are_exported(server):
    base = server.base_url
    code, reply = http("POST", f"{base}/eagle_gate/policy", {"policy": "estimating"})
    assert code == 202, reply
    line = 'eagle_gate_policy_estimate{dp_rank="0",name="spec_tokens_per_s"} 1.5'

    def exported():
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
            return line in r.read().decode()

    assert wait_for(exported)
    view = scheduler_versions(base)
    assert view["schedulers"][0]["estimates"] == {
        "spec_tokens_per_s": 1.5,
        "plain_tokens_per_s": 2.0,
    }
    code, _ = http("POST", f"{base}/eagle_gate/policy", {"policy": "threshold"})
    assert code == 202


def test_dashboard_and_alert_queries_match_the_scrape(server):
    """Every metric and label in the example dashboard and alert rules
    (examples/monitoring/) is on this server's /metrics, so a renamed metric
    fails here and not in Grafana. The server gates nothing (no speculation
    here; test_spec_e2e checks a speculating server too), but exports every
    series but the per-step gauges; the estimating policy gives the estimates
    one."""
    from support.monitoring import all_queries, problems, scrape_labels

    base = server.base_url
    code, reply = http("POST", f"{base}/eagle_gate/policy", {"policy": "estimating"})
    assert code == 202, reply

    def scraped():
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
            text = r.read().decode()
        ready = (
            'name="spec_tokens_per_s"' in text
            and 'eagle_gate_status_agreement{dp_rank="0"} 1.0' in text
        )
        return text if ready else None

    try:
        text = wait_for(scraped)
        assert text, "no estimates or no status agreement 1 on /metrics"
        # gauges of decode steps get their first value at the first decode
        # step (a gauge never set is not exported); this server decodes no
        # speculative step, the speculating server of test_spec_e2e has them
        per_step = {
            "eagle_gate_spec_accept_length",
            "eagle_gate_spec_step_ratio",
            "eagle_gate_mode",
        }
        found = problems(all_queries(), scrape_labels(text), absent_ok=per_step)
        assert found == []
    finally:
        code, _ = http("POST", f"{base}/eagle_gate/policy", {"policy": "threshold"})
        assert code == 202


# -- API key -----------------------------------------------------------------------
def test_runtime_change_needs_the_api_key(keyed_server):
    url = f"{keyed_server.base_url}/eagle_gate/policy"
    body = {"policy": "threshold", "settings": {"plain_above": 12}}
    code, _ = http("POST", url, body)
    assert code == 401
    code, _ = http("POST", url, body, key="wrong-key")
    assert code == 401
    code, _ = http("GET", f"{keyed_server.base_url}/eagle_gate/status")
    assert code == 401
    code, reply = http("POST", url, body, key=API_KEY)
    assert code == 202, reply

    def applied():
        _, view = http("GET", f"{keyed_server.base_url}/eagle_gate/status", key=API_KEY)
        records = view["schedulers"]
        return view if all(r["policy"] == "threshold" for r in records) else None

    view = wait_for(applied)
    assert view and view["ok"]
    assert generate_with_key(keyed_server.base_url)


def generate_with_key(base_url):
    code, out = http(
        "POST",
        f"{base_url}/generate",
        {"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
        key=API_KEY,
    )
    return code == 200 and len(out["output_ids"]) == 2
