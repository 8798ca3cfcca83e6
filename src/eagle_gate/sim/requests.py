"""The simulator's request table and running batch: requests as parallel
lists (prompt and output lengths, class, arrival, first token, done), the
running batch (remaining tokens, acceptance pool, context), KV accounting,
and what the oracles peek at. :class:`RequestTable` is the base of
:class:`~eagle_gate.sim.engine.Simulator`, which owns the step loop, the
profile and the random pools (``_pools``, ``_pool_mean``, ``_req_rng``)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from eagle_gate.sim.scenario import Segment

if TYPE_CHECKING:
    from eagle_gate.sim.profiles import Profile

__all__ = ["RequestTable", "LazySeqLens"]

POOL = 1 << 15
MASK = POOL - 1


class RequestTable:
    """Requests and the running batch of one simulator run (see module doc)."""

    profile: Profile
    _pools: dict[str, list[int]]
    _pool_mean: dict[int, float]
    _pool_alpha: dict[int, float]
    _reclass_rng: random.Random

    def _reset_requests(self) -> None:
        # request table
        self._r_prompt: list[int] = []
        self._r_out: list[int] = []
        self._r_target: list[int] = []
        self._r_emitted: list[int] = []
        self._r_arrival: list[float] = []
        self._r_first: list[float] = []
        self._r_done: list[float] = []
        self._r_class: list[str] = []
        self._r_initial: set[int] = set()
        # running batch (parallel lists)
        self._run_id: list[int] = []
        self._run_rem: list[int] = []
        self._run_pool: list[list[int]] = []
        self._run_base: list[int] = []
        self._kv = 0
        self._reserved = 0
        self._ptr = 0
        self._plain_run = 0

    def _new_request(self, now: float, class_probs: Mapping[str, float] | None) -> int:
        prof = self.profile
        rr = self._req_rng
        p = rr.randint(*prof.prompt_len)
        o = rr.randint(*prof.output_len)
        if class_probs:
            name = _draw_class(rr.random(), class_probs)
        else:
            name = prof.default_class
        rid = len(self._r_prompt)
        self._r_prompt.append(p)
        self._r_out.append(o)
        self._r_target.append(o)
        self._r_emitted.append(0)
        self._r_arrival.append(now)
        self._r_first.append(-1.0)
        self._r_done.append(-1.0)
        self._r_class.append(name)
        return rid

    def _reclass_running(self, class_probs: Mapping[str, float] | None) -> None:
        """Every running request takes a class from ``class_probs`` (the
        scenario's ``reclass_running``: its acceptance changes from now)."""
        if not class_probs:
            return
        rng = self._reclass_rng
        for i, rid in enumerate(self._run_id):
            name = _draw_class(rng.random(), class_probs)
            self._r_class[rid] = name
            self._run_pool[i] = self._pools[name]

    def _admit_running(self, rid: int, rem: int, ctx: int) -> None:
        self._run_id.append(rid)
        self._run_rem.append(rem)
        self._run_pool.append(self._pools[self._r_class[rid]])
        self._run_base.append(ctx + rem)
        self._kv += ctx
        self._reserved += ctx + rem

    def _start_staggered(self, seg: Segment, waiting: deque[int]) -> int:
        """Closed loop: start ``seg``'s clients already decoding at random
        progress (a steady state); those beyond ``max_running`` wait for
        their prefill. Returns the clients started."""
        prof = self.profile
        rr = self._req_rng
        c0 = int(seg.level)
        for _ in range(c0):
            rid = self._new_request(0.0, seg.class_probs)
            o = self._r_out[rid]
            g = rr.randint(1, o - 1) if o > 1 else 0
            rem = o - g
            self._r_target[rid] = rem
            self._r_first[rid] = 0.0
            self._r_initial.add(rid)
            if len(self._run_id) < prof.max_running:
                self._admit_running(rid, rem, self._r_prompt[rid] + g)
            else:
                # not admitted: it restarts from its prefill
                self._r_target[rid] = o
                self._r_first[rid] = -1.0
                self._r_initial.discard(rid)
                waiting.append(rid)
        return c0

    def _retire(
        self, fin: list[int], clock: float, thinking: deque[float], gap: float
    ) -> int:
        """Take the finished requests (indices into the running batch) out
        of it at ``clock``; their clients think for ``gap``. Returns how
        many."""
        run_id = self._run_id
        run_rem = self._run_rem
        run_pool = self._run_pool
        run_base = self._run_base
        for i in reversed(fin):
            rid = run_id[i]
            self._r_done[rid] = clock
            if gap > 0.0:
                thinking.append(clock + gap)
            self._kv -= run_base[i]  # rem is 0: ctx == base
            self._reserved -= run_base[i]
            last = len(run_id) - 1
            if i != last:
                run_id[i] = run_id[last]
                run_rem[i] = run_rem[last]
                run_pool[i] = run_pool[last]
                run_base[i] = run_base[last]
            run_id.pop()
            run_rem.pop()
            run_pool.pop()
            run_base.pop()
        return len(fin)

    def _tpot_and_completed(self, warm: float) -> tuple[float, int]:
        """Mean TPOT of the requests that finished after ``warm`` (NaN if
        none), and how many requests finished in the run."""
        tp_sum = 0.0
        tp_n = 0
        completed = 0
        for rid in range(len(self._r_done)):
            done = self._r_done[rid]
            if done < 0:
                continue
            completed += 1
            if done <= warm:
                continue
            n = self._r_target[rid]
            if n > 1:
                tp_sum += (done - self._r_first[rid]) / (n - 1)
                tp_n += 1
        return (tp_sum / tp_n if tp_n else float("nan")), completed

    def request_accounting(self) -> list[tuple[int, int, bool]]:
        """Per request: (tokens requested in this run, tokens emitted, done)."""
        return [
            (self._r_target[r], self._r_emitted[r], self._r_done[r] >= 0)
            for r in range(len(self._r_target))
        ]

    # -- what the oracles peek at -------------------------------------------------

    def peek(self) -> tuple[int, int, float, float, float]:
        """(batch, spec_tokens, spec_time, resync_time, plain_time) of the next
        step without noise, using the acceptance draws the step will use."""
        b = len(self._run_rem)
        k = self.profile.num_draft_tokens
        s = k - 1
        p = self._ptr
        pools = self._run_pool
        rem = self._run_rem
        tot = 0
        for i in range(b):
            g = pools[i][(p + i) & MASK]
            a = g + 1 if g < s else k
            r = rem[i]
            tot += a if a < r else r
        prof = self.profile
        resync = prof.resync_time(b, self._plain_run) if self._plain_run else 0.0
        return (
            b,
            tot,
            prof.spec_time(b, self._kv),
            resync,
            prof.plain_time(b, self._kv),
        )

    def peek_mean(self) -> tuple[int, float, float, float, float]:
        """Like :meth:`peek`, with each request's *expected* accept length
        (its class's mean) instead of the step's draws."""
        b = len(self._run_rem)
        means = self._pool_mean
        pools = self._run_pool
        rem = self._run_rem
        tot = 0.0
        for i in range(b):
            a = means[id(pools[i])]
            r = rem[i]
            tot += a if a < r else r
        prof = self.profile
        resync = prof.resync_time(b, self._plain_run) if self._plain_run else 0.0
        return (
            b,
            tot,
            prof.spec_time(b, self._kv),
            resync,
            prof.plain_time(b, self._kv),
        )

    def peek_mean_depths(
        self, depths: tuple[int, ...]
    ) -> tuple[int, list[float], list[float], float, float]:
        """Like :meth:`peek_mean` for each SPEC depth in ``depths``: (batch,
        expected tokens per depth, step time per depth, resync time, plain
        time), noise-free. O(batch + classes * depths)."""
        rem = self._run_rem
        pools = self._run_pool
        b = len(rem)
        prof = self.profile
        counts: dict[int, int] = {}
        short: list[tuple[int, int]] = []  # (pool, remaining) of ending requests
        cap = depths[-1] + 1  # no expected accept length reaches it
        for i in range(b):
            pid = id(pools[i])
            counts[pid] = counts.get(pid, 0) + 1
            r = rem[i]
            if r < cap:
                short.append((pid, r))
        alpha = self._pool_alpha
        tokens = []
        for s in depths:
            means = {pid: prof.mean_accept(alpha[pid], s) for pid in counts}
            tot = sum(n * means[pid] for pid, n in counts.items())
            for pid, r in short:
                m = means[pid]
                if r < m:
                    tot -= m - r
            tokens.append(tot)
        kv = self._kv
        resync = prof.resync_time(b, self._plain_run) if self._plain_run else 0.0
        times = [prof.spec_time(b, kv, s) for s in depths]
        return b, tokens, times, resync, prof.plain_time(b, kv)

    def _seq_len_max(self) -> int:
        base = self._run_base
        rem = self._run_rem
        return max((base[i] - rem[i] for i in range(len(rem))), default=0)


def _draw_class(u: float, class_probs: Mapping[str, float]) -> str:
    """The class whose cumulative probability first exceeds ``u`` (the last
    one when rounding leaves ``u`` beyond them all)."""
    acc = 0.0
    for name, prob in class_probs.items():
        acc += prob
        if u < acc:
            return name
    return next(reversed(list(class_probs)))


class LazySeqLens:
    """The running batch's sequence lengths, computed only if a policy asks."""

    __slots__ = ("_sim",)

    def __init__(self, sim: RequestTable) -> None:
        self._sim = sim

    def __len__(self) -> int:
        return len(self._sim._run_rem)

    def max(self) -> int:
        return self._sim._seq_len_max()

    def sum(self) -> int:
        return self._sim._kv
