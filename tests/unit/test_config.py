"""Settings resolution: precedence, validation and error messages."""

from __future__ import annotations

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
