"""The plain step's DECODE CUDA graphs (docs/plain-graphs.md; test plan T1,
§7 of docs/design/2026-12-plain-graphs.md): what runs without a GPU.
Selection, the attribute swap, the setting, the reasons graphs stay off, the
build with fake adapters (memory, refusals, cleanup),
status and metrics, the graph and eager paths binding the right attribute per
version, the runner subclasses' pinned attributes on the installed SGLang,
and the TP agreement over two real gloo processes. Nothing here captures a
CUDA graph."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
import sglang_env
import torch
from support.two_ranks import run_ranks

from eagle_gate import launch
from eagle_gate.adapters import sglang_0_5_9, sglang_0_5_23
from eagle_gate.adapters.activation import ProcessInfo, activate
from eagle_gate.adapters.plain.capture import (
    build_plain_graphs,
    plain_graph_blockers,
    plain_graphs_for_scheduler,
)
from eagle_gate.adapters.plain.graphs import (
    PlainGraphs,
    draft_extend_path,
    plain_target_forward,
    select_plain_path,
)
from eagle_gate.adapters.plain.tensors import swap_attrs
from eagle_gate.adapters.refusals import GateRefused
from eagle_gate.config import ConfigError, GateConfig, resolve_config
from eagle_gate.counters import PLAIN_EAGER_REASONS
from eagle_gate.options import option
from eagle_gate.policy import Mode
from eagle_gate.runtime import GateRuntime


def captured(capture_bs=(1, 2, 4, 8), *, disable_padding=False) -> PlainGraphs:
    return PlainGraphs(
        state="captured",
        runner=object(),
        backend=object(),
        capture_bs=tuple(capture_bs),
        max_bs=max(capture_bs),
        disable_padding=disable_padding,
    )


# -- selection ------------------------------------------------------------------
@pytest.mark.parametrize(
    "graphs, bs, expected",
    [
        (None, 1, ("eager", "graphs_off")),
        (PlainGraphs(), 1, ("eager", "graphs_off")),
        (PlainGraphs(state="failed", reason="x"), 1, ("eager", "graphs_off")),
        (PlainGraphs(state="captured", max_bs=8), 1, ("eager", "graphs_off")),
        (captured(), 1, ("graph", None)),
        (captured(), 3, ("graph", None)),  # padded to 4
        (captured(), 8, ("graph", None)),  # bs == max_bs
        (captured(), 9, ("eager", "bs_above_max")),
        (captured(disable_padding=True), 4, ("graph", None)),
        (captured(disable_padding=True), 3, ("eager", "bs_not_captured")),
        (captured(disable_padding=True), 9, ("eager", "bs_above_max")),
    ],
)
def test_select_plain_path(graphs, bs, expected):
    assert select_plain_path(graphs, bs) == expected


def test_every_selection_reason_is_a_counted_reason():
    assert {"graphs_off", "bs_above_max", "bs_not_captured", "declined"} == set(
        PLAIN_EAGER_REASONS
    )


# -- swap_attrs -----------------------------------------------------------------
def test_swap_attrs_sets_and_restores_even_on_exceptions():
    obj = SimpleNamespace(a=1, b="x")
    with pytest.raises(RuntimeError), swap_attrs(obj, a=2, c=3):
        assert (obj.a, obj.b, obj.c) == (2, "x", 3)
        raise RuntimeError("boom")
    assert (obj.a, obj.b) == (1, "x") and not hasattr(obj, "c")
    with swap_attrs(obj, a=5), swap_attrs(obj, a=6):
        assert obj.a == 6
    assert obj.a == 1


# -- the setting ----------------------------------------------------------------
def test_setting_precedence_cli_env_file(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text('policy = "never"\nplain_graphs = "off"\n')
    env = {"EAGLE_GATE_CONFIG": str(path)}
    assert resolve_config(environ={}).plain_graphs == "auto"
    assert resolve_config(environ=env).plain_graphs == "off"
    env["EAGLE_GATE_PLAIN_GRAPHS"] = "on"
    assert resolve_config(environ=env).plain_graphs == "on"
    got = resolve_config(cli_plain_graphs="auto", environ=env)
    assert got.plain_graphs == "auto"
    assert GateConfig.from_json(got.to_json()) == got
    assert GateConfig.from_json('{"policy": "never"}').plain_graphs == "auto"


@pytest.mark.parametrize("value", ["yes", "ON", "cuda"])
def test_bad_values_are_refused(value):
    with pytest.raises(ConfigError, match="plain_graphs: value"):
        resolve_config(cli_plain_graphs=value, environ={})
    with pytest.raises(ConfigError, match="plain_graphs"):
        GateConfig.from_json(json.dumps({"policy": "never", "plain_graphs": value}))


def test_on_with_the_plain_step_off_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="plain_graphs: 'on' needs the plain step"):
        resolve_config(cli_plain_graphs="on", cli_plain_step="off", environ={})
    path = tmp_path / "g.toml"
    path.write_text('plain_graphs = "on"\nplain_step = false\n')
    with pytest.raises(ConfigError, match="needs the plain step"):
        resolve_config(environ={"EAGLE_GATE_CONFIG": str(path)})
    # auto and off are fine without the plain step (nothing to capture)
    for value in ("auto", "off"):
        resolve_config(cli_plain_graphs=value, cli_plain_step="off", environ={})


def test_launcher_flag_and_doctor_field():
    parser = argparse.ArgumentParser()
    launch.add_gate_arguments(parser)
    args, _ = parser.parse_known_args(["--gate-plain-graphs", "off"])
    assert args.gate_plain_graphs == "off"
    plain_graphs = option("plain_graphs")  # doctor's row comes from this table
    assert (plain_graphs.dest, plain_graphs.env) == (
        "gate_plain_graphs",
        "EAGLE_GATE_PLAIN_GRAPHS",
    )


# -- where graphs stay off ------------------------------------------------------
def cuda_runner(**extra):
    return SimpleNamespace(device="cuda", **extra)


SERVER = SimpleNamespace(enable_lora=False)


def test_device_not_cuda_comes_first_whatever_the_setting():
    for setting in ("auto", "on", "off"):
        config = GateConfig("never", plain_graphs=setting, plain_step=setting != "on")
        mr = SimpleNamespace(device="cpu")
        assert plain_graph_blockers(mr, SERVER, config) == "device_not_cuda"
    assert (
        plain_graph_blockers(None, SimpleNamespace(device="cpu"), GateConfig("never"))
        == "device_not_cuda"
    )


@pytest.mark.parametrize(
    "config, server, version, expected",
    [
        (GateConfig("never", plain_graphs="off"), {}, None, "setting_off"),
        (GateConfig("never", plain_step=False), {}, None, "plain_step_off"),
        (GateConfig("never"), {"enable_lora": True}, None, "lora"),
        (
            GateConfig("never"),
            {"enable_two_batch_overlap": True},
            None,
            "two_batch_overlap",
        ),
        (GateConfig("never"), {"enable_pdmux": True}, None, "pdmux"),
        (GateConfig("never"), {}, "cuda_graph_disabled", "cuda_graph_disabled"),
        (GateConfig("never"), {}, None, None),
    ],
)
def test_blocker_reasons(config, server, version, expected):
    got = plain_graph_blockers(
        cuda_runner(), SimpleNamespace(**server), config, lambda mr, sa: version
    )
    assert got == expected


def test_no_model_runner_means_no_target_graphs():
    server = SimpleNamespace(device="cuda")
    assert plain_graph_blockers(None, server, GateConfig("never")) == "no_target_graphs"


# -- building (fake adapters) -----------------------------------------------------
class FakeAdapter:
    GRAPH_ATTR = "graph_runner"

    def __init__(self, *, fail=None, blocker=None, verify_mib=100.0):
        self.fail, self.blocker, self.verify_mib = fail, blocker, verify_mib
        self.built: list[str] = []

    def version_blockers(self, mr, server_args):
        return self.blocker

    def verify_graph_mib(self, mr):
        return self.verify_mib

    def build_plain_backend(self, mr):
        self.built.append("backend")
        return SimpleNamespace(kind="plain backend")

    def build_plain_runner(self, mr, backend):
        self.built.append("runner")
        if self.fail:
            raise RuntimeError(self.fail)
        return SimpleNamespace(capture_bs=[1, 2, 4, 8], max_bs=8, disable_padding=False)


def fake_scheduler(device="cuda"):
    mr = SimpleNamespace(
        device=device,
        graph_runner=SimpleNamespace(max_bs=8),
        model_config=SimpleNamespace(context_len=1024),
    )
    return SimpleNamespace(
        server_args=SimpleNamespace(device=device),
        draft_worker=SimpleNamespace(target_worker=SimpleNamespace(model_runner=mr)),
    )


def readings(*values):
    it = iter(values)
    return lambda mr: next(it)


def test_cpu_servers_are_off_with_device_not_cuda_and_on_is_refused():
    graphs = build_plain_graphs(FakeAdapter(), fake_scheduler("cpu"), GateConfig("x"))
    assert (graphs.state, graphs.reason, graphs.runner) == (
        "off",
        "device_not_cuda",
        None,
    )
    with pytest.raises(GateRefused, match="device_not_cuda"):
        build_plain_graphs(
            FakeAdapter(), fake_scheduler("cpu"), GateConfig("x", plain_graphs="on")
        )


def test_capture_measures_memory_and_reports_it(caplog):
    adapter = FakeAdapter()
    caplog.set_level("INFO", logger="eagle_gate")
    graphs = build_plain_graphs(
        adapter,
        fake_scheduler(),
        GateConfig("x"),
        memory_mib=readings(10_000.0, 10_000.0, 9_800.0, 9_500.0),
    )
    assert graphs.state == "captured" and graphs.reason is None
    assert (graphs.backend_mib, graphs.graphs_mib, graphs.total_mib) == (
        200.0,
        300.0,
        500.0,
    )
    assert graphs.capture_bs == (1, 2, 4, 8) and graphs.max_bs == 8
    assert graphs.attention_backend == "SimpleNamespace"
    status = graphs.status()
    assert status["memory_mib"] == 500.0 and status["capture_bs"] == [1, 2, 4, 8]
    assert adapter.built == ["backend", "runner"]
    assert "plain decode CUDA graphs on TP rank 0: 4 sizes (1..8), 500.0 MiB" in (
        caplog.text
    )


def test_too_little_headroom_leaves_graphs_off():
    graphs = build_plain_graphs(
        FakeAdapter(verify_mib=1000.0),
        fake_scheduler(),
        GateConfig("x"),
        memory_mib=readings(1000.0),
    )
    assert (graphs.state, graphs.reason) == ("off", "headroom")


def test_a_failed_capture_goes_eager_in_auto_and_refuses_in_on():
    adapter = FakeAdapter(fail="out of memory")
    graphs = build_plain_graphs(
        adapter,
        fake_scheduler(),
        GateConfig("x"),
        memory_mib=readings(10_000.0, 10_000.0, 9_800.0, 9_900.0),
    )
    assert graphs.state == "failed" and graphs.reason.startswith("capture_failed")
    assert "out of memory" in graphs.reason
    assert graphs.runner is None and graphs.backend is None and graphs.capture_bs == ()
    with pytest.raises(GateRefused, match="out of memory"):
        build_plain_graphs(
            FakeAdapter(fail="out of memory"),
            fake_scheduler(),
            GateConfig("x", plain_graphs="on"),
            memory_mib=readings(10_000.0, 10_000.0, 9_800.0),
        )


def test_tp_ranks_agree_twice_and_disagreement_drops_the_graphs():
    calls = []

    def agree(ok):
        calls.append(ok)
        return len(calls) == 1  # the other rank fails after capture

    graphs = build_plain_graphs(
        FakeAdapter(),
        fake_scheduler(),
        GateConfig("x"),
        tp_size=2,
        agree=agree,
        memory_mib=readings(10_000.0, 10_000.0, 9_800.0, 9_500.0, 9_900.0),
    )
    assert calls == [True, True]
    assert (graphs.state, graphs.reason, graphs.runner) == (
        "failed",
        "tp_disagreement",
        None,
    )
    calls.clear()
    off = build_plain_graphs(
        FakeAdapter(blocker="lora"),
        fake_scheduler(),
        GateConfig("x"),
        tp_size=2,
        agree=agree,
    )
    assert calls == [False, False] and off.reason == "lora"  # still two calls


def test_setup_errors_never_break_auto_and_refuse_on():
    class Broken(FakeAdapter):
        def version_blockers(self, mr, server_args):
            raise ValueError("odd build")

    sched = fake_scheduler()
    graphs = plain_graphs_for_scheduler(
        Broken(), sched, GateConfig("x"), gated=True, tp_rank=0, tp_size=1
    )
    assert graphs.state == "failed" and "odd build" in graphs.reason
    with pytest.raises(GateRefused, match="odd build"):
        plain_graphs_for_scheduler(
            Broken(),
            sched,
            GateConfig("x", plain_graphs="on"),
            gated=True,
            tp_rank=0,
            tp_size=1,
        )
    off = plain_graphs_for_scheduler(
        Broken(),
        fake_scheduler("cpu"),
        GateConfig("x"),
        gated=False,
        tp_rank=0,
        tp_size=1,
    )
    assert (off.state, off.reason) == ("off", "device_not_cuda")


def test_a_gated_cpu_scheduler_is_eager_in_auto_and_refused_in_on():
    graphs = plain_graphs_for_scheduler(
        FakeAdapter(),
        fake_scheduler("cpu"),
        GateConfig("x"),
        gated=True,
        tp_rank=0,
        tp_size=1,
    )
    assert (graphs.state, graphs.reason) == ("off", "device_not_cuda")
    with pytest.raises(GateRefused, match="on TP rank 0: device_not_cuda"):
        plain_graphs_for_scheduler(
            FakeAdapter(),
            fake_scheduler("cpu"),
            GateConfig("x", plain_graphs="on"),
            gated=True,
            tp_rank=0,
            tp_size=1,
        )


# -- status and metrics ---------------------------------------------------------
class Never:
    name = "never"

    def decide(self, view):
        return Mode.PLAIN

    def observe(self, outcome):
        pass


def test_status_has_the_plain_graph_fields_from_the_start():
    rt = GateRuntime(GateConfig("never"), Never(), sglang_version="t", adapter="t")
    status = rt.status()
    assert status["plain_graphs"]["state"] == "off"
    assert status["plain_graphs"]["setting"] == "auto"
    assert status["plain_path"] == {"graph": 0, "eager": 0}
    assert status["plain_eager_reasons"] == dict.fromkeys(PLAIN_EAGER_REASONS, 0)
    assert status["draft_extend_path"] == {"graph": 0, "eager": 0}
    rt.counters.count_plain_path("graph")
    rt.counters.count_plain_path("eager", "bs_above_max")
    rt.counters.count_draft_extend("eager")
    rt.counters.count_draft_extend("eager")
    rt.counters.count_draft_extend("graph")
    status = rt.status()
    assert status["plain_path"] == {"graph": 1, "eager": 1}
    assert status["plain_eager_reasons"]["bs_above_max"] == 1
    assert status["draft_extend_path"] == {"graph": 1, "eager": 2}
    json.dumps(status, allow_nan=False)  # what the status file takes


def test_activation_links_the_graphs_to_the_runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE_GATE_METRICS", "0")
    graphs = PlainGraphs(setting="auto", reason="device_not_cuda")
    rt = activate(
        ProcessInfo(
            adapter_name="t",
            sglang_version="t",
            tp_rank=0,
            tp_size=1,
            dp_rank=None,
            num_draft_tokens=4,
            speculative_algorithm="EAGLE",
        ),
        gated=True,
        state="gated",
        config=GateConfig("never", status_dir=str(tmp_path / "s")),
        plain_graphs=graphs,
    )
    try:
        assert rt.status()["plain_graphs"]["reason"] == "device_not_cuda"
        graphs.count("eager", "graphs_off")
        assert rt.status()["plain_path"]["eager"] == 1
        assert rt.status()["plain_eager_reasons"]["graphs_off"] == 1
        graphs.count_draft_extend("eager")
        assert rt.status()["draft_extend_path"] == {"graph": 0, "eager": 1}
    finally:
        from eagle_gate.adapters.hooks import ACTIVE

        if ACTIVE.ops is not None:
            ACTIVE.ops.stop()
        ACTIVE.ops = ACTIVE.runtime = ACTIVE.gate = None


def test_metrics_export_path_counts_and_memory():
    from eagle_gate.metrics import METRICS, GateMetrics

    assert METRICS["eagle_gate_plain_steps_total"][:2] == ("counter", ("path",))
    assert METRICS["eagle_gate_plain_eager_total"][:2] == ("counter", ("reason",))
    assert METRICS["eagle_gate_plain_graph_memory_mib"][:2] == ("gauge", ())
    assert METRICS["eagle_gate_plain_draft_extend_total"][:2] == (
        "counter",
        ("path",),
    )
    assert METRICS["eagle_gate_plain_graphs_captured"][:2] == ("gauge", ())
    rt = GateRuntime(GateConfig("never"), Never(), sglang_version="t", adapter="t")
    m = GateMetrics(rt, dp_rank=None, gated=True)
    # created up front, at 0
    assert m.plain_paths["graph"]._value.get() == 0
    assert set(m.plain_eager) == set(PLAIN_EAGER_REASONS)
    assert set(m.plain_draft_extend) == {"graph", "eager"}
    assert m.plain_draft_extend["eager"]._value.get() == 0
    assert m.plain_graphs_captured._value.get() == 0
    for _ in range(3):
        rt.counters.count_plain_path("graph")
    rt.counters.count_plain_path("eager", "declined")
    for _ in range(2):
        rt.counters.count_draft_extend("graph")
    rt.counters.count_draft_extend("eager")
    rt.plain_graphs["memory_mib"] = 412.5
    rt.plain_graphs["state"] = "captured"
    m.export(rt)
    m.export(rt)  # deltas: nothing counted twice
    assert m.plain_paths["graph"]._value.get() == 3
    assert m.plain_paths["eager"]._value.get() == 1
    assert m.plain_eager["declined"]._value.get() == 1
    assert m.plain_graph_mib._value.get() == 412.5
    assert m.plain_draft_extend["graph"]._value.get() == 2
    assert m.plain_draft_extend["eager"]._value.get() == 1
    assert m.plain_graphs_captured._value.get() == 1
    rt.counters.count_draft_extend("eager")
    rt.plain_graphs["state"] = "failed"
    m.export(rt)
    assert m.plain_draft_extend["eager"]._value.get() == 2
    assert m.plain_draft_extend["graph"]._value.get() == 2
    assert m.plain_graphs_captured._value.get() == 0


# -- the draft side: which path SGLang's draft extend takes (§5.7) -------------------
def dext_runner(capture_bs=(1, 2, 4, 8), *, disable_padding=False, mlp_sync=False):
    """The fields both versions' EAGLEDraftExtendCudaGraphRunner have and
    their can-run checks read on a server without DP attention."""
    return SimpleNamespace(
        capture_bs=list(capture_bs),
        max_bs=max(capture_bs),
        disable_padding=disable_padding,
        require_mlp_tp_gather=False,
        require_mlp_sync=mlp_sync,
    )


class Unreadable:
    """A runner whose fields raise when read (a changed SGLang, say)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)  # what pytest and repr look for
        raise RuntimeError(f"no {name}")


@pytest.mark.parametrize(
    "runner, bs, sync_ok, expected",
    [
        (None, 1, True, "eager"),  # no draft-extend graph (CPU, Triton-less 0.5.9)
        (dext_runner(), 1, True, "graph"),
        (dext_runner(), 3, True, "graph"),  # padded to 4
        (dext_runner(), 8, True, "graph"),  # bs == max_bs
        (dext_runner(), 9, True, "eager"),
        (dext_runner(disable_padding=True), 4, True, "graph"),
        (dext_runner(disable_padding=True), 3, True, "eager"),  # not captured
        (dext_runner(disable_padding=True), 9, True, "eager"),
        (dext_runner(mlp_sync=True), 2, True, "graph"),
        (dext_runner(mlp_sync=True), 2, False, "eager"),
        (dext_runner(mlp_sync=True), 9, True, "eager"),
        # anything unreadable counts as eager, without raising
        (object(), 1, True, "eager"),
        (SimpleNamespace(disable_padding=False), 1, True, "eager"),
        (SimpleNamespace(disable_padding=False, max_bs=None), 1, True, "eager"),
        (Unreadable(), 1, True, "eager"),
    ],
)
def test_draft_extend_path_prediction(runner, bs, sync_ok, expected):
    assert draft_extend_path(runner, bs, mlp_sync_ok=sync_ok) == expected


#: per version: (the batch's flag SGLang reads with MLP sync, the runner's
#: width field or None where the version does not check one).
DEXT_LAYOUT = {
    sglang_0_5_9: ("can_run_dp_cuda_graph", None),
    sglang_0_5_23: ("can_run_decode_cuda_graph", "captured_req_width"),
}


def dext_worker(runner, width=4):
    return SimpleNamespace(
        draft_worker=SimpleNamespace(
            cuda_graph_runner_for_draft_extend=runner,
            speculative_num_draft_tokens=width,
        )
    )


def dext_batch(bs, **flags):
    return SimpleNamespace(seq_lens=torch.zeros(bs, dtype=torch.int64), **flags)


@pytest.mark.parametrize("adapter", [sglang_0_5_9, sglang_0_5_23])
def test_each_version_reads_its_own_layout(adapter):
    flag, width_field = DEXT_LAYOUT[adapter]
    other_flag = next(f for f, _ in DEXT_LAYOUT.values() if f != flag)

    def runner(**kw):
        r = dext_runner(**kw)
        if width_field is not None:
            setattr(r, width_field, 4)
        return r

    path = adapter.plain.draft_extend_path_of
    assert path(dext_worker(None), dext_batch(2)) == "eager"
    assert path(dext_worker(runner()), dext_batch(2)) == "graph"
    assert path(dext_worker(runner()), dext_batch(8)) == "graph"
    assert path(dext_worker(runner()), dext_batch(9)) == "eager"
    padded = runner(disable_padding=True)
    assert path(dext_worker(padded), dext_batch(4)) == "graph"
    assert path(dext_worker(padded), dext_batch(5)) == "eager"
    # with MLP sync, the version's own flag on the batch decides
    synced = runner(mlp_sync=True)
    assert path(dext_worker(synced), dext_batch(2, **{flag: True})) == "graph"
    assert path(dext_worker(synced), dext_batch(2, **{flag: False})) == "eager"
    assert path(dext_worker(synced), dext_batch(2, **{other_flag: True})) == "eager"
    if width_field is not None:
        # 0.5.23 refuses a width other than the capture's
        assert path(dext_worker(runner(), width=3), dext_batch(2)) == "eager"
    else:
        # 0.5.9 checks no width (its runner has no such field)
        assert path(dext_worker(runner(), width=3), dext_batch(2)) == "graph"
    # nothing it cannot read raises
    assert path(SimpleNamespace(), dext_batch(2)) == "eager"
    assert path(dext_worker(runner()), SimpleNamespace()) == "eager"
    assert path(dext_worker(Unreadable()), dext_batch(2)) == "eager"


def test_the_prediction_agrees_with_sglangs_own_check():
    """The installed SGLang's real ``can_run`` (0.5.9) / ``can_run_graph``
    (0.5.23) of EAGLEDraftExtendCudaGraphRunner, on a runner object built
    without its constructor (which would capture) and with the fields the
    constructor sets, against the adapter's prediction: every batch size
    around the captured ones, with and without padding and MLP sync."""
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
        EAGLEDraftExtendCudaGraphRunner as Runner,
    )

    adapter = sglang_env.adapter()
    flag, width_field = DEXT_LAYOUT[adapter]
    capture_bs = [1, 2, 4, 8, 12]
    compared = 0
    for disable_padding in (False, True):
        for mlp_sync in (False, True):
            runner = Runner.__new__(Runner)
            for name, value in vars(
                dext_runner(
                    capture_bs, disable_padding=disable_padding, mlp_sync=mlp_sync
                )
            ).items():
                setattr(runner, name, value)
            if adapter is sglang_0_5_9:
                runner.graphs = {bs: object() for bs in capture_bs}
                can_run = runner.can_run
            else:
                from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import (  # noqa: E501
                    FullCudaGraphBackend,
                )

                backend = FullCudaGraphBackend.__new__(FullCudaGraphBackend)
                backend._graphs = {
                    runner._make_graph_key(b): object() for b in capture_bs
                }
                runner.backend = backend
                runner.captured_req_width = 4
                can_run = runner.can_run_graph
            worker = dext_worker(runner, width=4)
            for bs in range(1, 15):
                for sync_ok in (False, True):
                    batch = dext_batch(bs, **{flag: sync_ok})
                    # what SGLang's forward batch carries: the same count and
                    # flag; 0.5.23 also the extend's width (num_draft_tokens)
                    forward_batch = dext_batch(
                        bs,
                        **{flag: sync_ok},
                        spec_info=SimpleNamespace(num_tokens_per_req=4),
                    )
                    sglang_says = "graph" if can_run(forward_batch) else "eager"
                    assert (
                        adapter.plain.draft_extend_path_of(worker, batch) == sglang_says
                    ), (
                        disable_padding,
                        mlp_sync,
                        bs,
                        sync_ok,
                    )
                    compared += 1
    assert compared == 2 * 2 * 14 * 2


def fake_draft_worker(runner, extend):
    """What the adapters' ``_draft_extend`` touches on EAGLEWorkerV2's draft
    worker (both versions' layouts)."""
    import contextlib

    return SimpleNamespace(
        cuda_graph_runner_for_draft_extend=runner,
        speculative_num_draft_tokens=4,
        draft_runner=SimpleNamespace(tp_group=None),
        parallel_layout=None,
        draft_tp_context=lambda group: contextlib.nullcontext(),
        _draft_extend_for_decode=extend,
    )


def test_the_adapters_draft_extend_counts_the_path_it_takes(monkeypatch):
    """The installed version's ``_draft_extend`` (eager sync) and the lazy
    catch-up's draft extend (through ``make_plain_step``) count the predicted
    path once the extend returned; a failing extend is not counted; without
    plain graphs nothing is counted."""
    import contextlib

    from sglang.srt.speculative import eagle_worker_v2 as ew

    adapter = sglang_env.adapter()
    for name in (
        "speculative_moe_backend_context",
        "speculative_moe_a2a_backend_context",
        "draft_tp_context",
    ):
        monkeypatch.setattr(
            ew, name, lambda *a, **k: contextlib.nullcontext(), raising=False
        )
    ran = []
    runner = dext_runner()
    runner.captured_req_width = 4
    worker = SimpleNamespace(
        draft_worker=fake_draft_worker(runner, lambda b, r: ran.append(r))
    )
    graphs = PlainGraphs()
    counted = []
    graphs.on_draft_extend = counted.append
    adapter.plain._draft_extend(worker, dext_batch(4), "r1", graphs)
    adapter.plain._draft_extend(worker, dext_batch(9), "r2", graphs)
    adapter.plain._draft_extend(worker, dext_batch(2), "r3")  # no graphs: not counted
    assert ran == ["r1", "r2", "r3"]
    assert counted == ["graph", "eager"]
    lazy = adapter.plain.make_plain_step("lazy", graphs=graphs)
    lazy._draft_extend(worker, dext_batch(2), "r4")
    assert counted == ["graph", "eager", "graph"]

    def boom(batch, result):
        raise RuntimeError("draft extend failed")

    worker.draft_worker._draft_extend_for_decode = boom
    with pytest.raises(RuntimeError):
        adapter.plain._draft_extend(worker, dext_batch(2), "r5", graphs)
    assert counted == ["graph", "eager", "graph"]


# -- the graph path and the eager path, per version --------------------------------
@pytest.mark.parametrize("adapter", [sglang_0_5_9, sglang_0_5_23])
def test_graph_and_eager_paths_bind_the_right_attribute(adapter):
    attr = adapter.graphs.GRAPH_ATTR
    assert (
        attr
        == {sglang_0_5_9: "graph_runner", sglang_0_5_23: "decode_cuda_graph_runner"}[
            adapter
        ]
    )
    verify_runner, verify_backend = object(), object()
    mr = SimpleNamespace(attn_backend=verify_backend, **{attr: verify_runner})
    graphs = captured()
    counted = []
    graphs.on_path = lambda path, reason: counted.append((path, reason))
    seen = []

    def forward(ran):
        seen.append((mr.attn_backend, getattr(mr, attr)))
        return SimpleNamespace(can_run_cuda_graph=ran)

    out, ran = plain_target_forward(mr, attr, graphs, 4, lambda: forward(True))
    assert ran and seen[-1] == (graphs.backend, graphs.runner)
    out, ran = plain_target_forward(mr, attr, graphs, 9, lambda: forward(False))
    assert not ran and seen[-1] == (verify_backend, None)  # today's eager path
    out, ran = plain_target_forward(mr, attr, graphs, 2, lambda: forward(False))
    assert not ran and seen[-1] == (graphs.backend, graphs.runner)
    out, ran = plain_target_forward(mr, attr, None, 2, lambda: forward(False))
    assert seen[-1] == (verify_backend, None)
    assert counted == [
        ("graph", None),
        ("eager", "bs_above_max"),
        ("eager", "declined"),
    ]
    assert (mr.attn_backend, getattr(mr, attr)) == (verify_backend, verify_runner)

    def boom():
        raise RuntimeError("forward failed")

    with pytest.raises(RuntimeError):
        plain_target_forward(mr, attr, graphs, 1, boom)
    assert (mr.attn_backend, getattr(mr, attr)) == (verify_backend, verify_runner)
    assert len(counted) == 3  # a failed step is not counted


@pytest.mark.parametrize("adapter", [sglang_0_5_9, sglang_0_5_23])
def test_adapters_have_the_plain_graph_hooks(adapter):
    for name in (
        "GRAPH_ATTR",
        "version_blockers",
        "verify_graph_mib",
        "build_plain_backend",
        "build_plain_runner",
        "_plain_runner_cls",
    ):
        assert hasattr(adapter.graphs, name), name
    dotted = {t.dotted for t in adapter.TARGETS}
    assert any("_get_attention_backend" in d for d in dotted)
    assert any(d.endswith("__init__") and "CudaGraphRunner" in d for d in dotted)


# -- the runner subclass on the installed SGLang --------------------------------------
def test_runner_subclass_pins_decode_width_one_and_last():
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )

    adapter = sglang_env.adapter()
    cls = adapter.graphs._plain_runner_cls()
    assert adapter.graphs._plain_runner_cls() is cls  # built once
    runner = cls.__new__(cls)  # no constructor: it would capture
    assert runner.capture_forward_mode == ForwardMode.DECODE
    runner.capture_forward_mode = ForwardMode.TARGET_VERIFY
    assert runner.capture_forward_mode == ForwardMode.DECODE
    runner.capture_hidden_mode = CaptureHiddenMode.NULL
    assert runner.capture_hidden_mode == CaptureHiddenMode.LAST
    runner.capture_hidden_mode = CaptureHiddenMode.FULL
    assert runner.capture_hidden_mode == CaptureHiddenMode.FULL
    assert runner.get_spec_info(7) is None
    if adapter is sglang_0_5_9:
        runner.num_tokens_per_bs = 4
        assert runner.num_tokens_per_bs == 1
        assert runner.recapture_if_needed(SimpleNamespace()) is None


def test_version_blockers_on_the_installed_sglang():
    adapter = sglang_env.adapter()
    server = SimpleNamespace(disable_cuda_graph=False)
    mr = SimpleNamespace(**{adapter.graphs.GRAPH_ATTR: None})
    assert adapter.graphs.version_blockers(mr, server) == "no_target_graphs"
    assert (
        adapter.graphs.version_blockers(mr, SimpleNamespace(disable_cuda_graph=True))
        == "cuda_graph_disabled"
    )


# -- TP agreement over two real gloo processes -------------------------------------
TWO_RANKS = r"""
import datetime, json, sys
from types import SimpleNamespace
import torch.distributed as dist
from eagle_gate.adapters.plain.capture import build_plain_graphs
from eagle_gate.config import GateConfig

rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
group = dist.new_group([0, 1], backend="gloo")

class Adapter:
    GRAPH_ATTR = "graph_runner"
    built = 0
    def version_blockers(self, mr, sa): return None
    def verify_graph_mib(self, mr): return 100.0
    def build_plain_backend(self, mr):
        Adapter.built += 1
        return object()
    def build_plain_runner(self, mr, backend):
        return SimpleNamespace(capture_bs=[1, 2], max_bs=2)

mr = SimpleNamespace(device="cuda", graph_runner=SimpleNamespace(max_bs=2),
                     model_config=SimpleNamespace(context_len=64))
sched = SimpleNamespace(server_args=SimpleNamespace(),
    draft_worker=SimpleNamespace(target_worker=SimpleNamespace(model_runner=mr)))
free = 10_000.0 if rank == 0 else 1.0   # rank 1 lacks headroom
graphs = build_plain_graphs(Adapter(), sched, GateConfig("never"), tp_rank=rank,
                            tp_size=2, control_group=group,
                            memory_mib=lambda mr: free)
print(json.dumps({"rank": rank, "state": graphs.state, "reason": graphs.reason,
                  "built": Adapter.built}))
# both ranks reach the teardown together: gloo aborts a process ("terminate
# called without an active exception") whose peer tears down mid-exchange
dist.barrier()
dist.destroy_process_group()
"""


def test_tp_ranks_where_one_says_no_both_go_eager(tmp_path):
    reports = run_ranks(tmp_path, TWO_RANKS, timeout_s=120)
    assert reports == [
        {"rank": 0, "state": "off", "reason": "tp_disagreement", "built": 0},
        {"rank": 1, "state": "off", "reason": "headroom", "built": 0},
    ]
