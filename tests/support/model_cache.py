"""Build (or reuse) the models the end-to-end tests serve, in one place.

``spec_models(root)`` returns ``(target, draft)``: the tiny Llama target and
the EAGLE-3 draft trained on its outputs (``support.trained_draft``), built
under ``root`` unless already there for this target; ``mtp_model(root)`` the
tiny MiMo target built from it, whose trained MTP layer is its NEXTN draft
(``support.trained_mtp``); ``main`` also builds the tiny GLM-4.5 MoE of
``support.glm_moe``. The session fixture
``spec_models`` calls it; ``scripts/test.sh`` runs this module once before it
tests the SGLang versions side by side, so the two test sessions never train
the draft at the same time into the same directory::

    PYTHONPATH=tests python -m support.model_cache build/test-models
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def tiny_llama(root: Path | str) -> Path:
    """The tiny Llama under ``root`` (built once): the EAGLE-3 target, and
    the weights and tokenizer the MiMo and GLM models start from."""
    from support.tiny_model import build_tiny_llama

    llama = Path(root) / "tiny-llama"
    if not (llama / "config.json").exists():
        build_tiny_llama(llama)
    return llama


def spec_models(root: Path | str) -> tuple[Path, Path, float]:
    """``(target, draft, seconds)``: seconds is the time the draft took (about
    0 when it was cached)."""
    from support.trained_draft import build_trained_eagle3_draft

    root = Path(root)
    target = tiny_llama(root)
    t0 = time.monotonic()
    draft = build_trained_eagle3_draft(target, root / "tiny-eagle3-trained")
    return target, draft, time.monotonic() - t0


def mtp_model(root: Path | str) -> tuple[Path, float]:
    """``(model, seconds)``: the MiMo target with its MTP layer (target and
    draft in one directory)."""
    from support.trained_mtp import build_mimo_target

    root = Path(root)
    llama = tiny_llama(root)
    t0 = time.monotonic()
    model = build_mimo_target(llama, root / "tiny-mimo-mtp")
    return model, time.monotonic() - t0


def _build_mtp(root: str) -> None:
    mtp_model(root)


def main(argv: list[str]) -> int:
    """Build both drafts side by side: each trains on one torch thread, so on
    two cores the MTP layer (~90 s) costs no wall time beside the EAGLE-3
    draft (~170 s)."""
    if len(argv) != 1:
        print("usage: python -m support.model_cache CACHE_DIR", file=sys.stderr)
        return 2
    import multiprocessing

    from support.trained_draft import read_draft_info
    from support.trained_mtp import read_mtp_info

    llama = tiny_llama(argv[0])
    mtp = multiprocessing.get_context("spawn").Process(
        target=_build_mtp, args=(argv[0],)
    )
    mtp.start()
    target, draft, seconds = spec_models(argv[0])
    info = read_draft_info(draft) or {}
    print(
        f"models in {argv[0]}: target {target.name}, draft {draft.name} "
        f"(offline accept length {info.get('accept_length')}, {seconds:.0f} s)"
    )
    from support.glm_moe import build_glm_moe

    glm = build_glm_moe(llama, Path(argv[0]) / "tiny-glm4-moe")  # seconds
    print(f"GLM-4.5 MoE model in {argv[0]}: {glm.name}")
    mtp.join()
    if mtp.exitcode != 0:
        print(f"building the MTP model failed ({mtp.exitcode})", file=sys.stderr)
        return 1
    model, seconds = mtp_model(argv[0])  # built: returns at once
    info = read_mtp_info(model) or {}
    print(
        f"MTP model in {argv[0]}: {model.name} (offline accept length "
        f"{info.get('accept_length')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
