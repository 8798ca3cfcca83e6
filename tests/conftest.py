from __future__ import annotations

from pathlib import Path

import pytest
from support.traffic import order_traffic_last, traffic_servers  # noqa: F401


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random-weight Llama with a locally trained tokenizer (built once)."""
    from support.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def spec_models(tmp_path_factory):
    """``(target, draft)``: the tiny target and a tiny EAGLE-3 draft trained on
    its outputs, whose proposals depend on its own KV cache and hidden inputs
    (``support.trained_draft``). Cached under ``EAGLE_GATE_MODEL_CACHE`` when
    set (scripts/test.sh sets it), so both SGLang environments of a run, and
    later runs, share them."""
    import os

    import sglang_env
    from support.model_cache import spec_models as build
    from support.timings import note
    from support.trained_draft import read_draft_info

    cache = os.environ.get("EAGLE_GATE_MODEL_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("spec-models")
    target, draft, seconds = build(root)
    info = read_draft_info(draft) or {}
    note(
        f"SGLang {sglang_env.version()}: trained draft: offline accept length "
        f"{info.get('accept_length')}, without its KV history "
        f"{info.get('accept_length_no_history')} ({seconds:.0f} s)"
    )
    return target, draft


@pytest.fixture(scope="module")
def plain_harness(tiny_model):
    """The plain-step harness of the installed SGLang version (a real target
    worker on CPU; ``support.plain``), one per test module."""
    from support.plain import installed_harness

    return installed_harness(tiny_model)


@pytest.fixture(scope="session")
def mtp_model(tmp_path_factory):
    """The tiny MiMo target whose trained MTP layer is its NEXTN draft
    (``support.trained_mtp``): target and draft are the same directory.
    Cached like ``spec_models``."""
    import os

    import sglang_env
    from support.model_cache import mtp_model as build
    from support.timings import note
    from support.trained_mtp import read_mtp_info

    cache = os.environ.get("EAGLE_GATE_MODEL_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("mtp-model")
    model, seconds = build(root)
    info = read_mtp_info(model) or {}
    note(
        f"SGLang {sglang_env.version()}: trained MTP layer: offline accept length "
        f"{info.get('accept_length')}, without its KV history "
        f"{info.get('accept_length_no_history')} ({seconds:.0f} s)"
    )
    return model


@pytest.fixture(scope="session")
def test_plugins(tmp_path_factory):
    """The test-only policies (schedule, coin, flaky) and the example
    ``alternate``, installed into a directory servers get on PYTHONPATH."""
    from support.gated_server import install_test_plugins

    return install_test_plugins(tmp_path_factory.mktemp("plugins"))


#: the test tiers, one folder each (``scripts/test.sh --fast`` runs ``unit``):
#: ``unit`` needs neither SGLang nor a model; ``inprocess`` imports SGLang (and
#: builds tiny models) inside the test process; ``servers`` starts real SGLang
#: servers or other long-lived processes.
TIERS = ("unit", "inprocess", "servers")


def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath))
        tier = path.parent.name
        if tier in TIERS:
            item.add_marker(tier)
    # the real-traffic files share one server pair: run them last, together
    order_traffic_last(items)


def pytest_terminal_summary(terminalreporter):
    from support import timings

    if timings.LINES:
        terminalreporter.section("eagle_gate: timings and measurements")
        for line in timings.LINES:
            terminalreporter.write_line(line)
