"""``eagle-gate doctor`` (issue #13) against the real SGLang of this
environment: a healthy install is all ok, and each problem it detects makes it
exit non-zero with the fix. In-process through ``eagle_gate.cli.main`` (fast);
one subprocess run of the console script."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from eagle_gate import adapters, cli, plugins
from eagle_gate.adapters.hooks import SCHEDULER_ENTRY_TARGET
from eagle_gate.adapters.refusals import DP_LAZY_REFUSAL, PP_REFUSAL
from eagle_gate.config import ConfigError, resolve_config

VERSION = adapters.installed_sglang_version()
ADAPTER = adapters.select_adapter(VERSION)
#: SGLang 0.5.23 and later: its own plugin loader, and eagle_gate registered in it.
PLUGIN_LOADER = ADAPTER.HAS_SGLANG_PLUGINS
#: a config-only Llama checkpoint: doctor runs SGLang's own argument
#: resolution, which reads the model's config (no weights).
MODEL = tempfile.mkdtemp(prefix="eagle-gate-doctor-model-")
Path(MODEL, "config.json").write_text(
    json.dumps(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
            "vocab_size": 1000,
        }
    )
)
SPEC = ["--model-path", MODEL, "--device", "cpu", "--speculative-algorithm", "EAGLE3"]
CHAIN = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"]


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    """No gate variables of the caller, a private temporary directory, and a
    plugin manager built afresh (tests add and remove entry points)."""
    for name in list(os.environ):
        if name.startswith("EAGLE_GATE_") or name == "SGLANG_PLUGINS":
            monkeypatch.delenv(name)
    private = tmp_path / "tmp"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    plugins.plugin_manager.cache_clear()
    yield
    plugins.plugin_manager.cache_clear()


def doctor(capsys, *argv: str) -> tuple[int, dict]:
    """Run ``eagle-gate doctor --json ARGV`` in this process."""
    capsys.readouterr()
    code = cli.main(["doctor", "--json", *argv])
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is (code == 0)
    return code, report


def by_name(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"]}


def failed(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"] if not c["ok"]}


def test_a_healthy_install_is_all_ok(capsys):
    code, report = doctor(capsys, "--", *SPEC, *CHAIN)
    assert code == 0, failed(report)
    checks = by_name(report)
    # the resolved shape, as SGLang's own resolution leaves it
    assert checks["speculative flags"]["detail"].startswith(
        "gating EAGLE3, 3 steps, topk 1, 4 draft tokens"
    )
    assert all(c["ok"] and c["fix"] == "" for c in report["checks"])
    assert checks["sglang"]["detail"] == (
        f"SGLang {VERSION}, served by adapter {ADAPTER.NAME}"
    )
    for target in ADAPTER.TARGETS:
        assert f"patch {target.qualname}" in checks
    assert {"plugin builtin", "plugin goodput"} <= set(checks)
    assert {"always", "never", "threshold", "goodput"} <= set(
        checks["policies"]["detail"].split(", ")
    )
    if PLUGIN_LOADER:  # 0.5.23: SGLang's plugin group
        assert "eagle_gate.sglang_plugin:load" in checks["sglang plugin"]["detail"]
    else:  # 0.5.9 has none: said, not a problem
        assert "no sglang.srt.plugins loader" in checks["sglang plugin"]["detail"]
    assert checks["setting policy"]["source"] == "default"
    assert checks["status directory"]["detail"].startswith("each launch makes")
    assert checks["speculative flags"]["detail"].startswith("gating EAGLE3")


def test_the_table_says_all_ok(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "  ok    sglang " in out and "FAIL" not in out
    assert out.rstrip().splitlines()[-1].endswith("checks ok")


def test_settings_report_their_source(capsys, tmp_path, monkeypatch):
    path = tmp_path / "gate.toml"
    path.write_text('policy = "threshold"\n[settings]\nplain_above = 16\n')
    monkeypatch.setenv("EAGLE_GATE_CONFIG", str(path))
    monkeypatch.setenv("EAGLE_GATE_SET", "spec_at_or_below=2")
    code, report = doctor(capsys, "--gate-set", "min_dwell_steps=8")
    assert code == 0, failed(report)
    checks = by_name(report)
    assert checks["config file"] == {
        "name": "config file",
        "ok": True,
        "detail": str(path),
        "fix": "",
        "source": "env",
    }
    rows = {
        "setting policy": ("threshold", "file"),
        "setting threshold.plain_above": ("16", "file"),
        "setting threshold.spec_at_or_below": ("2", "env"),
        "setting threshold.min_dwell_steps": ("8", "cli"),
        "setting lazy_max_mib": ("2048", "default"),
    }
    for name, (value, source) in rows.items():
        assert checks[name]["detail"].startswith(value + " ("), checks[name]
        assert checks[name]["source"] == source


def test_doctor_takes_every_gate_flag_the_launcher_takes():
    """Both parsers get their flags from the one table, and what doctor's
    parses is what resolve_config takes."""
    import argparse

    from eagle_gate.doctor import build_parser
    from eagle_gate.launch import add_gate_arguments, split_argv
    from eagle_gate.options import OPTIONS, cli_values

    doctor_flags = {a.dest for a in build_parser()._actions} - {"help", "json"}
    launcher = argparse.ArgumentParser()
    add_gate_arguments(launcher)
    assert doctor_flags == {a.dest for a in launcher._actions} - {"help"}
    assert doctor_flags == {o.dest for o in OPTIONS}
    args = build_parser().parse_args(["--gate-policy", "never", "--gate-shadow"])
    assert cli_values(args) == cli_values(
        split_argv(["--gate-policy", "never", "--gate-shadow"])[0]
    )
    config = resolve_config(cli_values(args), environ={})
    assert (config.policy, config.shadow) == ("never", True)


def test_an_unsupported_sglang_names_the_supported_ones(capsys, monkeypatch):
    monkeypatch.setattr(adapters, "installed_sglang_version", lambda: "0.4.1")
    code, report = doctor(capsys)
    assert code == 1
    check = failed(report)["sglang"]
    assert "SGLang 0.4.1 is not supported" in check["detail"]
    assert "supported: 0.5.9, 0.5.23" in check["detail"]
    assert "pip install 'sglang==0.5.23'" in check["fix"]
    assert "--gate-allow-untested-sglang" in check["fix"]


def test_an_untested_sglang_is_ok_when_allowed_and_the_targets_fit(capsys, monkeypatch):
    major, minor, patch = VERSION.split(".")
    untested = f"{major}.{minor}.{int(patch) + 1}"  # nearest: the installed one
    monkeypatch.setattr(adapters, "installed_sglang_version", lambda: untested)
    code, report = doctor(capsys, "--gate-allow-untested-sglang")
    assert code == 0, failed(report)
    assert f"SGLang {untested} is untested" in by_name(report)["sglang"]["detail"]


@pytest.mark.parametrize("change", ["missing", "other signature"])
def test_a_missing_or_changed_patch_target(capsys, monkeypatch, change):
    if change == "missing":
        target = SCHEDULER_ENTRY_TARGET  # checked by every adapter
        module = importlib.import_module(target.module)
        monkeypatch.delattr(module, target.qualname)
        words = "does not exist"
    else:
        target = ADAPTER.WORKER_TARGET
        owner, name = target.owner_and_name()

        def forward_batch_generation(self, batch_of_another_name):
            raise AssertionError("never called")

        monkeypatch.setattr(owner, name, forward_batch_generation)
        words = "eagle_gate expects them to start with"
    code, report = doctor(capsys)
    assert code == 1
    problems = failed(report)
    assert list(problems) == [f"patch {target.qualname}"]
    check = problems[f"patch {target.qualname}"]
    assert target.dotted in check["detail"] and words in check["detail"]
    assert f"--force-reinstall --no-deps 'sglang=={VERSION}'" in check["fix"]


def test_a_broken_policy_plugin(capsys, monkeypatch, tmp_path):
    site = tmp_path / "site"
    info = site / "eagle_gate_doctor_broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: eagle-gate-doctor-broken\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[eagle_gate]\nbroken = eagle_gate_doctor_no_such_module\n"
    )
    monkeypatch.syspath_prepend(str(site))
    code, report = doctor(capsys)
    assert code == 1
    problems = failed(report)
    check = problems["plugin broken"]
    assert "eagle_gate_doctor_no_such_module" in check["detail"]
    assert "ModuleNotFoundError" in check["detail"]
    assert "pip uninstall eagle-gate-doctor-broken" in check["fix"]
    # the launcher would stop too: policies and settings cannot be resolved
    assert {"policies", "settings"} <= set(problems)
    assert by_name(report)["plugin builtin"]["ok"]


def test_an_invalid_setting_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("EAGLE_GATE_POLICY", "threshold")
    monkeypatch.setenv("EAGLE_GATE_SET", "plain_above=lots")
    with pytest.raises(ConfigError) as own:
        resolve_config(environ=dict(os.environ))
    code, report = doctor(capsys)
    assert code == 1
    check = failed(report)["settings"]
    assert check["detail"].startswith(str(own.value))
    assert check["source"] == "env"
    assert "plain_above in EAGLE_GATE_SET" in check["detail"]
    assert check["fix"].startswith("correct or remove plain_above in EAGLE_GATE_SET")


@pytest.mark.parametrize(
    "text, key",
    [
        ('policy = "threshold"\n[settings]\nspec_at_or_below = "x"\n', "[settings] "),
        ('draft_sync = "sometimes"\n', ""),
    ],
)
def test_an_invalid_setting_from_a_config_file(capsys, tmp_path, text, key):
    path = tmp_path / "gate.toml"
    path.write_text(text)
    name = "spec_at_or_below" if key else "draft_sync"
    with pytest.raises(ConfigError) as own:
        resolve_config(environ={}, cli_config=str(path))
    code, report = doctor(capsys, "--gate-config", str(path))
    assert code == 1
    check = failed(report)["settings"]
    assert check["detail"].startswith(str(own.value))
    assert check["source"] == "file"
    assert check["fix"].startswith(f"correct or remove {key}{name} in {path}")


@pytest.mark.parametrize(
    "key, value",
    [
        ("policy", "fastest"),
        ("draft_sync", "sometimes"),
        ("lazy_max_mib", "0"),
        ("plain_step", "maybe"),
        ("plain_graphs", "cuda"),
        ("shadow", "sometimes"),
    ],
)
def test_each_refused_gate_setting_is_blamed_on_its_variable(
    capsys, monkeypatch, key, value
):
    """The origin comes from the ConfigError (its field and origin), for
    every gate-wide setting the table declares."""
    from eagle_gate.options import option

    o = option(key)
    monkeypatch.setenv(o.env, value)
    with pytest.raises(ConfigError) as own:
        resolve_config(environ=dict(os.environ))
    assert own.value.field == key
    code, report = doctor(capsys)
    assert code == 1
    check = failed(report)["settings"]
    assert check["detail"] == f"{own.value} (from env: {o.env})"
    assert check["source"] == "env"
    assert check["fix"].startswith(f"correct or remove {o.env};")


def test_the_rows_after_a_refused_setting_still_run(capsys, tmp_path, monkeypatch):
    """Settings refused: the status directory is still judged, as given."""
    shared = tmp_path / "status"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("EAGLE_GATE_DRAFT_SYNC", "sometimes")
    code, report = doctor(capsys, "--gate-status-dir", str(shared))
    assert code == 1
    assert set(failed(report)) == {"settings", "status directory"}
    assert failed(report)["status directory"]["fix"] == f"chmod 700 {shared}"


def test_a_missing_config_file_is_blamed_on_whoever_named_it(
    capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("EAGLE_GATE_CONFIG", str(tmp_path / "nowhere.toml"))
    code, report = doctor(capsys)
    assert code == 1
    check = failed(report)["settings"]
    assert "does not exist" in check["detail"]
    assert check["source"] == "env"
    assert check["fix"].startswith("correct or remove EAGLE_GATE_CONFIG")


def test_a_world_writable_status_directory(capsys, tmp_path):
    shared = tmp_path / "status"
    shared.mkdir()
    shared.chmod(0o777)
    code, report = doctor(capsys, "--gate-status-dir", str(shared))
    assert code == 1
    check = failed(report)["status directory"]
    assert "must be private to its owner" in check["detail"]
    assert check["fix"] == f"chmod 700 {shared}"
    shared.chmod(0o700)
    code, report = doctor(capsys, "--gate-status-dir", str(shared))
    assert code == 0, failed(report)
    assert by_name(report)["status directory"]["detail"].endswith("mode 700")


def test_a_status_directory_of_another_user(capsys, tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(theirs).st_uid + 4242)
    code, report = doctor(capsys, "--gate-status-dir", str(theirs))
    assert code == 1
    check = failed(report)["status directory"]
    assert "not to this user" in check["detail"]
    assert check["fix"].startswith("chown ") and str(theirs) in check["fix"]


def test_a_default_parent_open_to_all_without_the_sticky_bit(capsys, tmp_path):
    parent = Path(tempfile.gettempdir())
    parent.chmod(0o777)
    code, report = doctor(capsys)
    assert code == 1
    check = failed(report)["status directory"]
    assert "without the sticky bit" in check["detail"]
    assert check["fix"].startswith(f"chmod +t {parent}")


def test_a_status_directory_that_does_not_exist_yet_is_fine(capsys, tmp_path):
    code, report = doctor(capsys, "--gate-status-dir", str(tmp_path / "a" / "b"))
    assert code == 0, failed(report)
    assert not (tmp_path / "a").exists()  # doctor only reads


@pytest.mark.parametrize(
    "flags, words",
    [
        (
            [*CHAIN, "--tp-size", "2", "--dp-size", "2", "--enable-dp-attention"]
            + ["--gate-draft-sync", "lazy"],
            DP_LAZY_REFUSAL,
        ),
        ([*CHAIN, "--pp-size", "2"], PP_REFUSAL),
        # no shape flags: SGLang's auto-chosen Llama tree (5 steps, topk 4),
        # refused with lazy sync (0.5.23 gates it with eager: test below)
        (
            ["--gate-draft-sync", "lazy"],
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 6",
        ),
        ([*CHAIN, "--enable-multi-layer-eagle"], "multi-layer EAGLE"),
        pytest.param(
            [*CHAIN, "--speculative-use-rejection-sampling"]
            + ["--gate-draft-sync", "lazy"],
            "with rejection sampling",
            marks=pytest.mark.skipif(not PLUGIN_LOADER, reason="0.5.23's refusal"),
        ),
        pytest.param(
            [*CHAIN, "--speculative-adaptive", "--gate-draft-sync", "lazy"],
            "--speculative-adaptive with --gate-draft-sync lazy is refused",
            marks=pytest.mark.skipif(not PLUGIN_LOADER, reason="0.5.23's refusal"),
        ),
    ],
)
def test_a_refused_speculative_command_line(capsys, flags, words):
    gate = [f for f in flags if f.startswith("--gate") or f == "lazy"]
    sglang = [f for f in flags if f not in gate]
    code, report = doctor(capsys, *gate, "--", *SPEC, *sglang)
    assert code == 1
    assert list(failed(report)) == ["speculative flags"]
    check = failed(report)["speculative flags"]
    assert check["detail"].startswith("refused: ") and words in check["detail"]
    assert "[resolved: EAGLE3, " in check["detail"]
    assert "change the SGLang command line" in check["fix"]


@pytest.mark.skipif(not PLUGIN_LOADER, reason="0.5.23 has --speculative-adaptive")
def test_the_operators_own_adaptive_speculation_is_taken_over_not_refused(capsys):
    """SGLang's ``--speculative-adaptive`` (eager sync): the gate chooses among
    its depths (``adapters/sglang_0_5_23/depths.py``), so the setup passes."""
    code, report = doctor(capsys, "--", *SPEC, *CHAIN, "--speculative-adaptive")
    assert code == 0, failed(report)
    assert "adaptive" in by_name(report)["speculative flags"]["detail"]


def test_nextn_shows_as_the_eagle_sglang_runs(capsys):
    code, report = doctor(
        capsys, "--", *SPEC[:-1], "NEXTN", *CHAIN, "--speculative-num-draft-tokens", "4"
    )
    assert code == 0, failed(report)
    detail = by_name(report)["speculative flags"]["detail"]
    assert detail.startswith("gating EAGLE, 3 steps, topk 1, 4 draft tokens")
    assert "--speculative-algorithm NEXTN runs as EAGLE" in detail


def test_an_mtp_draft_is_named(capsys, tmp_path):
    """NEXTN on a MiMo target: doctor names the MTP layer SGLang builds as the
    draft (the config only; no weights are read)."""
    config = json.loads((Path(MODEL) / "config.json").read_text())
    config.update(
        architectures=["MiMoForCausalLM"],
        model_type="qwen2",
        num_nextn_predict_layers=1,
    )
    (tmp_path / "config.json").write_text(json.dumps(config))
    mimo = str(tmp_path)
    code, report = doctor(
        capsys,
        "--",
        *("--model-path", mimo, "--device", "cpu"),
        *("--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", mimo),
        *CHAIN,
        *("--speculative-num-draft-tokens", "4"),
    )
    assert code == 0, failed(report)
    detail = by_name(report)["speculative flags"]["detail"]
    assert "MTP draft MiMoMTP" in detail, detail
    assert "--speculative-algorithm NEXTN runs as EAGLE" in detail, detail


@pytest.mark.skipif(not PLUGIN_LOADER, reason="0.5.9 gates chain drafts only")
def test_sglangs_own_tree_shows_as_gated_on_0_5_23(capsys):
    """No shape flags on 0.5.23: SGLang's own tree, gated with eager sync."""
    code, report = doctor(capsys, "--", *SPEC)
    assert code == 0, failed(report)
    detail = by_name(report)["speculative flags"]["detail"]
    assert detail.startswith("gating EAGLE3, 5 steps, topk 4, 8 draft tokens"), detail
    assert "draft shape chosen by SGLang" in detail


def test_a_command_line_sglang_cannot_resolve(capsys, tmp_path):
    """SGLang's own resolution stops (no config at the model path): the row
    fails with SGLang's error, as the launch would stop before any model."""
    missing = str(tmp_path / "none")
    code, report = doctor(capsys, "--", "--model-path", missing, *SPEC[2:])
    assert code == 1
    check = failed(report)["speculative flags"]
    assert check["detail"].startswith("SGLang's resolution failed: ")
    assert "the launch would stop there too" in check["fix"]


@pytest.mark.skipif(not PLUGIN_LOADER, reason="SGLang 0.5.23's plugin group")
def test_sglang_plugins_leaving_the_gate_out(capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    code, report = doctor(capsys)
    assert code == 0  # nothing asks for the gate
    monkeypatch.setenv("EAGLE_GATE_POLICY", "threshold")
    code, report = doctor(capsys)
    assert code == 1
    assert "SGLANG_PLUGINS=other,eagle_gate" in failed(report)["sglang plugin"]["fix"]


def test_the_console_script(tmp_path):
    script = Path(sys.executable).parent / "eagle-gate"
    assert script.exists(), "eagle_gate is not installed with its console script"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE_GATE_")}
    env.pop("SGLANG_PLUGINS", None)
    env["TMPDIR"] = str(tmp_path)
    env["EAGLE_GATE_SET"] = "plain_above=lots"
    env["EAGLE_GATE_POLICY"] = "threshold"
    out = subprocess.run(
        [str(script), "doctor", "--", *SPEC, *CHAIN, "--pp-size", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1, out.stderr
    assert "  FAIL  settings " in out.stdout
    assert "  FAIL  speculative flags " in out.stdout
    assert "2 problems:" in out.stdout
    assert "    fix: correct or remove plain_above in EAGLE_GATE_SET" in out.stdout


@pytest.mark.skipif(not PLUGIN_LOADER, reason="0.5.9 refuses --gate-depths")
def test_gate_depths_show_the_depth_set_and_the_kv_reserve(capsys):
    """--gate-depths on 0.5.23: the depths row names the set, the KV each
    running request keeps for the deepest depth against the configured one,
    and where the measured per-depth cost appears."""
    chain = [*SPEC, *CHAIN, "--speculative-num-draft-tokens", "4"]
    code, report = doctor(capsys, "--gate-depths", "1,5", "--", *chain)
    assert code == 0, failed(report)
    detail = by_name(report)["draft depths"]["detail"]
    assert "SPEC depths 1,3,5 and PLAIN (configured 3)" in detail, detail
    assert "2*(5+1) = 12 tokens" in detail and "2*(3+1) = 8" in detail
    assert "depths.per_depth" in detail
    _, report = doctor(capsys, "--", *chain)  # off: no such row
    assert "draft depths" not in by_name(report)


@pytest.mark.skipif(PLUGIN_LOADER, reason="0.5.23 runs depths")
def test_gate_depths_on_0_5_9_fail_the_flags_row_and_show_no_depths(capsys):
    chain = [*SPEC, *CHAIN, "--speculative-num-draft-tokens", "4"]
    code, report = doctor(capsys, "--gate-depths", "1,2,3", "--", *chain)
    assert code == 1 and "draft depths" not in by_name(report)
