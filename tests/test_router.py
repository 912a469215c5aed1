"""FreeSlotsRouter's ranking, with replicas described the way Serve hands them to it."""

import asyncio
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from deployments.routing.free_slots import FreeSlotsRouter


@dataclass
class Replica:
    replica_id: str
    routing_stats: dict = field(default_factory=dict)


class PolicyOnly(FreeSlotsRouter):
    """Serve builds a router around a live controller; these tests need only its policy."""

    def __init__(self, replicas) -> None:
        self._known = {r.replica_id: r for r in replicas}
        self.initialize_state()

    @property
    def curr_replicas(self):
        return self._known


def make_router(replicas):
    return PolicyOnly(replicas)


def request(method="run_session"):
    return SimpleNamespace(metadata=SimpleNamespace(call_method=method))


def ranks(router, replicas, method="run_session"):
    ranked = asyncio.run(router.choose_replicas(replicas, request(method)))
    return [sorted(r.replica_id for r in rank) for rank in ranked]


def test_most_free_slots_first_full_replicas_last():
    a = Replica("a", {"free_slots": 1, "reported_at": 1.0})
    b = Replica("b", {"free_slots": 3, "reported_at": 1.0})
    c = Replica("c", {"free_slots": 0, "reported_at": 1.0})
    router = make_router([a, b, c])
    assert ranks(router, [a, b, c]) == [["b"], ["a"], ["c"]]


def test_placements_since_the_last_report_count_against_a_replica():
    a = Replica("a", {"free_slots": 3, "reported_at": 1.0})
    b = Replica("b", {"free_slots": 2, "reported_at": 1.0})
    router = make_router([a, b])
    chosen = []
    for _ in range(5):
        best = ranks(router, [a, b])[0]
        replica_id = best[0]
        chosen.append(replica_id)
        router.on_request_routed(request(), replica_id, None)
    # Five sessions back to back, stats unchanged: 3 on a, 2 on b, never all on a.
    assert sorted(chosen) == ["a", "a", "a", "b", "b"]
    # A report taken after the placements already counts them: the router stops subtracting them.
    later = time.time() + 1
    a.routing_stats = {"free_slots": 0, "reported_at": later}
    b.routing_stats = {"free_slots": 0, "reported_at": later}
    assert ranks(router, [a, b]) == [["a", "b"]]


def test_a_report_taken_before_a_placement_does_not_erase_it():
    a = Replica("a", {"free_slots": 2, "reported_at": 1.0})
    b = Replica("b", {"free_slots": 2, "reported_at": 1.0})
    router = make_router([a, b])
    router.on_request_routed(request(), "a", None)
    a.routing_stats = {"free_slots": 2, "reported_at": time.time() - 0.5}  # taken just before the session arrived
    assert ranks(router, [a, b]) == [["b"], ["a"]]


def test_unreported_replicas_are_tried_first_and_other_calls_are_not_counted():
    fresh = Replica("fresh")
    busy = Replica("busy", {"free_slots": 1, "reported_at": 1.0})
    router = make_router([fresh, busy])
    assert ranks(router, [fresh, busy]) == [["fresh"], ["busy"]]
    router.on_request_routed(request("stats"), "busy", None)
    assert ranks(router, [busy]) == [["busy"]] and router._free_slots(busy) == 1
    assert sorted(sum(ranks(router, [fresh, busy], method="stats"), [])) == ["busy", "fresh"]
