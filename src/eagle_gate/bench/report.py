"""The results document as markdown tables (in the style of the README's
reference table) and as ``throughput.png``. Used by ``python -m
eagle_gate.bench report`` and after a grid (:mod:`eagle_gate.bench.runner`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["fmt_cell", "format_table", "write_plot"]


def fmt_cell(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def _cells(doc: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["server"], int(r["concurrency"])): r for r in doc.get("runs", [])}


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("---:" for _ in header) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def format_table(doc: Mapping[str, Any]) -> str:
    """Markdown tables in the style of the README's reference table."""
    names = [s["name"] for s in doc.get("servers", [])]
    concs = [int(c) for c in doc.get("concurrency", [])]
    cells = _cells(doc)

    def val(name: str, c: int, key: str) -> float | None:
        r = cells.get((name, c))
        if not r or not r.get("ok"):
            return None
        v = r.get(key)
        return float(v) if isinstance(v, int | float) else None

    lines = [f"output tok/s (sglang.bench_serving; {doc.get('description', '')})", ""]
    base = names[0] if names else None
    header = ["concurrency", *[f"{n} (tok/s)" for n in names]]
    header += [f"{n} / {base}" for n in names[1:]]
    rows = []
    for c in concs:
        row = [str(c)] + [fmt_cell(val(n, c, "output_tok_s"), ".1f") for n in names]
        b = val(base, c, "output_tok_s") if base else None
        for n in names[1:]:
            v = val(n, c, "output_tok_s")
            row.append(f"{v / b:.2f}" if v is not None and b else "")
        rows.append(row)
    lines += _md_table(header, rows)

    def metric_table(title, key, fmt, only_reported):
        cols = names
        if only_reported:
            cols = [n for n in names if any(val(n, c, key) is not None for c in concs)]
            if not cols:
                return []
        rows = [[str(c)] + [fmt(val(n, c, key)) for n in cols] for c in concs]
        return ["", title, "", *_md_table(["concurrency", *cols], rows)]

    lines += metric_table(
        "mean TPOT (ms)", "mean_tpot_ms", lambda v: fmt_cell(v, ".2f"), False
    )
    lines += metric_table(
        "accept length (tokens per SPEC step and request)",
        "accept_length",
        lambda v: fmt_cell(v, ".2f"),
        True,
    )
    lines += metric_table(
        "gate: share of decode steps run as SPEC",
        "spec_share",
        lambda v: "" if v is None else f"{v:.0%}",
        True,
    )

    notes = []
    for s in doc.get("servers", []):
        if s.get("error"):
            notes.append(f"- {s['name']}: {s['error']}")
    for r in doc.get("runs", []):
        srv_err = any(
            s["name"] == r["server"] and s.get("error") for s in doc.get("servers", [])
        )
        if not r.get("ok") and not srv_err:
            notes.append(f"- {r['server']} C={r['concurrency']}: {r.get('error')}")
        elif r.get("warning"):
            notes.append(f"- {r['server']} C={r['concurrency']}: {r['warning']}")
    if notes:
        lines += ["", "blank cells / warnings:", *notes]
    return "\n".join(lines)


def write_plot(doc: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> str | None:
    """``throughput.png``: tok/s vs concurrency per server, and the ratios to
    the first server; None when matplotlib is not installed or nothing ran."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = [s["name"] for s in doc.get("servers", [])]
    concs = [int(c) for c in doc.get("concurrency", [])]
    cells = _cells(doc)

    def series(name: str) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for c in concs:
            r = cells.get((name, c))
            if r and r.get("ok") and r.get("output_tok_s") is not None:
                xs.append(c)
                ys.append(float(r["output_tok_s"]))
        return xs, ys

    if not any(series(n)[0] for n in names):
        return None
    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(7, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    for n in names:
        xs, ys = series(n)
        if xs:
            ax.plot(xs, ys, marker="o", label=n)
    base = dict(zip(*series(names[0]), strict=True))
    for n in names[1:]:
        xs, ys = series(n)
        pts = [(x, y / base[x]) for x, y in zip(xs, ys, strict=True) if base.get(x)]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=n)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"sglang.bench_serving: {doc.get('description', '')}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax2.set_xlabel("concurrency (closed loop)")
    ax2.set_ylabel(f"ratio to {names[0]}")
    ax2.grid(True, alpha=0.3)
    if len(names) > 1:
        ax2.legend(fontsize=8)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "throughput.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
