"""Which model SGLang builds as the draft, read the way SGLang reads it.

Why: an MTP draft (``--speculative-algorithm NEXTN``) is a layer of the target
checkpoint that SGLang turns into its own class (``MiMoForCausalLM`` ->
``MiMoMTP``, ``DeepseekV3ForCausalLM`` -> ``DeepseekV3ForCausalLMNextN``, ...)
in ``ModelConfig(is_draft_model=True)``. Status and doctor name that class, so
an operator sees what the gate is switching; the rule stays SGLang's. The call
is the same in 0.5.9 and 0.5.23 (``ModelConfig.from_server_args(record,
model_path=..., is_draft_model=True)``); both version packages use it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["draft_model_of"]


def draft_model_of(record: Any, draft_path: Any) -> tuple[str | None, bool]:
    """``(class, mtp)``: the model class SGLang builds for the draft at
    ``draft_path`` under ``record`` (a resolved ``ServerArgs``), by SGLang's own
    ``ModelConfig(is_draft_model=True)`` (reads the config, loads no weights),
    and whether it is the target's own MTP layer (the draft path is the
    target's). ``(None, False)`` where that cannot be read: the view reports,
    it never stops a launch."""
    if not draft_path:
        return None, False
    try:
        from sglang.srt.configs.model_config import ModelConfig

        config = ModelConfig.from_server_args(
            record, model_path=str(draft_path), is_draft_model=True
        )
        name = str(config.hf_config.architectures[0])
    except Exception:  # noqa: BLE001 - a report, never a reason to fail
        return None, False
    same = str(draft_path).rstrip("/") == str(record.model_path).rstrip("/")
    return name, same
