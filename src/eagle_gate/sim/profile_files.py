"""User profile files (``--profile-file FILE``, JSON or TOML with the keys
of :class:`~eagle_gate.sim.profiles.Profile`; the format is in that module's
doc): parsed and checked here, each bad key named with what is allowed."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle_gate.sim.profiles import Profile

__all__ = ["load_profile_file", "profile_from_mapping"]


def profile_from_mapping(data: Mapping[str, Any]) -> Profile:
    """Build a :class:`Profile` from a parsed JSON/TOML mapping."""
    fields = {f.name: f for f in dataclasses.fields(Profile)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown profile key {unknown[0]!r}; allowed: {', '.join(fields)}"
        )
    if "name" not in data:
        raise ValueError("a profile needs a 'name'")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("prompt_len", "output_len"):
            lo, hi = (int(v) for v in value)
            if not 1 <= lo <= hi:
                raise ValueError(f"profile key {key!r}: need 1 <= low <= high")
            value = (lo, hi)
        elif key == "classes":
            value = {str(k): float(v) for k, v in dict(value).items()}
            if not value or not all(0.0 <= a < 1.0 for a in value.values()):
                raise ValueError("profile 'classes': acceptances in [0, 1)")
        elif key in ("plain_table", "spec_table"):
            value = tuple(sorted((float(x), float(y)) for x, y in value))
            if any(y <= 0 for _, y in value) or len({x for x, _ in value}) != len(
                value
            ):
                raise ValueError(f"profile key {key!r}: ((batch, seconds>0), ...)")
        elif key == "depths":
            value = tuple(sorted({int(d) for d in value}))
            if value and not 1 <= value[0] <= value[-1] <= 64:
                raise ValueError("profile 'depths': SPEC depths in 1..64")
        elif key in ("name", "description", "default_class"):
            value = str(value)
        elif fields[key].type in ("int", int):
            value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"profile key {key!r}: need a finite value >= 0")
        kwargs[key] = value
    prof = Profile(**kwargs)
    if prof.default_class not in prof.classes:
        raise ValueError(
            f"profile default_class {prof.default_class!r} is not in its classes"
        )
    if prof.num_draft_tokens < 2:
        raise ValueError("profile num_draft_tokens must be >= 2")
    return prof


def load_profile_file(path: str | Path) -> Profile:
    """Load a user profile from a ``.json`` or ``.toml`` file."""
    path = Path(path)
    text = path.read_text()
    if path.suffix.lower() == ".json":
        data = json.loads(text)
    else:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        data = tomllib.loads(text)
    return profile_from_mapping(data)
