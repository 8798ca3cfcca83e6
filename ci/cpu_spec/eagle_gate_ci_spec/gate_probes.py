"""The two test switches that reach into the gate, through its test hooks
(:mod:`eagle_gate.adapters.plain.testing`), never by rebinding its functions:

* ``EAGLE_GATE_CI_PLAIN_GRAPHS=construct``: an ``on_plain_graphs`` callback
  that, where the gate decided its plain-step CUDA graphs are off on CPU
  (``device_not_cuda``), builds the real plain attention backend and DECODE
  runner with ``capture()`` a no-op and records the checks in the graphs'
  ``report`` (the plain-graphs design record, T2);
* ``EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE=PATH``: a ``wrap_plain_step``
  wrapper that scales each plain step's temperatures by the number in PATH
  while PATH exists (a deliberate fault for the sampling distribution test).

Both are registered when the gate imports its ``testing`` module (a
post-import hook), before the gate builds anything.
"""

from __future__ import annotations

from eagle_gate_ci_spec.core import (
    PLAIN_GRAPHS,
    PLAIN_TEMPERATURE_FILE,
    _applied,
    _count,
    sglang_version,
)


def construct_plain_graphs(graphs, *, version, scheduler, config, gated) -> None:
    """``on_plain_graphs`` callback of EAGLE_GATE_CI_PLAIN_GRAPHS=construct
    (see the package doc): the gate's plain graphs stay as decided (eager)."""
    if gated and graphs.reason == "device_not_cuda":
        try:
            graphs.report = _construct_plain_graphs(version, scheduler)
        except Exception as exc:  # the test reads it from the status
            graphs.report = {"error": repr(exc)}
        _count("plain_graphs(construct)")


def scale_plain_temperature(original):
    """``wrap_plain_step`` wrapper of EAGLE_GATE_CI_PLAIN_TEMPERATURE_FILE (see
    the package doc): while the file exists, the plain step samples with its
    batch's temperatures times the file's number, restored after the step."""
    path = PLAIN_TEMPERATURE_FILE

    def plain_step(parts, worker, batch, *args, **kwargs):
        try:
            with open(path) as f:
                scale = float(f.read())
        except FileNotFoundError:
            return original(parts, worker, batch, *args, **kwargs)
        info = batch.sampling_info
        temperatures = info.temperatures
        info.temperatures = temperatures * scale
        _count("plain_step(temperature scaled)")
        try:
            return original(parts, worker, batch, *args, **kwargs)
        finally:
            info.temperatures = temperatures

    plain_step.__wrapped__ = original
    return plain_step


def _register(testing) -> None:
    """Post-import hook of ``eagle_gate.adapters.plain.testing``."""
    if PLAIN_GRAPHS == "construct":
        testing.on_plain_graphs(construct_plain_graphs)
        _applied("eagle_gate plain graphs: construct without capture")
    if PLAIN_TEMPERATURE_FILE:
        testing.wrap_plain_step(scale_plain_temperature)
        _applied(
            "eagle_gate plain step: temperature scaled while the switch file exists"
        )


def hooks() -> dict:
    """The post-import hooks of the switches that are on (none: empty)."""
    if PLAIN_GRAPHS == "construct" or PLAIN_TEMPERATURE_FILE:
        return {"eagle_gate.adapters.plain.testing": _register}
    return {}


def _count_calls(obj, name: str, counts: dict, key: str) -> None:
    """Count calls of ``obj.name`` (an instance attribute shadowing the method)."""
    method = getattr(obj, name)

    def counted(*args, **kwargs):
        counts[key] = counts.get(key, 0) + 1
        return method(*args, **kwargs)

    setattr(obj, name, counted)


def _construct_plain_graphs(adapter, scheduler) -> dict:
    """Build the gate's real plain backend and DECODE runner with ``capture()``
    a no-op (``adapter``: the version's graphs module) and report the checks."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardMode,
    )

    from eagle_gate.adapters.plain.capture import target_model_runner
    from eagle_gate.adapters.plain.graphs import PlainGraphs, select_plain_path
    from eagle_gate.adapters.plain.tensors import swap_attrs

    mr = target_model_runner(scheduler)
    ndt = int(scheduler.draft_worker.speculative_num_draft_tokens)
    before = {
        "attn_backend": mr.attn_backend,
        "graph": getattr(mr, adapter.GRAPH_ATTR, None),
        "spec_algorithm": mr.spec_algorithm,
        "aux": getattr(mr, "eagle_use_aux_hidden_state", None),
        "layers": list(
            getattr(getattr(mr.model, "model", None), "layers_to_capture", []) or []
        ),
        "init_new_workspace": getattr(mr, "init_new_workspace", None),
    }
    counts: dict = {}
    captures: list = []

    class Construct(adapter._plain_runner_cls()):
        def capture(self, *args, **kwargs):
            captures.append(1)  # a CUDA graph cannot be recorded on CPU

    if sglang_version() == "0.5.9":
        from sglang.srt.model_executor.cuda_graph_runner import (
            get_batch_sizes_to_capture,
        )
    else:
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import (
            get_batch_sizes_to_capture,
        )
    expected_bs, _ = get_batch_sizes_to_capture(mr, ndt)
    # Stand-in for the target's verify graph runner, which SGLang builds on a
    # GPU and not on CPU, and which the gate checks its plain runner against
    # (the same bucket list, max_bs no larger): the bucket list SGLang's own
    # runner takes for the verify set (get_batch_sizes_to_capture with the
    # draft tokens per request) and its max_bs, max(capture_bs), as SGLang's
    # constructor sets them. Swapped in for the plain runner's build only.
    shared = {
        adapter.GRAPH_ATTR: SimpleNamespace(
            capture_bs=list(expected_bs), max_bs=max(expected_bs)
        )
    }
    if getattr(mr, "graph_shared_output", False) is None:
        # 0.5.23 creates its process-shared logits buffer only where decode
        # graphs are on (never on CPU); on a GPU the verify set's buffer
        # (max_bs * num_draft_tokens rows) is there and holds the plain set's.
        from sglang.srt.model_executor.graph_shared_output import GraphSharedOutput

        shared["graph_shared_output"] = GraphSharedOutput(
            device=mr.device, max_rows=max(expected_bs) * ndt
        )
    _count_calls(mr.attn_backend, "init_cuda_graph_state", counts, "verify_backend")
    try:
        backend = adapter.build_plain_backend(mr)
        _count_calls(backend, "init_cuda_graph_state", counts, "plain_backend")
        with swap_attrs(mr, **shared):
            runner = adapter.build_plain_runner(mr, backend, cls=Construct)
    finally:
        del mr.attn_backend.init_cuda_graph_state  # the class's method again
    if sglang_version() == "0.5.9":
        width = runner.num_tokens_per_bs
    else:
        width = runner.captured_req_width
    after_layers = list(
        getattr(getattr(mr.model, "model", None), "layers_to_capture", []) or []
    )
    graphs = PlainGraphs(
        state="captured",
        runner=runner,
        backend=backend,
        capture_bs=tuple(runner.capture_bs),
        max_bs=int(runner.max_bs),
        disable_padding=bool(runner.disable_padding),
    )
    agree = {}
    for bs in sorted({1, runner.max_bs, runner.max_bs + 1}):
        for hidden in (
            CaptureHiddenMode.NULL,
            CaptureHiddenMode.LAST,
            CaptureHiddenMode.FULL,
        ):
            batch = SimpleNamespace(
                batch_size=bs,
                forward_mode=ForwardMode.DECODE,
                capture_hidden_mode=hidden,
                spec_info=None,
                replace_embeds=None,
                encoder_lens=None,
                can_run_tbo=False,
                lora_ids=None,
                input_ids=SimpleNamespace(numel=lambda bs=bs: bs),
                global_num_tokens_cpu=None,
            )
            check = getattr(runner, "can_run", None) or runner.can_run_graph
            try:
                ran = bool(check(batch))
            except Exception as exc:
                ran = repr(exc)
            agree[f"{bs}:{hidden.name}"] = [
                ran,
                select_plain_path(graphs, bs)[0] == "graph",
            ]
    report = {
        "runner_class": type(runner).__mro__[1].__name__,
        "shared_logits_stand_in": bool(shared),
        "captures_stubbed": len(captures),
        "forward_mode": runner.capture_forward_mode.name,
        "width": int(width),
        "hidden_mode": CaptureHiddenMode(runner.capture_hidden_mode).name,
        "spec_info_none": runner.get_spec_info(int(runner.max_bs)) is None,
        "capture_bs": sorted(set(runner.capture_bs)),
        "expected_bs": sorted(set(expected_bs)),
        "max_bs": int(runner.max_bs),
        "backend_class": type(backend).__name__,
        "verify_backend_class": type(before["attn_backend"]).__name__,
        "backend_is_new": backend is not before["attn_backend"],
        "runner_backend_is_plain": getattr(runner, "attn_backend", backend) is backend,
        "init_cuda_graph_state": {
            "plain_backend": counts.get("plain_backend", 0),
            "verify_backend": counts.get("verify_backend", 0),
        },
        "model_runner_unchanged": {
            "attn_backend": mr.attn_backend is before["attn_backend"],
            "graph_attr": getattr(mr, adapter.GRAPH_ATTR, None) is before["graph"],
            "spec_algorithm": mr.spec_algorithm is before["spec_algorithm"],
            "eagle_use_aux_hidden_state": getattr(
                mr, "eagle_use_aux_hidden_state", None
            )
            == before["aux"],
            "layers_to_capture": after_layers == before["layers"],
            "init_new_workspace": getattr(mr, "init_new_workspace", None)
            == before["init_new_workspace"],
        },
        "can_run_vs_select": agree,
    }
    if hasattr(runner, "capture_prepare"):
        try:
            fb = runner.capture_prepare(1)
            fb = fb[0] if isinstance(fb, tuple) else fb
            fb = getattr(fb, "forward_batch", fb)
            report["capture_prepare"] = {
                "forward_mode": fb.forward_mode.name,
                "spec_info_none": fb.spec_info is None,
                "hidden_mode": CaptureHiddenMode(fb.capture_hidden_mode).name,
                "input_ids": int(fb.input_ids.numel()),
            }
        except Exception as exc:
            report["capture_prepare"] = {"error": repr(exc)}
    del graphs, runner, backend
    return report
