"""Every gate setting, declared once.

Why this module exists: a gate setting used to be spelled in nine places (its
environment constant, its argparse flag, a keyword of the launcher, a
parameter and a merge step of ``resolve_config``, a ``GateConfig`` field, the
JSON both ways, doctor's table), and a new one had to be added to each. Here
each is one :class:`Option`, and everything else is derived from the table:

* the ``--gate-*`` flags (:func:`add_arguments`, used by the launcher and
  ``eagle-gate doctor``) and the values they parsed (:func:`cli_values`);
* the environment variables and the config file's keys;
* ``resolve_config``'s merge (cli, env, file, default) and the origin of each
  value (:class:`Origin`), ``GateConfig.to_json`` / ``from_json``, and
  doctor's rows.

Two launcher flags (``--gate-decision-log``, ``--gate-allow-untested-sglang``)
are declared here too (``target="launch"``): they are no ``GateConfig``
field and have no file key, but their flags come from the same place.

No SGLang, no torch, no other eagle_gate module: the config layer and the
launcher import it, and it imports nothing of theirs.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from eagle_gate.depths import parse_depths

__all__ = [
    "DEFAULT_DRAFT_SYNC",
    "DEFAULT_LAZY_MAX_MIB",
    "DEFAULT_PLAIN_GRAPHS",
    "DEFAULT_POLICY",
    "DRAFT_SYNC_CHOICES",
    "OPTIONS",
    "PLAIN_GRAPHS_CHOICES",
    "ConfigError",
    "Option",
    "Origin",
    "add_arguments",
    "blame",
    "cli_values",
    "config_options",
    "file_keys",
    "from_keywords",
    "given",
    "option",
]

DEFAULT_POLICY = "goodput"
#: how a plain step keeps the EAGLE draft model's state (docs/plain-step.md).
DRAFT_SYNC_CHOICES = ("eager", "lazy", "none")
DEFAULT_DRAFT_SYNC = "eager"
#: whether the plain step gets its own DECODE CUDA-graph set (docs/plain-graphs.md).
PLAIN_GRAPHS_CHOICES = ("auto", "on", "off")
DEFAULT_PLAIN_GRAPHS = "auto"
#: default bound of the lazy draft-sync buffer, per scheduler process.
DEFAULT_LAZY_MAX_MIB = 2048

_ON = {"on", "true", "1", "yes"}
_OFF = {"off", "false", "0", "no"}


class ConfigError(ValueError):
    """The gate's configuration is invalid; the message says what and where.

    ``field``: the setting at fault (an :class:`Option`'s key: ``"policy"``,
    ``"settings"`` for a policy setting, ``"config"`` for the config file
    itself), None when no one setting is. ``origin``: where the refused value
    came from, when that is known. Both let a report (``eagle-gate doctor``)
    say what to correct without reading the message.
    """

    def __init__(
        self, message: str, *, field: str | None = None, origin: Origin | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.origin = origin


def blame(exc: ConfigError, field: str | None, origin: Origin | None) -> ConfigError:
    """``exc`` with ``field`` and ``origin`` filled in where it has none yet
    (the innermost code that knows more has already said so)."""
    if exc.field is None:
        exc.field = field
    if exc.origin is None:
        exc.origin = origin
    return exc


@dataclass(frozen=True)
class Origin:
    """Where one value came from: ``source`` (cli, env, file, default) and
    the flag, the variable or the place in the config file."""

    source: Literal["cli", "env", "file", "default"]
    where: str = ""

    def __str__(self) -> str:
        return f"{self.source}: {self.where}" if self.where else self.source


# -- the kinds of value --------------------------------------------------------------
def given(value: Any) -> bool:
    """Whether a source gives a value (an empty string, like an empty
    environment variable, gives none)."""
    return value is not None and value != ""


def parse_choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(
            f"{key}: value {value!r} is not allowed; expected one of "
            + ", ".join(repr(c) for c in choices),
            field=key,
        )
    return value


def parse_switch(key: str, value: Any) -> bool:
    """on/off, true/false, 1/0, yes/no (any case), or a TOML/JSON boolean."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    raise ConfigError(
        f"{key}: value {value!r} is not allowed; expected on or off", field=key
    )


def parse_positive_int(key: str, value: Any) -> int:
    if not isinstance(value, bool):
        try:
            number = int(str(value).strip(), 10)
        except ValueError:
            number = 0
        if number >= 1:
            return number
    raise ConfigError(
        f"{key}: value {value!r} is not allowed; expected an integer >= 1", field=key
    )


def parse_name(key: str, value: Any) -> str:
    """A policy name (whether one is installed is the plugins' to say)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"{key}: value {value!r} is not allowed; expected a policy name",
            field=key,
        )
    return value


def parse_path(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"{key}: value {value!r} is not allowed; expected a path", field=key
        )
    return value


def parse_table(key: str, value: Any) -> dict[str, Any]:
    """Policy settings as a table (the config file, ``EAGLE_GATE_RESOLVED``);
    from the command line and the environment they are KEY=VALUE lists, which
    ``resolve_config`` merges key by key."""
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{key}: value {value!r} is not allowed; expected a table of KEY = VALUE",
            field=key,
        )
    return dict(value)


def parse_flag(key: str, value: Any) -> bool:
    return bool(value)


@dataclass(frozen=True)
class Option:
    """One gate setting (or launcher flag): every name it goes by, and how its
    values are read.

    ``key`` is the ``GateConfig`` field, the config file's key and the JSON
    key (for ``target="config"``); ``flag`` the command-line flag, ``env`` the
    environment variable. ``kind`` says how a value is read (:meth:`parse`):
    one of ``choices``, an on/off switch, an integer >= 1, a path, a policy
    name, a table of policy settings (KEY=VALUE items on the command line and
    in the environment), or a bare flag. ``file_check``, when set, is what the
    config file's value must be: one of the wrong TOML type is refused when
    the file is read, naming the file. ``help`` may name ``{env}``, replaced
    by the variable.
    """

    key: str
    kind: Literal[
        "choice", "switch", "positive_int", "path", "policy", "table", "flag", "depths"
    ]
    flag: str
    env: str
    help: str
    default: Any = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    #: "config": a ``GateConfig`` field; "source": where settings come from
    #: (the config file); "launch": a launcher flag, no ``GateConfig`` field.
    target: Literal["config", "source", "launch"] = "config"
    #: what a config file's value must be, said as "'key' must be ..." (None:
    #: checked by :meth:`parse` when the value is merged).
    file_check: str | None = None
    #: ``--gate-shadow`` alone means on.
    bare_means_on: bool = False
    #: the keyword ``resolve_config`` took for this flag before it took one
    #: mapping (kept so that callers of that shape keep working).
    keyword: str = ""

    @property
    def dest(self) -> str:
        """The flag's argparse attribute (``--gate-plain-step``: gate_plain_step)."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def in_file(self) -> bool:
        return self.target == "config"

    @property
    def cli_keyword(self) -> str:
        return self.keyword or f"cli_{self.key}"

    def parse(self, value: Any) -> Any:
        """The typed value of ``value`` from any source, or ConfigError naming
        this setting (``field``)."""
        if self.kind == "choice":
            return parse_choice(self.key, value, self.choices)
        if self.kind == "switch":
            return parse_switch(self.key, value)
        if self.kind == "positive_int":
            return parse_positive_int(self.key, value)
        if self.kind == "path":
            return parse_path(self.key, value)
        if self.kind == "policy":
            return parse_name(self.key, value)
        if self.kind == "table":
            return parse_table(self.key, value)
        if self.kind == "depths":
            try:
                return parse_depths(self.key, value)
            except ValueError as exc:
                raise ConfigError(str(exc), field=self.key) from None
        return parse_flag(self.key, value)

    def file_value_ok(self, value: Any) -> bool:
        """Whether a config file's value has the type ``file_check`` says (an
        empty policy name stands for the default, as an empty variable does)."""
        if self.kind == "table":
            return isinstance(value, Mapping)
        if self.kind == "policy":
            return isinstance(value, str)
        if self.kind == "path":
            return isinstance(value, str) and bool(value)
        return True

    def argparse_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"help": self.help.replace("{env}", self.env)}
        if self.metavar:
            kwargs["metavar"] = self.metavar
        if self.kind == "choice":
            kwargs["choices"] = self.choices
        elif self.kind == "switch":
            kwargs["choices"] = ("on", "off")
            if self.bare_means_on:
                kwargs.update(nargs="?", const="on")
        elif self.kind == "table":
            kwargs.update(action="append", default=[])
        elif self.kind == "flag":
            kwargs["action"] = "store_true"
        return kwargs


# -- the table -------------------------------------------------------------------------
#: every gate setting and launcher flag, in the order ``--help`` lists them.
OPTIONS: tuple[Option, ...] = (
    Option(
        "policy",
        "policy",
        "--gate-policy",
        "EAGLE_GATE_POLICY",
        "policy deciding SPEC or PLAIN per decode batch (env {env}; default: "
        "goodput). Built-ins: always, never, threshold, goodput, goodput-depths "
        "(with --gate-depths); plugins add more",
        default=DEFAULT_POLICY,
        metavar="NAME",
        file_check="must be a string",
    ),
    Option(
        "settings",
        "table",
        "--gate-set",
        "EAGLE_GATE_SET",
        "a policy setting, repeatable (env {env}='k=v,k2=v2')",
        metavar="KEY=VALUE",
        file_check="must be a table of KEY = VALUE",
        keyword="cli_sets",
    ),
    Option(
        "config",
        "path",
        "--gate-config",
        "EAGLE_GATE_CONFIG",
        "TOML file with policy, [settings] and status_dir (env {env})",
        metavar="FILE.toml",
        target="source",
    ),
    Option(
        "status_dir",
        "path",
        "--gate-status-dir",
        "EAGLE_GATE_STATUS_DIR",
        "where each scheduler process writes its gate status (env {env}; created "
        "with mode 0700, or an existing private directory of yours; default a "
        "fresh private $TMPDIR/eagle_gate-<server pid>-XXXXXXXX). Files of a "
        "previous run there are removed at launch",
        metavar="DIR",
        file_check="must be a path",
    ),
    Option(
        "draft_sync",
        "choice",
        "--gate-draft-sync",
        "EAGLE_GATE_DRAFT_SYNC",
        "how a PLAIN step keeps the EAGLE draft model's state: eager (a draft "
        "extend per plain step, exact resume), lazy (buffer the target's hidden "
        "states, catch the draft up when SPEC resumes) or none (cold recovery) "
        "(env {env}; default eager)",
        default=DEFAULT_DRAFT_SYNC,
        choices=DRAFT_SYNC_CHOICES,
    ),
    Option(
        "lazy_max_mib",
        "positive_int",
        "--gate-lazy-max-mib",
        "EAGLE_GATE_LAZY_MAX_MIB",
        "memory bound of the lazy draft-sync buffer per scheduler process; a "
        "launch whose buffer would exceed it is refused (env {env}; default 2048)",
        default=DEFAULT_LAZY_MAX_MIB,
        metavar="N",
    ),
    Option(
        "plain_step",
        "switch",
        "--gate-plain-step",
        "EAGLE_GATE_PLAIN_STEP",
        "off: PLAIN decisions run SGLang's speculative step and are counted as "
        "overrides (env {env}; default on)",
        default=True,
    ),
    Option(
        "plain_graphs",
        "choice",
        "--gate-plain-graphs",
        "EAGLE_GATE_PLAIN_GRAPHS",
        "DECODE CUDA graphs for the plain step: auto (capture at start when "
        "possible, else run plain steps eagerly), on (refuse the launch when they "
        "cannot be captured), off (always eager) (env {env}; default auto)",
        default=DEFAULT_PLAIN_GRAPHS,
        choices=PLAIN_GRAPHS_CHOICES,
    ),
    Option(
        "depths",
        "depths",
        "--gate-depths",
        "EAGLE_GATE_DEPTHS",
        "SPEC draft depths a policy may choose per batch besides PLAIN: off (the "
        "configured depth only), auto (1, half the configured depth, the "
        "configured depth) or a list like 1,2,3; SGLang 0.5.23 only, through its "
        "adaptive runtime states (env {env}; default off)",
        default="off",
        metavar="off|auto|D,D,...",
    ),
    Option(
        "shadow",
        "switch",
        "--gate-shadow",
        "EAGLE_GATE_SHADOW",
        "shadow mode: the policy decides and observes as usual, but every step "
        "runs SGLang's stock speculative step; status, metrics and the decision "
        "log say what it would have run (env {env}; default off; switch at "
        'runtime with POST /eagle_gate/policy {"shadow": false})',
        default=False,
        bare_means_on=True,
    ),
    Option(
        "decision_log",
        "path",
        "--gate-decision-log",
        "EAGLE_GATE_DECISION_LOG",
        "opt in to a rate-limited JSON-lines log of decisions and outcomes, one "
        "file per scheduler process in DIR (env {env})",
        metavar="DIR",
        target="launch",
    ),
    Option(
        "allow_untested_sglang",
        "flag",
        "--gate-allow-untested-sglang",
        "EAGLE_GATE_ALLOW_UNTESTED_SGLANG",
        "try the nearest adapter on an unsupported SGLang version, after checking "
        "every patch target (env {env}=1)",
        default=False,
        target="launch",
    ),
)

_BY_KEY = {o.key: o for o in OPTIONS}


def option(key: str) -> Option:
    """The option named ``key`` (KeyError for none)."""
    return _BY_KEY[key]


def config_options() -> tuple[Option, ...]:
    """The ``GateConfig`` fields, in the table's order."""
    return tuple(o for o in OPTIONS if o.target == "config")


def file_keys() -> frozenset[str]:
    """The keys a config file may have."""
    return frozenset(o.key for o in OPTIONS if o.in_file)


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Every ``--gate-*`` flag, as the launcher and doctor take them."""
    for o in OPTIONS:
        parser.add_argument(o.flag, **o.argparse_kwargs())


def cli_values(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """What the command line gave, by option key, from the parsed ``--gate-*``
    flags (an argparse namespace, or a mapping of their ``dest`` names)."""
    get = args.get if isinstance(args, Mapping) else vars(args).get
    return {o.key: get(o.dest) for o in OPTIONS}


def from_keywords(keywords: Mapping[str, Any]) -> dict[str, Any]:
    """``resolve_config``'s older keywords (``cli_policy=``, ``cli_sets=``, ...)
    as a mapping by option key; TypeError for a keyword it never took."""
    by_keyword = {o.cli_keyword: o.key for o in OPTIONS if o.target != "launch"}
    unknown = sorted(set(keywords) - set(by_keyword))
    if unknown:
        raise TypeError(f"resolve_config() got an unexpected keyword {unknown[0]!r}")
    return {by_keyword[k]: v for k, v in keywords.items()}
