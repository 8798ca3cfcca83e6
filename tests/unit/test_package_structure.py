"""The package's shape: no import circle, small modules, version adapters
that hold only what differs between versions, and every version package
providing what :mod:`eagle_gate.adapters.protocol` declares (and nothing
outside the version packages asking which version it is).

Most read the source as text (``ast``), so they need neither SGLang nor torch
and see imports inside functions too: a lazy import breaks a circle at run
time, not in the design. The protocol check imports the version packages,
which import neither SGLang nor torch at their top level.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import typing
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

import eagle_gate
from eagle_gate import adapters
from eagle_gate.adapters import protocol

PACKAGE_DIR = Path(eagle_gate.__file__).parent
SRC_DIR = PACKAGE_DIR.parent
CI_DIR = SRC_DIR.parent / "ci"
#: the most lines one module of ``eagle_gate.adapters`` may have ("no
#: module in src/eagle_gate/adapters/ is over about 400 lines").
ADAPTER_MODULE_MAX_LINES = 400
#: the most lines any other module under src/ may have.
MODULE_MAX_LINES = 500
#: the most lines one file under ci/ (the CPU CI's SGLang shims) may have.
CI_FILE_MAX_LINES = 400


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def imported_modules(path: Path, name: str, known: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in its body.

    ``from eagle_gate.x import y`` counts as importing ``eagle_gate.x.y`` when
    that is a module, else ``eagle_gate.x``; relative imports are resolved.
    """
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                candidate = f"{source}.{alias.name}"
                if candidate in known:
                    found.add(candidate)
                elif source in known:
                    found.add(source)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    known = set(modules)
    return {name: imported_modules(p, name, known) for name, p in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (as a path that ends where it began)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_relative_and_from_imports_are_resolved(tmp_path):
    pkg = tmp_path / "eagle_gate"
    (pkg / "sub").mkdir(parents=True)
    init = pkg / "sub" / "__init__.py"
    init.write_text("from .mod import x\nfrom eagle_gate import other\n")
    known = {"eagle_gate.sub.mod", "eagle_gate.other", "eagle_gate.sub"}
    assert imported_modules(init, "eagle_gate.sub", known) == {
        "eagle_gate.sub.mod",
        "eagle_gate.other",
    }


def test_no_import_circle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    "path",
    sorted((PACKAGE_DIR / "adapters").rglob("*.py")),
    ids=lambda p: str(p.relative_to(PACKAGE_DIR)),
)
def test_adapter_modules_are_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= ADAPTER_MODULE_MAX_LINES, (
        f"{path.relative_to(PACKAGE_DIR)} has {lines} lines; "
        f"keep adapter modules to {ADAPTER_MODULE_MAX_LINES} (one concern each)"
    )


@pytest.mark.parametrize(
    "path",
    sorted(SRC_DIR.rglob("*.py")),
    ids=lambda p: str(p.relative_to(SRC_DIR)),
)
def test_modules_are_small(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MODULE_MAX_LINES, (
        f"src/{path.relative_to(SRC_DIR)} has {lines} lines; keep modules to "
        f"{MODULE_MAX_LINES} (split it by concern)"
    )


@pytest.mark.parametrize(
    "path",
    sorted(
        p for p in CI_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ),
    ids=lambda p: str(p.relative_to(CI_DIR)),
)
def test_ci_files_are_small(path):
    lines = len(path.read_text(errors="replace").splitlines())
    assert lines <= CI_FILE_MAX_LINES, (
        f"ci/{path.relative_to(CI_DIR)} has {lines} lines; keep CI files to "
        f"{CI_FILE_MAX_LINES} (one shim or concern each)"
    )


def shared_runs(a: list[str], b: list[str], length: int) -> list[tuple[int, int]]:
    """Runs of ``length`` identical lines of code (stripped; blank lines,
    comments and imports skipped) in both ``a`` and ``b``: (line in a, line
    in b), 1-based, one per run's first window."""

    def is_code(text: str) -> bool:
        # comments and imports say what a module is about, not what it does
        return bool(text) and not text.startswith(("#", "import ", "from "))

    def windows(lines: list[str]) -> dict[tuple[str, ...], int]:
        code = [(i, s.strip()) for i, s in enumerate(lines, 1) if is_code(s.strip())]
        out: dict[tuple[str, ...], int] = {}
        for k in range(len(code) - length + 1):
            key = tuple(text for _, text in code[k : k + length])
            out.setdefault(key, code[k][0])
        return out

    wa, wb = windows(a), windows(b)
    hits = sorted((wa[key], wb[key]) for key in wa.keys() & wb.keys())
    runs: list[tuple[int, int]] = []
    last = (-length - 1, -length - 1)
    for hit in hits:
        same_run = 0 < hit[0] - last[0] <= length and 0 < hit[1] - last[1] <= length
        if not same_run:
            runs.append(hit)
        last = hit
    return runs


def test_shared_runs_finds_a_copied_block():
    block = [f"x{i} = {i}" for i in range(8)]
    a = ["a = 1", *block, "b = 2"]
    b = ["c = 3", "", *block]
    assert shared_runs(a, b, 6) == [(2, 3)]
    assert shared_runs(a, ["z = 0"], 6) == []
    imports = [f"import m{i}" for i in range(8)]
    assert shared_runs(imports, imports, 6) == []


#: every supported version's adapter package.
VERSION_PACKAGES = sorted((PACKAGE_DIR / "adapters").glob("sglang_*"))


def test_version_adapters_share_no_run_of_six_identical_lines():
    """A version adapter holds only what differs between versions: no file of
    one version's package repeats six lines of any file of another's."""
    assert len(VERSION_PACKAGES) >= 2, VERSION_PACKAGES
    found = []
    for i, first in enumerate(VERSION_PACKAGES):
        for second in VERSION_PACKAGES[i + 1 :]:
            for a in sorted(first.glob("*.py")):
                for b in sorted(second.glob("*.py")):
                    runs = shared_runs(
                        a.read_text().splitlines(), b.read_text().splitlines(), 6
                    )
                    found += [
                        f"{a.relative_to(PACKAGE_DIR)}:{x} ~ "
                        f"{b.relative_to(PACKAGE_DIR)}:{y}"
                        for x, y in runs
                    ]
    assert not found, (
        "the version adapters repeat each other: "
        + ", ".join(found)
        + "; move the shared sequence into a shared helper"
    )


# -- the adapter protocol ----------------------------------------------------------
#: the protocol classes of eagle_gate.adapters.protocol, by name.
PROTOCOLS: dict[str, type] = {
    name: value
    for name, value in vars(protocol).items()
    if isinstance(value, type)
    and value.__module__ == protocol.__name__
    and getattr(value, "_is_protocol", False)
}


def _type_checking_names() -> dict[str, object]:
    """What protocol.py imports under ``if TYPE_CHECKING:``, imported here, so
    its (string) annotations resolve to the real types."""
    tree = ast.parse(Path(protocol.__file__).read_text())
    namespace: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            block = ast.Module(body=node.body, type_ignores=[])
            exec(compile(block, protocol.__file__, "exec"), namespace)
    namespace.pop("__builtins__", None)
    return namespace


def protocol_members(cls: type) -> tuple[dict[str, object], dict[str, object]]:
    """``(attributes, methods)`` a protocol class declares: its annotated
    names with their resolved types, and its functions (not dunders)."""
    hints = typing.get_type_hints(
        cls, globalns={**vars(protocol), **_type_checking_names()}
    )
    own = inspect.get_annotations(cls)
    attributes = {name: hints[name] for name in own}
    methods = {
        name: value
        for name, value in vars(cls).items()
        if inspect.isfunction(value)
        and not (name.startswith("__") and name.endswith("__"))
    }
    return attributes, methods


def _parameters(function: object, *, drop_self: bool) -> list[str]:
    names = list(inspect.signature(function).parameters)
    return names[1:] if drop_self else names


def protocol_problems(obj: object, cls: type, where: str) -> list[str]:
    """Where ``obj`` (a version package or one of its modules) falls short of
    the protocol ``cls``: missing names, values of the wrong kind, callables
    whose parameter names differ from the protocol's. Nested protocols
    (``plain``, ``graphs``, ``dp``, ``fixes``) are checked in turn."""
    problems: list[str] = []
    attributes, methods = protocol_members(cls)
    for name, kind in attributes.items():
        if not hasattr(obj, name):
            problems.append(f"{where}.{name} is missing ({cls.__name__})")
            continue
        value = getattr(obj, name)
        if kind in PROTOCOLS.values():
            problems += protocol_problems(value, kind, f"{where}.{name}")
        elif kind is typing.Any:
            continue
        elif (typing.get_origin(kind) or kind) is Callable:
            if not callable(value):
                problems.append(f"{where}.{name} is not callable")
        elif isinstance(typing.get_origin(kind) or kind, type):
            expected = typing.get_origin(kind) or kind
            if not isinstance(value, expected):
                problems.append(
                    f"{where}.{name} is {type(value).__name__}, not {expected.__name__}"
                )
    for name, declared in methods.items():
        if not hasattr(obj, name):
            problems.append(f"{where}.{name}() is missing ({cls.__name__})")
            continue
        value = getattr(obj, name)
        if not callable(value):
            problems.append(f"{where}.{name} is not callable")
            continue
        want = _parameters(declared, drop_self=True)
        have = _parameters(value, drop_self=False)
        if have != want:
            problems.append(
                f"{where}.{name}({', '.join(have)}): the protocol's parameters are "
                f"({', '.join(want)})"
            )
    return problems


def test_the_protocol_module_declares_the_five_protocols():
    """The check below reads its list from these classes; this says it found
    them (and that the adapter's members are read, not hard-coded here)."""
    assert {
        "SGLangAdapter",
        "VersionPlain",
        "VersionGraphs",
        "VersionDP",
        "VersionFixes",
    } <= set(PROTOCOLS)
    attributes, methods = protocol_members(protocol.SGLangAdapter)
    assert {"NAME", "plain", "graphs", "dp", "fixes", "WORKER_TARGET"} <= set(
        attributes
    )
    assert {"resolve_spec", "launch_environment", "api_keys"} <= set(methods)


@pytest.mark.parametrize("version, module", sorted(adapters.SUPPORTED.items()))
def test_version_packages_provide_the_protocol(version, module):
    """Every supported version's package provides every name the shared code
    uses from it (what protocol.py declares), so nothing outside the package
    needs to know the version."""
    package = importlib.import_module(module)
    problems = protocol_problems(
        package, protocol.SGLangAdapter, module.rsplit(".", 1)[-1]
    )
    assert not problems, "; ".join(problems)


def test_the_protocol_check_finds_a_missing_name_and_a_changed_signature():
    _, module = next(iter(adapters.SUPPORTED.items()))
    package = importlib.import_module(module)
    fake = ModuleType("fake_version")
    fake.__dict__.update(vars(package))
    del fake.api_keys
    fake.fixes = ModuleType("fake_fixes")
    fake.fixes.__dict__.update(vars(package.fixes))
    fake.fixes.judge = lambda everything: {}
    fake.LAUNCH_ENV_KEYS = "SGLANG_X"
    problems = protocol_problems(fake, protocol.SGLangAdapter, "fake")
    assert any("fake.api_keys()" in p for p in problems), problems
    assert any("fake.fixes.judge(everything)" in p for p in problems), problems
    assert any("fake.LAUNCH_ENV_KEYS is str" in p for p in problems), problems
    assert len(problems) == 3, problems


#: what only a version package may say: comparisons with an adapter's NAME
#: (``adapter.NAME == "sglang-0.5.9"``), an adapter's NAME itself, and the
#: environment a version reads while resolving its arguments.
_NAME_COMPARISON = re.compile(r"\bNAME\s*[!=]=|[!=]=\s*[\w.]*\.NAME\b")


def version_knowledge(text: str, names: set[str], env_keys: set[str]) -> list[str]:
    """The version-specific things ``text`` (a module's source) says."""
    found = [m.group(0) for m in _NAME_COMPARISON.finditer(text)]
    found += [f"{name!r}" for name in sorted(names) if f'"{name}"' in text]
    found += [key for key in sorted(env_keys) if key in text]
    return found


def test_version_knowledge_finder_finds_a_planted_comparison():
    text = 'if adapter.NAME == "sglang-0.5.9":\n    env["SGLANG_X"] = "1"\n'
    assert version_knowledge(text, {"sglang-0.5.9"}, {"SGLANG_X"}) == [
        "NAME ==",
        "'sglang-0.5.9'",
        "SGLANG_X",
    ]
    assert version_knowledge("x = a.NAME\nif 'a' != b.NAME: pass", set(), set())
    assert version_knowledge("NAME = 'x'\nlabel = adapter.NAME", set(), set()) == []


def test_no_version_knowledge_outside_the_version_packages():
    """The shared code asks the adapter (``launch_environment``,
    ``LAUNCH_ENV_KEYS``, ``HAS_SGLANG_PLUGINS``, ``api_keys``, ...) instead of
    testing which version it is: a new version then needs nothing outside
    its own package (docs/architecture.md)."""
    packages = [importlib.import_module(m) for m in adapters.SUPPORTED.values()]
    names = {p.NAME for p in packages}
    env_keys = {
        "SGLANG_ENABLE_SPEC_V2",
        *(k for p in packages for k in p.LAUNCH_ENV_KEYS),
    }
    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR)
        if rel.parts[:1] == ("adapters",) and rel.parts[1].startswith("sglang_"):
            continue
        hits = version_knowledge(path.read_text(), names, env_keys)
        found += [f"{rel}: {hit}" for hit in hits]
    assert not found, (
        "version knowledge outside adapters/sglang_*: "
        + ", ".join(found)
        + "; ask the adapter (eagle_gate.adapters.protocol) instead"
    )
