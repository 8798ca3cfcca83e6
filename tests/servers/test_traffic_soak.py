"""A bounded soak of mixed real traffic against the shared gated EAGLE-3
server, overlap scheduling on (issue #21, items 3 and 5).

The soak itself, what it sends and what it checks, is ``support.soak`` (the
MTP server of ``test_mtp_e2e.py`` runs the same one).

Then client disconnects on their own (item 5): eight streams dropped after
one to five steps, beside two greedy requests, under PLAIN-every-step and
then SPEC-every-step; the greedy answers stay the no-spec ones and the idle
memory check finds nothing leaked.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import soak
from support.gated_server import scheduler_status, set_policy
from support.soak import GREEDY, VERSION, _greedy_body, _key, drop_stream
from support.timings import note
from support.traffic import health, log_failures, post


@pytest.fixture(scope="module")
def references(traffic_servers) -> dict:
    return soak.references(traffic_servers.baseline.base_url)


def test_a_mixed_traffic_soak_leaves_the_gated_server_whole(
    traffic_servers, references
):
    soak.soak_and_check(
        traffic_servers.gated.base_url, traffic_servers.gated.log, references
    )


#: item 5: disconnects per policy, and the chunks after which each drops.
DROPS = 6


def test_client_disconnects_mid_step_leak_nothing(traffic_servers, references):
    """Streams dropped by their client after 1 to 5 steps, 8 at a time,
    beside two greedy requests, with every step PLAIN and then every step
    SPEC: the greedy answers are the no-spec ones, and once idle SGLang's
    strict memory check finds every slot free (the server lives)."""
    url = traffic_servers.gated.base_url
    before = scheduler_status(url)
    t0 = time.monotonic()
    dropped = {}
    for policy in ("never", "always"):
        set_policy(url, policy)
        keepers = GREEDY[:2]
        with ThreadPoolExecutor(DROPS + len(keepers)) as pool:
            kept = [
                pool.submit(post, url, "/generate", _greedy_body(p, n))
                for _, p, n in keepers
            ]
            drops = [
                pool.submit(
                    drop_stream,
                    url,
                    _greedy_body(f"{policy} drop {i}", 200, stream=True),
                    1 + i % 5,
                )
                for i in range(DROPS)
            ]
            chunks = [d.result() for d in drops]
            for (name, _, _), future in zip(keepers, kept, strict=True):
                status, reply = future.result()
                assert status == 200, reply
                assert _key(reply) == references["answers"][(name, "greedy")], policy
        dropped[policy] = chunks
    set_policy(url, "goodput")
    time.sleep(4.0)  # idle: SGLang's strict memory check runs
    after = scheduler_status(url)
    log = traffic_servers.gated.log()
    note(
        f"SGLang {VERSION}: client disconnects mid-step: {DROPS} per policy, "
        f"chunks read before the drop {dropped}; server alive after the idle "
        f"check: {health(url) == 200} ({time.monotonic() - t0:.0f} s)"
    )
    assert health(url) == 200, log[-4000:]
    assert not log_failures(log), log_failures(log)
    assert all(c >= 1 for chunks in dropped.values() for c in chunks), dropped
    assert after["steps"]["plain"] > before["steps"]["plain"]
    assert after["plain_step_failures"] == before["plain_step_failures"]
    assert after["internal_errors"] == before["internal_errors"]
