"""The package's shape (#20): no import circle, small adapter modules, and
version adapters that hold only what differs between versions.

These read the source as text (``ast``), so they need neither SGLang nor torch
and see imports inside functions too: a lazy import breaks a circle at run
time, not in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import eagle_gate

PACKAGE_DIR = Path(eagle_gate.__file__).parent
#: the most lines one module of ``eagle_gate.adapters`` may have (#20: "no
#: module in src/eagle_gate/adapters/ is over about 400 lines").
ADAPTER_MODULE_MAX_LINES = 400


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
