"""Opt-in, rate-limited JSON-lines log of decisions and outcomes.

Enabled with ``EAGLE_GATE_DECISION_LOG=DIR`` (or ``--gate-decision-log DIR``);
each scheduler process appends to ``DIR/decisions-<pid>.jsonl``. At most
``EAGLE_GATE_DECISION_LOG_RATE`` records of each kind (decision, outcome) per
second are kept (default 200); what is left out is counted in a ``dropped``
record. The hot path only appends a tuple to a list; the ops thread formats
and writes the lines about once a second.

Record format (one JSON object per line, ``"v": 1``; ``t`` is Unix time when
the record was taken, ``step`` the gate's decode-step number in this process):

* ``{"v":1,"kind":"start","t","pid","tp_rank","tp_size","adapter","sglang_version",
  "num_draft_tokens","policy","settings","config_version","shadow"}`` -- first
  line of each process's log.
* ``{"v":1,"kind":"config","t","step","config_version","policy","settings",
  "shadow"}`` -- a runtime change took effect from ``step`` on.
* ``{"v":1,"kind":"decision","t","step","batch_size","seq_len_sum",
  "seq_lens_exact","decided","ran","override"}`` -- ``seq_len_sum`` and
  ``seq_lens_exact`` as the policy's ``StepView`` had them (null: unknown;
  ``seq_lens_exact`` false: an estimate, see ``StepView``); ``decided``:
  ``spec`` | ``plain`` | ``error`` (the policy raised or returned garbage) |
  ``not_asked`` (degraded); ``ran``: the mode the gate chose to run
  (``spec`` | ``plain``); ``override``: why SPEC ran although the policy said
  PLAIN, or null; ``shadow`` on every decision of shadow mode (``decided`` is
  what the policy would have run).
* ``{"v":1,"kind":"outcome","t","step","mode","batch_size","tokens",
  "accept_lens","interval_s"[,"draft_matches"][,"depth"]}`` -- the step's resolved
  result, exactly the :class:`eagle_gate.StepOutcome` the policy saw
  (``mode``: what really ran; ``draft_matches`` only where measured;
  ``depth``: the SPEC depth that ran, 0 for PLAIN, only on a server whose
  policy may choose depths, ``--gate-depths``).
* ``{"v":1,"kind":"plain_failure","t","step","error"}`` -- the plain step
  raised at ``step``; the stock step ran.
* ``{"v":1,"kind":"dropped","t","decisions","outcomes"}`` -- records left out
  by the rate limit since the previous ``dropped`` record.

Replaying: the ``outcome`` records in ``step`` order are the sequence of
``StepOutcome``s a policy observed, and the ``decision`` records give the
``StepView`` inputs (``batch_size``, ``seq_len_sum``, ``step``) and what it
decided; a simulator can feed the same views to another policy and compare.
Records of one step may be split across a rate-limit window boundary.
"""

from __future__ import annotations

import collections
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eagle_gate.options import option

__all__ = ["DecisionLog", "ENV_DECISION_LOG", "ENV_DECISION_LOG_RATE"]

#: declared with its flag, --gate-decision-log, in eagle_gate.options
ENV_DECISION_LOG = option("decision_log").env
ENV_DECISION_LOG_RATE = "EAGLE_GATE_DECISION_LOG_RATE"
FORMAT_VERSION = 1

_DECIDED = ("spec", "plain", "error", "not_asked")
_MODE = ("spec", "plain")


class DecisionLog:
    """Collects records on the hot path; :meth:`flush` writes them."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_per_s: int = 200,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_per_s = max(1, int(max_per_s))
        self._clock = clock
        # deque: append (hot path) and popleft (ops thread) are thread-safe.
        self._pending: collections.deque[tuple] = collections.deque(maxlen=100_000)
        self._lock = threading.Lock()
        self._window = 0.0
        self._n_decisions = 0
        self._n_outcomes = 0
        self.dropped_decisions = 0
        self.dropped_outcomes = 0
        self._reported_dropped = (0, 0)
        self.written = 0

    @classmethod
    def from_environment(
        cls, environ: dict | None = None, *, pid: int | None = None
    ) -> DecisionLog | None:
        env = os.environ if environ is None else environ
        directory = env.get(ENV_DECISION_LOG, "").strip()
        if not directory:
            return None
        try:
            rate = int(env.get(ENV_DECISION_LOG_RATE, "") or 200)
        except ValueError:
            rate = 200
        pid = os.getpid() if pid is None else pid
        return cls(Path(directory) / f"decisions-{pid}.jsonl", max_per_s=rate)

    # -- hot path: append a tuple -------------------------------------------
    def _admit(self, now: float) -> None:
        if now - self._window >= 1.0:
            self._window = now
            self._n_decisions = 0
            self._n_outcomes = 0

    def decision(
        self,
        step: int,
        view: Any,
        decided: int,
        ran: int,
        override: str | None,
    ) -> None:
        """``view``: the step's ``StepView``; its sequence lengths are read
        only for records the rate limit admits (an estimate costs a pass over
        the batch's requests)."""
        now = self._clock()
        self._admit(now)
        if self._n_decisions >= self.max_per_s:
            self.dropped_decisions += 1
            return
        self._n_decisions += 1
        self._pending.append(
            (
                "d",
                now,
                step,
                view.batch_size,
                view.seq_len_sum,
                view.seq_lens_exact,
                decided,
                ran,
                override,
            )
        )

    def outcome(
        self,
        step: int,
        mode: int,
        accept_lens: Sequence[int],
        tokens: int,
        interval_s: float | None,
        draft_matches: int | None = None,
        depth: int | None = None,
    ) -> None:
        now = self._clock()
        self._admit(now)
        if self._n_outcomes >= self.max_per_s:
            self.dropped_outcomes += 1
            return
        self._n_outcomes += 1
        self._pending.append(
            ("o", now, step, mode, accept_lens, tokens, interval_s,
             draft_matches, depth)
        )  # fmt: skip

    def plain_failure(self, step: int, error: str) -> None:
        self._pending.append(("f", self._clock(), step, error))

    def config(
        self,
        step: int,
        version: int,
        policy: str,
        settings: dict,
        shadow: bool = False,
    ) -> None:
        self._pending.append(
            ("c", self._clock(), step, version, policy, settings, shadow)
        )

    def start(self, fields: dict[str, Any]) -> None:
        self._pending.append(("s", self._clock(), fields))

    # -- off the hot path ------------------------------------------------------
    def _open(self):
        """The log file for appending: never through a symlink someone planted
        (``O_NOFOLLOW``), created 0600, and only a regular file of this user."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o600)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise PermissionError(
                f"{self.path} is not a regular file of this user; not writing to it"
            )
        return os.fdopen(fd, "a", encoding="utf-8")

    def _format(self, rec: tuple) -> dict[str, Any]:
        kind = rec[0]
        if kind == "d":
            _, t, step, bs, sls, exact, decided, ran, override = rec
            return {
                "kind": "decision",
                "t": t,
                "step": step,
                "batch_size": bs,
                "seq_len_sum": None if sls is None else int(sls),
                "seq_lens_exact": bool(exact),
                "decided": _DECIDED[decided],
                "ran": _MODE[ran],
                "override": override,
            }
        if kind == "o":
            _, t, step, mode, lens, tokens, interval, matches, depth = rec
            record = {
                "kind": "outcome",
                "t": t,
                "step": step,
                "mode": _MODE[mode],
                "batch_size": len(lens),
                "tokens": int(tokens),
                "accept_lens": [int(x) for x in lens],
                "interval_s": interval,
            }
            if matches is not None:
                record["draft_matches"] = int(matches)
            if depth is not None:
                record["depth"] = int(depth)
            return record
        if kind == "f":
            _, t, step, error = rec
            return {"kind": "plain_failure", "t": t, "step": step, "error": error}
        if kind == "c":
            _, t, step, version, policy, settings, shadow = rec
            return {
                "kind": "config",
                "t": t,
                "step": step,
                "config_version": version,
                "policy": policy,
                "settings": settings,
                "shadow": shadow,
            }
        _, t, fields = rec
        return {"kind": "start", "t": t, **fields}

    def flush(self) -> int:
        """Write what was collected; return the number of lines written."""
        with self._lock:
            pending = []
            for _ in range(len(self._pending)):
                pending.append(self._pending.popleft())
            dropped = (self.dropped_decisions, self.dropped_outcomes)
            lines = []
            for rec in pending:
                data = {"v": FORMAT_VERSION}
                data.update(self._format(rec))
                lines.append(json.dumps(data, separators=(",", ":")))
            if dropped != self._reported_dropped:
                prev = self._reported_dropped
                self._reported_dropped = dropped
                lines.append(
                    json.dumps(
                        {
                            "v": FORMAT_VERSION,
                            "kind": "dropped",
                            "t": self._clock(),
                            "decisions": dropped[0] - prev[0],
                            "outcomes": dropped[1] - prev[1],
                        },
                        separators=(",", ":"),
                    )
                )
            if not lines:
                return 0
            with self._open() as f:
                f.write("\n".join(lines) + "\n")
            self.written += len(lines)
            return len(lines)
