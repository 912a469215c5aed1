"""Flow control's rule (world_model/flow.py) on a hand-driven clock."""

from handclock import Clock

from deployments.world_model.flow import ClientWindow, FlowSettings


def window(ahead=2.0, stalled=5.0, grace=1.0):
    clock = Clock()
    return ClientWindow(FlowSettings(ahead, stalled, grace), now=clock), clock


def test_a_silent_client_is_taken_to_play_at_real_time_from_its_first_chunk():
    w, clock = window()
    assert w.may_generate(2.0)  # nothing sent yet: position 0
    assert not w.may_generate(2.5)
    w.chunk_sent()
    clock.t += 1.0
    assert w.may_generate(3.0) and not w.may_generate(3.1)
    clock.t += 60
    assert not w.too_slow()  # a silent client is never judged: it is only held to real time


def test_reports_move_the_position_with_a_short_grace():
    w, clock = window()
    w.chunk_sent()
    w.observe_playback(4.0)
    assert w.may_generate(6.0) and not w.may_generate(6.1)
    clock.t += 10  # no report since: only the grace is added
    assert w.may_generate(7.0) and not w.may_generate(7.1)
    w.observe_playback(3.0)  # an older position never moves it back
    assert w.may_generate(7.0)


def test_a_reporting_client_stuck_while_generation_waits_is_too_slow():
    w, clock = window(stalled=5.0)
    w.chunk_sent()
    w.observe_playback(1.0)
    assert not w.may_generate(10.0)
    clock.t += 4.9
    assert not w.too_slow()
    w.observe_playback(1.5)  # it moved: the clock starts again
    clock.t += 4.9
    assert not w.may_generate(10.0) and not w.too_slow()
    clock.t += 0.2
    assert w.too_slow()
    assert w.may_generate(3.0) and not w.too_slow()  # no longer held back: not too slow
