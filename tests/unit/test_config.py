"""Settings resolution: precedence, validation and error messages."""

from __future__ import annotations

import json

import pytest

from eagle_gate.config import (
    ENV_RESOLVED,
    ConfigError,
    GateConfig,
    config_from_environment,
    gate_requested,
    resolve_config,
)


def write(tmp_path, text: str):
    path = tmp_path / "gate.toml"
    path.write_text(text)
    return str(path)


def test_defaults():
    config = resolve_config(environ={})
    assert config.policy == "goodput"
    assert config.settings["initial_mode"] == "spec"
    config = resolve_config(environ={}, cli_policy="threshold")
    assert config.settings == {
        "plain_above": 8,
        "spec_at_or_below": 4,
        "min_dwell_steps": 32,
    }


def test_precedence_cli_over_env_over_file(tmp_path):
    path = write(
        tmp_path,
        'policy = "always"\nstatus_dir = "/file"\n[settings]\n',
    )
    env = {"EAGLE_GATE_CONFIG": path, "EAGLE_GATE_POLICY": "never"}
    assert resolve_config(environ=env).policy == "never"
    assert resolve_config(environ=env, cli_policy="always").policy == "always"
    assert resolve_config(environ={"EAGLE_GATE_CONFIG": path}).policy == "always"
    assert resolve_config(environ=env).status_dir == "/file"

    path = write(
        tmp_path,
        'policy = "threshold"\n[settings]\n'
        "plain_above = 30\nspec_at_or_below = 10\nmin_dwell_steps = 5\n",
    )
    env = {
        "EAGLE_GATE_CONFIG": path,
        "EAGLE_GATE_SET": "plain_above=20,min_dwell_steps=7",
    }
    config = resolve_config(environ=env, cli_sets=["plain_above=16"])
    assert config.settings == {
        "plain_above": 16,  # CLI
        "min_dwell_steps": 7,  # env
        "spec_at_or_below": 10,  # file
    }


def test_unknown_policy_lists_available():
    with pytest.raises(ConfigError) as err:
        resolve_config(environ={}, cli_policy="fastest")
    assert "'fastest'" in str(err.value)
    for name in ("always", "never", "threshold"):
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("assignment", "fragments"),
    [
        ("plain_above=many", ["'plain_above'", "'many'", "an integer >= 0"]),
        ("plain_above=-1", ["'plain_above'", "'-1'", "an integer >= 0"]),
        ("plain_abov=3", ["'plain_abov'", "allowed:", "plain_above"]),
        ("novalue", ["'novalue'", "KEY=VALUE"]),
    ],
)
def test_bad_settings_name_key_value_and_allowed(assignment, fragments):
    with pytest.raises(ConfigError) as err:
        resolve_config(environ={}, cli_policy="threshold", cli_sets=[assignment])
    for fragment in fragments:
        assert fragment in str(err.value)


def test_goodput_switch_cost_from_the_command_line():
    # #23: "--gate-set forcing a huge switch cost" is a launch flag like any
    # other: resolved, typed, and refused out of range before a model loads
    config = resolve_config(
        environ={},
        cli_policy="goodput",
        cli_sets=["switch_cost=1e6", "initial_mode=plain"],
    )
    assert config.settings["switch_cost"] == 1e6
    assert config.settings["initial_mode"] == "plain"
    with pytest.raises(ConfigError) as err:
        resolve_config(environ={}, cli_policy="goodput", cli_sets=["switch_cost=-1"])
    assert "'switch_cost'" in str(err.value) and "'-1'" in str(err.value)


def test_wrong_type_in_config_file_names_file(tmp_path):
    path = write(tmp_path, 'policy = "threshold"\n[settings]\nplain_above = "eight"\n')
    with pytest.raises(ConfigError) as err:
        resolve_config(environ={}, cli_config=path)
    assert "'eight'" in str(err.value) and path in str(err.value)


def test_config_file_that_does_not_parse_names_file_and_line(tmp_path):
    path = write(tmp_path, 'policy = "threshold"\n\n[settings\n')
    with pytest.raises(ConfigError) as err:
        resolve_config(environ={}, cli_config=path)
    assert path in str(err.value) and "line 3" in str(err.value)


def test_missing_config_file_and_unknown_file_key(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_config(environ={}, cli_config=str(tmp_path / "nope.toml"))
    path = write(tmp_path, 'polcy = "never"\n')
    with pytest.raises(ConfigError, match="unknown key 'polcy'"):
        resolve_config(environ={}, cli_config=path)


def test_resolved_config_travels_through_the_environment():
    config = resolve_config(
        environ={},
        cli_policy="threshold",
        cli_sets=["plain_above=3", "spec_at_or_below=1"],
    )
    env = {ENV_RESOLVED: config.to_json()}
    assert config_from_environment(env) == config
    assert GateConfig.from_json(config.to_json()) == config
    assert config_from_environment(env).create_policy().plain_above == 3


def test_gate_requested_only_when_asked():
    assert not gate_requested({})
    assert gate_requested({"EAGLE_GATE_POLICY": "never"})
    assert gate_requested({"EAGLE_GATE_ENABLE": "1"})
    assert not gate_requested({"EAGLE_GATE_ENABLE": "0", "EAGLE_GATE_POLICY": "x"})


def test_draft_sync_and_plain_step_sources_and_errors(tmp_path):
    assert resolve_config(environ={}).draft_sync == "eager"
    assert resolve_config(environ={}).plain_step is True
    path = write(tmp_path, 'draft_sync = "none"\nplain_step = false\n')
    config = resolve_config(environ={"EAGLE_GATE_CONFIG": path})
    assert (config.draft_sync, config.plain_step) == ("none", False)
    env = {"EAGLE_GATE_CONFIG": path, "EAGLE_GATE_PLAIN_STEP": "on"}
    config = resolve_config(environ=env, cli_draft_sync="eager")
    assert (config.draft_sync, config.plain_step) == ("eager", True)
    assert GateConfig.from_json(config.to_json()) == config
    with pytest.raises(ConfigError, match="'sometimes'"):
        resolve_config(environ={}, cli_draft_sync="sometimes")
    lazy = resolve_config(environ={"EAGLE_GATE_DRAFT_SYNC": "lazy"})
    assert lazy.draft_sync == "lazy"
    with pytest.raises(ConfigError, match="plain_step: value 'maybe'"):
        resolve_config(environ={"EAGLE_GATE_PLAIN_STEP": "maybe"})


def test_lazy_buffer_bound_sources_and_errors(tmp_path):
    assert resolve_config(environ={}).lazy_max_mib == 2048
    path = write(tmp_path, "lazy_max_mib = 64\n")
    assert resolve_config(environ={}, cli_config=path).lazy_max_mib == 64
    env = {"EAGLE_GATE_CONFIG": path, "EAGLE_GATE_LAZY_MAX_MIB": "128"}
    assert resolve_config(environ=env).lazy_max_mib == 128
    assert resolve_config(environ=env, cli_lazy_max_mib="32").lazy_max_mib == 32
    with pytest.raises(ConfigError, match="lazy_max_mib: value '0'"):
        resolve_config(environ={}, cli_lazy_max_mib="0")


def test_every_policy_accepts_its_own_resolved_settings_again():
    """A runtime change writes a policy's resolved settings (defaults filled
    in) to the control file and each scheduler validates them again. A
    default the schema itself refuses (goodput's deprecated ``ema_alpha``
    defaulted to None) made every runtime change to that policy be ignored."""
    from eagle_gate.plugins import available_policies
    from eagle_gate.settings import validate_settings

    for name, factory in available_policies().items():
        resolved = validate_settings(name, factory.settings, {})
        assert validate_settings(name, factory.settings, resolved) == resolved, name


# -- one declaration per setting (eagle_gate.options) ---------------------------------
#: per GateConfig field: (command-line text, environment text, TOML text, value),
#: none of them the default. A field the table gains without a row here fails
#: test_every_field_has_a_sample.
SAMPLES = {
    "policy": ("never", "never", '"never"', "never"),
    "status_dir": ("/run/g", "/run/g", '"/run/g"', "/run/g"),
    "draft_sync": ("lazy", "lazy", '"lazy"', "lazy"),
    "lazy_max_mib": ("64", "64", "64", 64),
    "plain_step": ("off", "off", "false", False),
    "plain_graphs": ("off", "off", '"off"', "off"),
    "shadow": ("on", "on", "true", True),
    "depths": ("3,1", "1, 3", "[3, 1]", "1,3"),
}
#: per setting: a value it refuses, and from where (env or a TOML line).
BAD = {
    "policy": ("env", "fastest"),
    "settings": ("env", "novalue"),
    "config": ("env", "/nonexistent/gate.toml"),
    "status_dir": ("file", "status_dir = 5"),
    "draft_sync": ("env", "sometimes"),
    "lazy_max_mib": ("env", "0"),
    "plain_step": ("env", "maybe"),
    "plain_graphs": ("env", "cuda"),
    "shadow": ("file", 'shadow = "sometimes"'),
    "depths": ("env", "0,1"),
}


def gate_flags(argv):
    import argparse

    from eagle_gate.launch import add_gate_arguments
    from eagle_gate.options import cli_values

    parser = argparse.ArgumentParser()
    add_gate_arguments(parser)
    return cli_values(parser.parse_args(argv))


def test_every_field_has_a_sample():
    import dataclasses

    from eagle_gate.options import config_options

    keys = [o.key for o in config_options()]
    assert set(SAMPLES) == set(keys) - {"settings"}
    # GateConfig's fields are the table's, with the table's defaults
    fields = {f.name: f for f in dataclasses.fields(GateConfig)}
    assert set(fields) == set(keys)
    bare = GateConfig("x")
    for o in config_options():
        if o.key not in ("policy", "settings"):
            assert getattr(bare, o.key) == o.default, o.key


def test_the_table_makes_each_flag_variable_file_key_and_json_key():
    import argparse

    from eagle_gate.config import ENV_CONFIG, ENV_SET, file_keys
    from eagle_gate.launch import add_gate_arguments
    from eagle_gate.options import OPTIONS, config_options

    parser = argparse.ArgumentParser()
    add_gate_arguments(parser)
    flags = {s for a in parser._actions for s in a.option_strings} - {"-h", "--help"}
    assert flags == {o.flag for o in OPTIONS}
    assert len({o.env for o in OPTIONS}) == len(OPTIONS)
    option_by_dest = {o.dest: o for o in OPTIONS}
    assert all(o.env.startswith("EAGLE_GATE_") for o in OPTIONS)
    for action in parser._actions:  # each flag's help names its variable
        if action.dest != "help":
            assert option_by_dest[action.dest].env in action.help, action.dest
    assert file_keys() == {o.key for o in config_options()}
    assert set(json.loads(resolve_config(environ={}).to_json())) == file_keys()
    assert (ENV_SET, ENV_CONFIG) == ("EAGLE_GATE_SET", "EAGLE_GATE_CONFIG")
    # the names users type (docs/configuration.md) do not change
    assert {o.key: (o.flag, o.env) for o in OPTIONS} == {
        "policy": ("--gate-policy", "EAGLE_GATE_POLICY"),
        "settings": ("--gate-set", "EAGLE_GATE_SET"),
        "config": ("--gate-config", "EAGLE_GATE_CONFIG"),
        "status_dir": ("--gate-status-dir", "EAGLE_GATE_STATUS_DIR"),
        "draft_sync": ("--gate-draft-sync", "EAGLE_GATE_DRAFT_SYNC"),
        "lazy_max_mib": ("--gate-lazy-max-mib", "EAGLE_GATE_LAZY_MAX_MIB"),
        "plain_step": ("--gate-plain-step", "EAGLE_GATE_PLAIN_STEP"),
        "plain_graphs": ("--gate-plain-graphs", "EAGLE_GATE_PLAIN_GRAPHS"),
        "shadow": ("--gate-shadow", "EAGLE_GATE_SHADOW"),
        "depths": ("--gate-depths", "EAGLE_GATE_DEPTHS"),
        "decision_log": ("--gate-decision-log", "EAGLE_GATE_DECISION_LOG"),
        "allow_untested_sglang": (
            "--gate-allow-untested-sglang",
            "EAGLE_GATE_ALLOW_UNTESTED_SGLANG",
        ),
    }


def test_the_launcher_flags_name_the_variables_their_readers_read():
    from eagle_gate import adapters
    from eagle_gate.decision_log import ENV_DECISION_LOG
    from eagle_gate.options import option

    assert option("decision_log").env == ENV_DECISION_LOG
    assert option("allow_untested_sglang").env == adapters.ENV_ALLOW_UNTESTED
    flags = gate_flags(["--gate-decision-log", "d", "--gate-allow-untested-sglang"])
    assert (flags["decision_log"], flags["allow_untested_sglang"]) == ("d", True)


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_each_field_from_each_source_with_its_origin(tmp_path, key):
    from eagle_gate.config import resolve_config_with_origins
    from eagle_gate.options import Origin, option

    o = option(key)
    cli_text, env_text, toml_text, value = SAMPLES[key]
    assert value != o.default
    config, origins = resolve_config_with_origins(environ={})
    assert getattr(config, key) == (o.default if key != "policy" else "goodput")
    assert origins[key] == Origin("default")

    config, origins = resolve_config_with_origins(
        gate_flags([o.flag, cli_text]), environ={o.env: "junk"}
    )
    assert getattr(config, key) == value
    assert origins[key] == Origin("cli", o.flag)

    path = write(tmp_path, f"{key} = {toml_text}\n")
    config, origins = resolve_config_with_origins(environ={o.env: env_text, ENV: path})
    assert getattr(config, key) == value
    assert origins[key] == Origin("env", o.env)

    config, origins = resolve_config_with_origins(environ={ENV: path})
    assert getattr(config, key) == value
    assert origins[key] == Origin("file", f"{key} in {path}")
    assert origins["config"] == Origin("env", ENV)
    # and through EAGLE_GATE_RESOLVED under its own key
    assert json.loads(config.to_json())[key] == value
    assert GateConfig.from_json(config.to_json()) == config


ENV = "EAGLE_GATE_CONFIG"


def test_policy_settings_report_their_origin_key_by_key(tmp_path):
    from eagle_gate.config import resolve_config_with_origins
    from eagle_gate.options import Origin

    path = write(tmp_path, 'policy = "threshold"\n[settings]\nplain_above = 30\n')
    env = {ENV: path, "EAGLE_GATE_SET": "spec_at_or_below=2"}
    cli = gate_flags(["--gate-set", "min_dwell_steps=7", "--gate-config", path])
    config, origins = resolve_config_with_origins(cli, environ=env)
    assert config.settings == {
        "plain_above": 30,
        "spec_at_or_below": 2,
        "min_dwell_steps": 7,
    }
    assert origins["settings.plain_above"] == Origin(
        "file", f"[settings] plain_above in {path}"
    )
    assert origins["settings.spec_at_or_below"] == Origin(
        "env", "spec_at_or_below in EAGLE_GATE_SET"
    )
    assert origins["settings.min_dwell_steps"] == Origin(
        "cli", "--gate-set min_dwell_steps=..."
    )
    assert origins["config"] == Origin("cli", "--gate-config")
    assert origins["policy"] == Origin("file", f"policy in {path}")
    _, origins = resolve_config_with_origins(environ={})
    assert origins["settings.initial_mode"] == Origin("default")
    assert origins["config"] == Origin("default", "no config file")


@pytest.mark.parametrize("key", sorted(BAD))
def test_a_refused_value_names_its_setting_and_origin(tmp_path, key):
    from eagle_gate.options import Origin, option

    o = option(key)
    source, text = BAD[key]
    if source == "env":
        environ = {o.env: text}
        origin = Origin("env", o.env)
        if key == "settings":
            origin = Origin("env", "EAGLE_GATE_SET")
    else:
        environ = {ENV: write(tmp_path, text + "\n")}
        origin = Origin("file", f"{key} in {environ[ENV]}")
    with pytest.raises(ConfigError) as err:
        resolve_config(environ=environ)
    assert err.value.field == key
    assert err.value.origin == origin


def test_a_refused_policy_setting_names_the_source_of_its_key(tmp_path):
    from eagle_gate.options import Origin

    env = {"EAGLE_GATE_POLICY": "threshold", "EAGLE_GATE_SET": "plain_above=x"}
    with pytest.raises(ConfigError) as err:
        resolve_config(gate_flags(["--gate-set", "min_dwell_steps=2"]), environ=env)
    assert err.value.field == "settings"
    assert err.value.origin == Origin("env", "plain_above in EAGLE_GATE_SET")
    with pytest.raises(ConfigError) as err:
        resolve_config(gate_flags(["--gate-set", "plain_abov=2"]), environ=env)
    assert err.value.origin == Origin("cli", "--gate-set plain_abov=...")
    # one setting is not at fault: a policy's own cross-setting refusal
    sets = ["plain_above=2", "spec_at_or_below=5"]
    with pytest.raises(ConfigError) as err:
        resolve_config(environ={}, cli_policy="threshold", cli_sets=sets)
    assert err.value.field == "settings" and err.value.origin is None


def test_resolve_config_takes_one_mapping_of_the_command_line():
    cli = {"policy": "threshold", "settings": ["plain_above=9"]}
    config = resolve_config(cli, environ={})
    assert config == resolve_config(
        environ={}, cli_policy="threshold", cli_sets=["plain_above=9"]
    )
    with pytest.raises(TypeError, match="polcy"):
        resolve_config({"polcy": "never"}, environ={})
    with pytest.raises(TypeError, match="cli_polcy"):
        resolve_config(environ={}, cli_polcy="never")


@pytest.mark.parametrize("line", ["lazy_max_mib = 0", "draft_sync = false"])
def test_a_files_falsy_value_is_refused_not_taken_for_the_default(tmp_path, line):
    """Every source is validated alike: a file's 0 or false is a value."""
    path = write(tmp_path, line + "\n")
    with pytest.raises(ConfigError) as err:
        resolve_config(environ={ENV: path})
    assert err.value.field == line.split()[0]
