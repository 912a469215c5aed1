"""The replica's mailbox: messages per session, leases, and no box outliving its session."""

import asyncio

from deployments.sessions.inbox import Inbox
from deployments.sessions.mailbox import CLOSED_IDS_KEPT, STALE_AFTER_LEASES, Mailbox
from local_actor import LocalActor


def test_posts_arrive_in_order_and_a_closed_session_takes_no_more():
    box = Mailbox()
    assert box.open("a", lease_s=10.0)
    assert box.post("a", 1) and box.post("a", 2)
    delivery = box.take("a")
    assert delivery.messages == [1, 2] and not delivery.lease_expired
    box.close("a")
    assert not box.post("a", 3)
    assert box.take("a").lease_expired
    assert box.sessions() == []


def test_an_open_that_arrives_after_its_close_leaves_nothing():
    # Ray may run a cancelled session's close before its open; the open must not recreate the box.
    box = Mailbox()
    box.close("late")
    assert not box.open("late", lease_s=10.0)
    assert box.sessions() == []
    assert not box.post("late", "stop")


def test_closed_ids_are_remembered_within_a_bound():
    box = Mailbox()
    for i in range(CLOSED_IDS_KEPT + 10):
        box.close(f"s{i}")
    assert len(box._closed) == CLOSED_IDS_KEPT
    assert not box.open(f"s{CLOSED_IDS_KEPT + 9}", lease_s=1.0)
    assert box.open("s0", lease_s=1.0)  # long forgotten; ids are never reused in practice


def test_a_lease_expires_without_renewal_and_wait_take_wakes_on_a_post():
    async def go():
        box = Mailbox()
        box.open("s", lease_s=0.05)
        waiter = asyncio.ensure_future(box.wait_take("s", timeout=5.0))
        await asyncio.sleep(0.01)
        box.post("s", "hello")
        delivery = await asyncio.wait_for(waiter, 1.0)
        assert delivery.messages == ["hello"]
        await asyncio.sleep(0.1)
        assert box.take("s").lease_expired
        assert box.renew("s") and not box.take("s").lease_expired

    asyncio.run(go())


def test_a_box_long_past_its_lease_is_dropped_even_without_its_close(monkeypatch):
    import deployments.sessions.mailbox as mailbox

    now = [100.0]
    monkeypatch.setattr(mailbox.time, "monotonic", lambda: now[0])
    box = Mailbox()
    box.open("lost", lease_s=1.0)  # its close never comes
    box.open("alive", lease_s=1.0)
    now[0] += STALE_AFTER_LEASES * 1.0 - 0.5
    assert box.renew("alive")
    assert box.sessions() == ["lost", "alive"]  # expired, but not long enough to be dropped
    now[0] += 1.0
    assert box.sessions() == ["alive"]
    assert box.take("lost").lease_expired and not box.post("lost", "late")


def test_the_inbox_reads_ahead_what_is_posted_and_notices_an_expired_lease():
    # The replica's block boundary reads the session's messages here, without a call to the actor.
    async def scenario():
        box = Mailbox()
        box.open("s", lease_s=0.4)
        inbox = Inbox(LocalActor(box), "s", poll_s=0.1)
        inbox.start()
        box.post("s", "left")
        box.post("s", "right")
        first = await inbox.wait_take(1.0)
        quiet = inbox.take()
        expired = await inbox.wait_take(2.0)  # nobody posts or renews: the lease runs out
        await inbox.close()
        return first, quiet, expired

    first, quiet, expired = asyncio.run(scenario())
    assert first.messages == ["left", "right"] and not first.lease_expired
    assert quiet.messages == [] and not quiet.lease_expired
    assert expired.lease_expired


def test_an_inbox_whose_mailbox_is_gone_ends_its_session():
    class Gone:
        def wait_take(self, *args):
            raise ConnectionError("actor died")

    async def scenario():
        inbox = Inbox(LocalActor(Gone()), "s", poll_s=0.1)
        inbox.start()
        delivery = await inbox.wait_take(1.0)
        await inbox.close()
        return delivery

    assert asyncio.run(scenario()).lease_expired
