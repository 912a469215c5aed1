"""Sessions per key across ingress replicas, without Serve: the ledger's leases and an ingress replica's side of them."""

from __future__ import annotations

import asyncio

import pytest
from handclock import Clock

from deployments.ingress.access import SESSION_LIMIT_UNAVAILABLE, TOO_MANY_SESSIONS, AccessDenied
from deployments.ingress.key_sessions import SessionsPerKey
from deployments.sessions.key_ledger import KeyLedger


def test_the_limit_counts_every_holder_and_a_release_frees_a_place():
    ledger = KeyLedger(2, clock=Clock())
    first, second = ledger.acquire("ingress-1", "a"), ledger.acquire("ingress-2", "a")
    assert first and second and first != second
    assert ledger.acquire("ingress-1", "a") is None and ledger.acquire("ingress-3", "a") is None
    assert ledger.acquire("ingress-1", "b") is not None  # another key has its own count
    ledger.release("ingress-2", second)
    assert ledger.acquire("ingress-1", "a") is not None
    assert ledger.open_sessions("a") == 2 and ledger.open_sessions() == 3
    with pytest.raises(ValueError, match="at least 1"):
        KeyLedger(0)


def test_a_holder_that_stops_renewing_loses_its_leases_and_one_that_renews_keeps_them():
    clock = Clock()
    ledger = KeyLedger(1, lease_s=10.0, clock=clock)
    lost = ledger.acquire("dead", "a")
    kept = ledger.acquire("alive", "b")
    for _ in range(5):
        clock.t += 4.0
        ledger.renew("alive", {kept: "b"})
    assert ledger.open_sessions("a") == 0  # "dead" stopped renewing 20 s ago: its key may open again
    assert ledger.acquire("other", "a") is not None
    assert ledger.open_sessions("b") == 1 and ledger.acquire("other", "b") is None


def test_a_renewal_drops_what_its_holder_no_longer_names_but_not_a_grant_still_on_its_way():
    ledger = KeyLedger(3, clock=Clock())
    old = ledger.acquire("h", "a")
    ledger.renew("h", {old: "a"})
    newer = ledger.acquire("h", "a")  # granted after the holder took the snapshot it is about to send
    ledger.renew("h", {})  # a release of `old` that never arrived: the renewal frees it
    assert ledger.open_sessions("a") == 1
    ledger.renew("h", {})  # by now the holder knew `newer`; not naming it means it is gone
    assert ledger.open_sessions("a") == 0 and newer


def test_a_restarted_ledger_learns_the_count_from_the_renewals():
    before = KeyLedger(2, clock=Clock())
    leases = {before.acquire("h1", "a"): "a", before.acquire("h1", "a"): "a"}
    after = KeyLedger(2, clock=Clock())  # the KeySessions replica restarted: empty
    after.renew("h1", leases)
    assert after.open_sessions("a") == 2 and after.acquire("h2", "a") is None


class LedgerHandle:
    """The KeySessions deployment's methods as a handle offers them (`.remote()` gives an awaitable), over a real ledger."""

    def __init__(self, ledger: KeyLedger | None) -> None:
        self.ledger = ledger
        self.renewals: list[dict] = []

    def __getattr__(self, name: str):
        handle = self

        class Method:
            @staticmethod
            def remote(*args):
                async def call():
                    if handle.ledger is None:
                        raise ConnectionError("ledger replica lost")
                    if name == "renew":
                        handle.renewals.append(dict(args[1]))
                    return getattr(handle.ledger, name)(*args)

                return call()

        return Method


def test_an_ingress_replica_takes_a_lease_per_keyed_session_renews_them_and_refuses_when_the_count_is_unknown():
    async def go():
        handle = LedgerHandle(KeyLedger(1))
        replica, other = SessionsPerKey(handle, 1, renew_s=0.05), SessionsPerKey(handle, 1, renew_s=0.05)
        assert await replica.acquire(None) is None  # an open server counts nothing
        lease = await replica.acquire("a")
        with pytest.raises(AccessDenied) as full:
            await other.acquire("a")  # the other replica sees this one's session
        assert full.value.code == TOO_MANY_SESSIONS and "limit is 1" in full.value.message and full.value.http_status == 429
        await asyncio.sleep(0.2)
        assert {lease: "a"} in handle.renewals
        await replica.release(lease)
        assert replica.open_sessions() == 0
        again = await other.acquire("a")
        handle.ledger = None  # the ledger cannot be reached
        with pytest.raises(AccessDenied) as unknown:
            await replica.acquire("b")
        assert unknown.value.code == SESSION_LIMIT_UNAVAILABLE and unknown.value.http_status == 503
        await other.release(again)  # a release that cannot be delivered does not raise
        assert other.open_sessions() == 0
        assert SessionsPerKey(None, None).ledger is None and await SessionsPerKey(None, None).acquire("a") is None
        with pytest.raises(ValueError, match="KeySessions"):
            SessionsPerKey(None, 2)  # a limit with nothing to count it would be no limit at all
        for r in (replica, other):
            r._renewing.cancel()

    asyncio.run(go())
