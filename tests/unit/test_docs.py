"""The documentation stays true to the repository (issue #20).

* every relative link in README.md and docs/*.md names a file that exists and,
  where it names a heading of a Markdown page (``page.md#anchor``), a heading
  that exists there: moving text between pages must not leave dead links;
* the metrics reference in docs/operations.md lists exactly the metrics
  ``eagle_gate.metrics`` exports, with the same type and labels: a metric added,
  renamed or dropped in the code fails here until the reference says so;
* README.md stays a front page (under 300 lines), and links every page in docs/.

Pure Python and fast (well under a second): no SGLang, no torch, no server.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import eagle_gate.metrics as metrics_module

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
OPERATIONS = DOCS / "operations.md"
METRICS_SOURCE = ROOT / "src" / "eagle_gate" / "metrics.py"
README_MAX_LINES = 300

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target), with an optional "title"; the text may
# itself contain brackets one level deep ([`x`], [a [b] c]).
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)"
)
# [label]: target (reference-style definitions)
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md")), *sorted(ROOT.glob("examples/**/*.md"))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """Every link target of a Markdown file, with its line number. A link's
    text may run over several lines; fenced code blocks hold no links."""
    text = path.read_text(encoding="utf-8")
    prose = dict(prose_lines(text))
    lines = [prose.get(n, "") for n in range(1, len(text.splitlines()) + 1)]
    found = []
    for number, line in enumerate(lines, 1):
        m = REFERENCE_DEF.match(line)
        if m:
            found.append((number, m.group(1)))
    joined = "\n".join(lines)
    for m in INLINE_LINK.finditer(joined):
        found.append((joined.count("\n", 0, m.start(1)) + 1, m.group(1)))
    return sorted(found)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text without markup, lower case,
    punctuation dropped (word characters, spaces and hyphens stay), spaces
    to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = CODE_SPAN.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith(
        "//"
    )


def broken_links(files: list[Path], root: Path = ROOT) -> list[str]:
    problems = []
    for md in files:
        for number, target in links(md):
            if is_external(target):
                continue
            where = f"{md.relative_to(root)}:{number}: ({target})"
            path_part, _, anchor = target.partition("#")
            dest = (md.parent / path_part).resolve() if path_part else md
            if not dest.exists():
                problems.append(f"{where}: no such file {dest.relative_to(root)}")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(
                    f"{where}: no heading #{anchor} in {dest.relative_to(root)}"
                )
    return problems


def test_every_relative_link_resolves():
    files = markdown_files()
    assert len(files) > 5, files  # README and the docs pages were found
    problems = broken_links(files)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_link_check_catches_a_dead_file_and_a_dead_anchor(tmp_path):
    # The checker itself: a page with one dead file link, one dead anchor, one
    # good anchor, a link inside a fenced block (not a link) and an external one.
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n\n## Sizing `--mem-fraction-static`\n\n"
        "[ok](#sizing---mem-fraction-static) [ok too](page.md#top)\n"
        "[gone](missing.md) [bad anchor](#nowhere) [web](https://example.com/x)\n"
        "[two\nlines](#top) [two\nlines, dead](#gone)\n"
        "```\n[not a link](nothing.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links([page], root=tmp_path)
    assert sorted(p.split(": ", 1)[0] for p in problems) == [
        "page.md:6",
        "page.md:6",
        "page.md:9",  # the line where the target stands
    ], problems
    assert any("no such file missing.md" in p for p in problems), problems
    assert any("no heading #nowhere" in p for p in problems), problems
    assert any("(#gone): no heading #gone" in p for p in problems), problems


def test_slug_matches_githubs_anchors():
    assert slug("Shadow mode: watch before you switch") == (
        "shadow-mode-watch-before-you-switch"
    )
    assert slug("Reading SGLang's own speculative numbers under the gate") == (
        "reading-sglangs-own-speculative-numbers-under-the-gate"
    )
    assert slug("What a GPU user should expect from `examples/validate_gpu.py`") == (
        "what-a-gpu-user-should-expect-from-examplesvalidate_gpupy"
    )
    assert slug("1. Today") == "1-today"


# -- the metrics reference ---------------------------------------------------

TYPES = {"counter", "gauge", "histogram"}


def exported_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, labels) of what eagle_gate.metrics defines.

    ``GateMetrics`` builds one prometheus_client object per ``METRICS`` entry
    (plus the label ``dp_rank`` on each). A metric constructed anywhere else in
    metrics.py under a literal name would escape that table, so the source is
    also searched for such constructor calls."""
    table = {
        name: (kind, tuple(labels))
        for name, (kind, labels, _doc) in metrics_module.METRICS.items()
    }
    tree = ast.parse(METRICS_SOURCE.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        fname = (
            func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        )
        first = node.args[0]
        if (
            fname in {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
            and isinstance(first, ast.Constant)
            and isinstance(first.value, str)
        ):
            assert first.value in table, (
                f"metrics.py line {node.lineno} constructs {first.value!r} outside "
                "METRICS; define it in METRICS so it is documented and tested"
            )
    return table


def documented_metrics(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (type, labels) from the table under "### Metrics reference".

    Labels are the backticked names of the labels cell outside parentheses:
    "`mode` (`spec`, `plain`)" is the label ``mode`` with its values."""
    section = re.search(r"^### Metrics reference\n(.*?)(?=^#{1,3} )", text, re.M | re.S)
    assert section, "docs/operations.md has no '### Metrics reference' section"
    rows = {}
    for line in section.group(1).splitlines():
        m = re.match(r"^\|\s*`(eagle_gate_\w+)`\s*\|([^|]*)\|([^|]*)\|", line)
        if not m:
            continue
        name, kind, labels_cell = m.group(1), m.group(2).strip(), m.group(3)
        assert name not in rows, f"{name} is listed twice in the metrics reference"
        outside = re.sub(r"\([^)]*\)", "", labels_cell)
        rows[name] = (kind, tuple(re.findall(r"`(\w+)`", outside)))
    return rows


def metrics_mismatch(
    code: dict[str, tuple[str, tuple[str, ...]]],
    doc: dict[str, tuple[str, tuple[str, ...]]],
) -> list[str]:
    problems = []
    for name in sorted(set(code) - set(doc)):
        problems.append(f"exported but missing from docs/operations.md: {name}")
    for name in sorted(set(doc) - set(code)):
        problems.append(f"in docs/operations.md but not exported by the code: {name}")
    for name in sorted(set(code) & set(doc)):
        (ckind, clabels), (dkind, dlabels) = code[name], doc[name]
        if ckind != dkind:
            problems.append(
                f"{name}: type {dkind!r} in the docs, {ckind!r} in the code"
            )
        if clabels != dlabels:
            problems.append(
                f"{name}: labels {list(dlabels)} in the docs, {list(clabels)} in the "
                "code (dp_rank, on every series, is not listed per row)"
            )
    return problems


def test_metrics_reference_lists_exactly_the_exported_metrics():
    code = exported_metrics()
    assert len(code) >= 20 and all(k in TYPES for k, _ in code.values()), code
    doc = documented_metrics(OPERATIONS.read_text(encoding="utf-8"))
    problems = metrics_mismatch(code, doc)
    assert not problems, "metrics reference out of date:\n" + "\n".join(problems)


def test_metrics_check_catches_a_missing_an_extra_and_a_changed_metric():
    code = {
        "eagle_gate_a_total": ("counter", ("mode",)),
        "eagle_gate_b": ("gauge", ()),
        "eagle_gate_c": ("gauge", ()),
    }
    doc_text = (
        "### Metrics reference\n\n"
        "| metric | type | labels | meaning |\n|---|---|---|---|\n"
        "| `eagle_gate_a_total` | counter | `reason` (`x`, `y`) | a |\n"
        "| `eagle_gate_b` | counter | | b |\n"
        "| `eagle_gate_z` | gauge | | z |\n\n## Next\n"
    )
    problems = metrics_mismatch(code, documented_metrics(doc_text))
    assert problems == [
        "exported but missing from docs/operations.md: eagle_gate_c",
        "in docs/operations.md but not exported by the code: eagle_gate_z",
        "eagle_gate_a_total: labels ['reason'] in the docs, ['mode'] in the code "
        "(dp_rank, on every series, is not listed per row)",
        "eagle_gate_b: type 'counter' in the docs, 'gauge' in the code",
    ], problems


# -- the front page ------------------------------------------------------------


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES} and "
        "move detail to a page in docs/"
    )


def test_readme_links_every_docs_page():
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for _, target in links(README)
        if not is_external(target)
    }
    unlinked = [
        p.relative_to(ROOT).as_posix()
        for p in sorted(DOCS.glob("*.md"))
        if p.resolve() not in linked
    ]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize(
    "command", ["bash scripts/test.sh", "python3 -m eagle_gate.sim"]
)
def test_readme_keeps_the_two_setup_commands(command):
    # The two commands a fresh machine runs (the main job, the tests) are
    # promised by the task's set-up; they must stay on the front page.
    assert command in README.read_text(encoding="utf-8")
