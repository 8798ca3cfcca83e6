"""Server ports for concurrent test sessions (``support.ports``)."""

from __future__ import annotations

import multiprocessing
import random
import socket

from support import ports


def _reserve(state, out) -> None:
    out.put(ports.reserve_port(state))


def test_concurrent_sessions_never_get_the_same_slot(tmp_path):
    state = tmp_path / "ports.json"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_reserve, args=(state, out)) for _ in range(6)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert len(set(got)) == len(got), got
    for port in got:
        assert (
            ports.FIRST <= port <= ports.LAST and (port - ports.FIRST) % ports.SLOT == 0
        )
        # below SGLang 0.5.23's own range and the kernel's ephemeral range
        assert port + 240 < 22_000


def test_a_slot_with_a_bound_port_is_passed_over(tmp_path):
    state = tmp_path / "ports.json"
    # three slots of a range no other test uses (below the servers' slots)
    base = 5_000 + ports.SLOT * random.randrange(16)
    slots = range(base, base + 3 * ports.SLOT, ports.SLOT)
    first = ports.reserve_port(state, slots)
    # the other slots were handed out more recently; the first one is oldest
    assert ports.reserve_port(state, slots) != first
    assert ports.reserve_port(state, slots) != first
    with socket.socket() as s:
        s.bind(("127.0.0.1", first + 233))  # a derived port of the oldest slot
        again = ports.reserve_port(state, slots)
    assert again != first
    assert ports.reserve_port(state, slots) == first  # free again: the oldest
