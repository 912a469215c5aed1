import pytest
from handclock import Clock

from deployments.contract.session_spec import PacingSettings
from deployments.world_model.pacing import MediaClock


def test_chunks_wait_for_their_media_time_minus_the_lead():
    now = Clock()
    clock = MediaClock(PacingSettings(lead_seconds=0.25), now)
    assert clock.delay(0.0) == 0.0  # the first chunk anchors the timeline
    assert clock.delay(1.0) == pytest.approx(0.75)
    now.t += 2.0
    assert clock.delay(1.5) == 0.0  # late: send at once


def test_falling_far_behind_rebases_instead_of_bursting():
    now = Clock()
    clock = MediaClock(PacingSettings(max_lag_seconds=1.0), now)
    clock.delay(0.0)
    now.t += 10.0  # the generator stalled for 10 s
    assert clock.delay(2.0) == 0.0
    assert clock.delay(3.0) == pytest.approx(1.0)  # the next second of media waits a second again


def test_playback_reports_anchor_the_timeline():
    now = Clock()
    clock = MediaClock(PacingSettings(), now)
    clock.delay(0.0)
    clock.observe_playback(0.5)  # the client is half a second in, right now
    assert clock.delay(2.0) == pytest.approx(1.5)
