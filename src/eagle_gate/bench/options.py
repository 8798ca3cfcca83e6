"""What ``python -m eagle_gate.bench`` runs and what one run produced: the
servers (``NAME=URL``), the concurrency grid, ``sglang.bench_serving``'s
command line (:class:`BenchOptions`) and one (server, concurrency)
measurement (:class:`RunResult`). Used by :mod:`eagle_gate.bench.runner`."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BenchOptions",
    "RunResult",
    "ServerSpec",
    "parse_concurrency",
    "parse_server",
]


@dataclass(frozen=True)
class ServerSpec:
    """One server to benchmark: a display name and its base URL."""

    name: str
    url: str


def parse_server(text: str) -> ServerSpec:
    """``NAME=URL`` (or a bare URL, named after its port) -> :class:`ServerSpec`."""
    text = text.strip()
    name, sep, url = text.partition("=")
    if not sep or "://" in name:
        url, name = text, ""
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError(f"--server {text!r}: need NAME=URL")
    if "://" not in url:
        url = "http://" + url
    if not name:
        name = url.split("://", 1)[1].replace(":", "-").replace("/", "-")
    if not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ValueError(
            f"--server {text!r}: the name may hold letters, digits, '-', '_', '.'"
        )
    return ServerSpec(name=name.strip(), url=url)


def parse_concurrency(text: str) -> list[int]:
    """``"1,2,5"`` -> ``[1, 2, 5]`` (positive, duplicates dropped, order kept)."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            c = int(part)
        except ValueError:
            raise ValueError(f"concurrency {part!r} is not an integer") from None
        if c < 1:
            raise ValueError(f"concurrency {c} must be >= 1")
        if c not in out:
            out.append(c)
    if not out:
        raise ValueError("no concurrency given")
    return out


@dataclass(frozen=True)
class BenchOptions:
    """How to run ``sglang.bench_serving`` (the dataset options pass through)."""

    dataset_name: str = "random"
    dataset_path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 256
    random_range_ratio: float | None = None
    sharegpt_output_len: int | None = None
    tokenizer: str | None = None
    seed: int = 1
    #: prompts per concurrency level; ``None``: ``max(prompts_factor*C, min_prompts)``
    num_prompts: int | None = None
    prompts_factor: int = 4
    min_prompts: int = 32
    warmup_requests: int | None = None
    flush_cache: bool = False
    extra_args: tuple[str, ...] = ()
    python: str = field(default_factory=lambda: sys.executable)
    module: str = "sglang.bench_serving"
    timeout_s: float = 3600.0

    def prompts_for(self, concurrency: int) -> int:
        if self.num_prompts is not None:
            return self.num_prompts
        return max(self.prompts_factor * concurrency, self.min_prompts)

    def command(self, url: str, concurrency: int, output_file: Path) -> list[str]:
        cmd = [
            self.python,
            "-m",
            self.module,
            "--backend",
            "sglang",
            "--base-url",
            url,
            "--max-concurrency",
            str(concurrency),
            "--num-prompts",
            str(self.prompts_for(concurrency)),
            "--output-file",
            str(output_file),
            "--dataset-name",
            self.dataset_name,
            "--seed",
            str(self.seed),
            "--disable-tqdm",
        ]
        if self.dataset_path:
            cmd += ["--dataset-path", self.dataset_path]
        if self.dataset_name.startswith("random"):
            cmd += [
                "--random-input-len",
                str(self.random_input_len),
                "--random-output-len",
                str(self.random_output_len),
            ]
            if self.random_range_ratio is not None:
                cmd += ["--random-range-ratio", str(self.random_range_ratio)]
        if self.sharegpt_output_len is not None:
            cmd += ["--sharegpt-output-len", str(self.sharegpt_output_len)]
        if self.tokenizer:
            cmd += ["--tokenizer", self.tokenizer]
        if self.warmup_requests is not None:
            cmd += ["--warmup-requests", str(self.warmup_requests)]
        if self.flush_cache:
            cmd += ["--flush-cache"]
        return cmd + list(self.extra_args)

    def describe(self) -> str:
        if self.dataset_name.startswith("random"):
            ds = (
                f"{self.dataset_name} {self.random_input_len} in / "
                f"{self.random_output_len} out"
            )
            if self.random_range_ratio is not None:
                ds += f" (range ratio {self.random_range_ratio:g})"
        else:
            ds = self.dataset_name
            if self.sharegpt_output_len is not None:
                ds += f", {self.sharegpt_output_len} out"
        if self.num_prompts is not None:
            n = f"{self.num_prompts} prompts per level"
        else:
            n = f"max({self.prompts_factor}*C, {self.min_prompts}) prompts per level"
        return f"{ds}, {n}"

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra_args"] = list(self.extra_args)
        return d


@dataclass
class RunResult:
    """One (server, concurrency) measurement; ``ok=False`` carries ``error``."""

    server: str
    concurrency: int
    num_prompts: int
    ok: bool = False
    error: str | None = None
    warning: str | None = None
    output_tok_s: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    mean_ttft_ms: float | None = None
    mean_e2e_ms: float | None = None
    request_throughput: float | None = None
    completed: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    duration_s: float | None = None
    accept_length: float | None = None
    spec_share: float | None = None
    gate_steps: dict[str, int] | None = None
    wall_s: float | None = None
    command: str | None = None
    raw_file: str | None = None
    log_file: str | None = None
