"""A third-party policy package (examples/third_party_policy), installed into a
temporary environment, is discovered through its entry point and selected by
name, with its settings validated like a built-in's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.gated_server import install_plugin

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "third_party_policy"

PROBE = """
import json
from eagle_gate import StepView
from eagle_gate.config import resolve_config, ConfigError
from eagle_gate.plugins import available_policies
config = resolve_config(environ={}, cli_policy="alternate", cli_sets=["period=2"])
policy = config.create_policy()
view = StepView()
modes = [int(policy.decide(view.update(batch_size=1, step=i, seq_len_sum=0)))
         for i in range(6)]
try:
    resolve_config(environ={}, cli_policy="alternate", cli_sets=["start=both"])
    error = None
except ConfigError as exc:
    error = str(exc)
print(json.dumps({"policies": sorted(available_policies()), "settings": config.settings,
                  "modes": modes, "error": error}))
"""


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict:
    target = tmp_path_factory.mktemp("plugin-site")
    # from a private copy: the two versions' sessions build it at once
    install_plugin(EXAMPLE, target)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(target), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    return env


def run_probe(env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 or "unknown policy" in out.stderr, out.stderr
    return json.loads(out.stdout) if out.returncode == 0 else {"stderr": out.stderr}


def test_plugin_is_unknown_before_install():
    result = run_probe(dict(os.environ))
    assert "unknown policy 'alternate'" in result["stderr"]


def test_installed_plugin_is_selected_by_name(plugin_env):
    result = run_probe(plugin_env)
    assert {"alternate", "always", "never", "threshold"} <= set(result["policies"])
    assert result["settings"] == {"period": 2, "start": "spec"}
    assert result["modes"] == [0, 0, 1, 1, 0, 0]  # SPEC SPEC PLAIN PLAIN ...
    assert "'start'" in result["error"] and "'both'" in result["error"]


def test_installed_plugin_is_listed_by_the_cli(plugin_env):
    out = subprocess.run(
        [sys.executable, "-m", "eagle_gate.cli", "policies"],
        env=plugin_env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "alternate: switch between SPEC and PLAIN" in out.stdout
    assert "period (an integer >= 1, default 4)" in out.stdout
