"""Smoke test for the end-to-end helpers: stock SGLang serves the tiny model on CPU.

Builds the tiny random Llama, starts ``python -m sglang.launch_server`` with the
CPU flags from ``support.server`` (``serve``), asks ``/generate`` for a few
greedy tokens, and checks that stopping the server leaves no process behind.
"""

from __future__ import annotations

import time

import psutil
from support.server import generate, serve
from support.tiny_model import build_tiny_llama


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_tiny_model_tokenizer_roundtrip(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    model_dir = build_tiny_llama(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = AutoConfig.from_pretrained(model_dir)
    assert len(tok) == cfg.vocab_size
    assert tok.bos_token_id == cfg.bos_token_id
    assert tok.eos_token_id == cfg.eos_token_id
    ids = tok("The quick brown fox").input_ids
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == "The quick brown fox"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|assistant|>\n")


def test_stock_sglang_serves_tiny_model_on_cpu(tmp_path, record_property):
    """Stock SGLang with eagle_gate installed but not enabled: it serves, and
    the gate does nothing (no status, no log line; on 0.5.23 SGLang does load
    our ``sglang.srt.plugins`` entry point, which must stay inert)."""
    model_dir = build_tiny_llama(tmp_path / "tiny")
    log_path = tmp_path / "server.log"
    status_dir = tmp_path / "gate-status"
    env = {"EAGLE_GATE_STATUS_DIR": str(status_dir)}

    # plugins=None: SGLang's entry-point plugins load (the gate's must be inert)
    with serve(model_dir, log_path, env=env, plugins=None) as srv:
        record_property("startup_s", round(srv.startup_s, 1))
        print(f"server healthy after {srv.startup_s:.1f}s")
        tree = [srv.pid] + [
            c.pid for c in psutil.Process(srv.pid).children(recursive=True)
        ]
        assert len(tree) >= 2, "expected SGLang to spawn scheduler/detokenizer"

        out = generate(srv.base_url, "The quick brown fox", max_new_tokens=8)
        ids = out["output_ids"]
        assert len(ids) == 8, out
        assert out["meta_info"]["completion_tokens"] == 8
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert all(0 <= i < 1000 for i in ids)
        assert isinstance(out["text"], str)

        # Greedy decoding is deterministic, and the second call hits the cache.
        again = generate(srv.base_url, "The quick brown fox", max_new_tokens=8)
        assert again["output_ids"] == ids
        t_stop = time.monotonic()

    print(f"server stopped in {time.monotonic() - t_stop:.1f}s")
    for pid in tree:
        assert not _alive(pid), f"process {pid} survived"
    log = log_path.read_text(errors="replace")
    assert "fired up" in log
    assert "eagle_gate active" not in log and "eagle_gate plugin loaded" not in log
    assert not status_dir.exists()
