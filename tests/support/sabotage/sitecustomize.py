"""Deliberate, partial breakage of the draft sync, for proving that the
draft-state tests fail on it (issue #25). Never part of the package.

How it gets in: a test run with ``EAGLE_GATE_TEST_SABOTAGE=<mode>`` in its
environment puts this directory on the servers' ``PYTHONPATH``
(``tests/servers/test_spec_e2e.py``), so every Python process of such a server imports
this ``sitecustomize`` at start (the test environments have none of their
own), which patches the shared plain step's module globals. Without the
variable nothing here is imported, and nothing in ``src`` knows about it.

Modes (each leaves the counters as a correct run would show them):

* ``skip_alternate_extend``: eager sync skips the draft extend on every other
  plain step (the next draft input zero-filled, as ``none`` does; the draft
  KV of that position never written), still counted as an extend;
* ``prev_hidden``: eager sync feeds the draft extend, for a request whose
  previous step was PLAIN too (inside a stretch), the target hidden state of
  the previous position instead of this one;
* ``lazy_short``: lazy's catch-up covers one position less of each gap (the
  oldest position of the gap stays stale);
* ``lazy_drop_newest``: lazy's catch-up stops one position short of each gap
  longer than one (the newest position stale, the next draft input taken one
  position early: an off-by-one at the end of the window);
* ``plain_configured_width`` (``--gate-depths`` servers, SGLang 0.5.23): the
  plain step lays its result and the draft extend's hidden rows and KV slots
  out at the *configured* width instead of the active depth's (as if it read
  the width once at startup and missed SGLang's depth switches), while
  SGLang's draft extend gathers at the active width: after a SPEC step at a
  shallower depth, the draft reads other rows and writes other KV slots;
* ``skip_extend_width``: the first draft extend after each depth switch reads
  the verify's rows at the old depth's width (row ``i * old + j`` where
  SGLang's gather expects ``i * new + j``; clamped, so nothing fails): the
  draft KV of that step's positions and the next draft input come from other
  positions or requests. The plain step's draft extend counts too (it runs
  under the active state).

``plain_configured_width`` is loud: the plain step's result and its draft
extend disagree on the row count, the step fails, the gate runs SGLang's
stock step in its place and after three failures in a row degrades (the
test fails on the PLAIN step count). ``skip_extend_width`` is silent: only
the draft-state check sees it.
"""

from __future__ import annotations

import os
import sys

#: comma-separated: one eager mode and lazy_short may go together (each
#: touches only its own sync)
MODES = [m for m in os.environ.get("EAGLE_GATE_TEST_SABOTAGE", "").split(",") if m]
LAZY = ("lazy_short", "lazy_drop_newest")
DEPTHS = ("plain_configured_width", "skip_extend_width")
KNOWN = ("skip_alternate_extend", "prev_hidden", *LAZY, *DEPTHS)


def _install() -> None:
    from eagle_gate.adapters.plain import lazy as lazy_mod
    from eagle_gate.adapters.plain import step as step_mod

    for mode in MODES:
        if mode not in KNOWN:
            raise SystemExit(
                f"EAGLE_GATE_TEST_SABOTAGE: {mode!r} is not one of {KNOWN}"
            )
    print(f"[eagle_gate test sabotage] pid {os.getpid()}: {MODES}", file=sys.stderr)
    if any(m in DEPTHS for m in MODES):
        _install_depths([m for m in MODES if m in DEPTHS])
        return

    lazy = [m for m in MODES if m in LAZY]
    if lazy:
        window = lazy_mod.LazyDraftSync.window
        oldest = lazy == ["lazy_short"]

        def short_window(self, batch):
            plan = window(self, batch)
            if plan is None:
                return None
            starts, lengths, mask = plan
            for i, (length, gap) in enumerate(zip(lengths, mask, strict=True)):
                if gap and length > 1:
                    if oldest:
                        starts[i] += 1
                    lengths[i] -= 1
            return starts, lengths, mask

        lazy_mod.LazyDraftSync.window = short_window
    eager = [m for m in MODES if m not in LAZY]
    if not eager:
        return
    (MODE,) = eager
    real_extend = step_mod.draft_extend
    real_plain_step = step_mod.plain_step
    state = {"inside": False, "calls": 0, "prev": {}}

    def plain_step(parts, worker, batch, draft_sync="eager", *args, **kwargs):
        state["inside"] = draft_sync == "eager"
        try:
            return real_plain_step(parts, worker, batch, draft_sync, *args, **kwargs)
        finally:
            state["inside"] = False

    def draft_extend(parts, worker, batch, result, graphs=None):
        if not state["inside"]:  # lazy's catch-up: untouched
            return real_extend(parts, worker, batch, result, graphs)
        state["calls"] += 1
        if MODE == "skip_alternate_extend" and state["calls"] % 2 == 0:
            parts.skip_draft_extend(worker, batch, result, int(batch.seq_lens.shape[0]))
            if graphs is not None:
                graphs.count_draft_extend(parts.draft_extend_path(worker, batch))
            return None
        if MODE == "prev_hidden":
            hidden = result.logits_output.hidden_states  # spread: row i * stride
            stride = hidden.shape[0] // int(batch.seq_lens.shape[0])
            prev, now = state["prev"], {}
            rows = batch.req_pool_indices.tolist()
            positions = batch.seq_lens.tolist()
            for i, (row, pos) in enumerate(zip(rows, positions, strict=True)):
                mine = hidden[i * stride].clone()
                now[row] = (pos, mine)
                if row in prev and prev[row][0] == pos - 1:
                    hidden[i * stride] = prev[row][1]
            state["prev"] = now  # only the step right before counts
        return real_extend(parts, worker, batch, result, graphs)

    step_mod.plain_step = plain_step
    step_mod.draft_extend = draft_extend


def _install_depths(modes: list[str]) -> None:
    from eagle_gate.adapters.plain import step as step_mod

    if "plain_configured_width" in modes:
        real_plain_step = step_mod.plain_step

        def plain_step(parts, worker, batch, *args, **kwargs):
            # the top-level worker's width is what the plain step reads; the
            # draft worker's (SGLang's draft extend) stays the active one
            states = worker.adaptive_controller._states
            active = worker.speculative_num_draft_tokens
            worker.speculative_num_draft_tokens = max(
                s.speculative_num_draft_tokens for s in states.values()
            )
            try:
                return real_plain_step(parts, worker, batch, *args, **kwargs)
            finally:
                worker.speculative_num_draft_tokens = active

        step_mod.plain_step = plain_step
    if "skip_extend_width" in modes:
        import torch
        from sglang.srt.speculative import eagle_worker_v2 as ew

        real_apply = ew.EAGLEWorkerV2.apply_runtime_state
        real_extend = ew.EagleDraftWorker._draft_extend_for_decode
        pending: dict[int, int] = {}  # id(draft worker) -> the old width

        def apply_runtime_state(self, state):
            old = self._draft_worker.speculative_num_draft_tokens
            real_apply(self, state)
            if state.speculative_num_draft_tokens != old:
                pending[id(self._draft_worker)] = old

        def draft_extend_for_decode(self, batch, batch_result, *args, **kwargs):
            old = pending.pop(id(self), None)
            hidden = batch_result.logits_output.hidden_states
            if old is not None and hidden is not None:
                new = self.speculative_num_draft_tokens
                rows = torch.arange(hidden.shape[0], device=hidden.device)
                request, j = rows // new, rows % new
                source = (request * old + j).clamp(max=hidden.shape[0] - 1)
                batch_result.logits_output.hidden_states = hidden[source]
            return real_extend(self, batch, batch_result, *args, **kwargs)

        ew.EAGLEWorkerV2.apply_runtime_state = apply_runtime_state
        ew.EagleDraftWorker._draft_extend_for_decode = draft_extend_for_decode


if MODES:
    _install()
