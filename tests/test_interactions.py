import math

import numpy as np
import pytest

from deployments.generation.camera import KeyMotion, Pose, plucker_rays, quat_axis_angle
from deployments.contract.events import CameraCommand, Interaction
from deployments.generation.interactions import Director, EventIdConflict, InteractionRefused


def director(camera: bool = True) -> Director:
    return Director("a forest", frames_per_block=3, accepts_camera=camera)


def test_hard_prompt_switch_applies_at_the_next_block_and_completes_there():
    d = director()
    assert d.plan_block().prompt_mix == (("a forest", 1.0),)
    d.submit(Interaction("p1", prompt="a desert"))
    plan = d.plan_block()
    assert plan.prompt_mix == (("a desert", 1.0),)
    assert (plan.started, plan.active, plan.completed) == (("p1",), ("p1",), ("p1",))
    later = d.plan_block()
    assert later.started == later.active == later.completed == ()


def test_prompt_blend_is_linear_over_transition_chunks():
    d = director()
    d.submit(Interaction("p1", prompt="a desert", transition_chunks=4))
    weights = []
    for _ in range(5):
        plan = d.plan_block()
        weights.append(dict(plan.prompt_mix).get("a desert", 0.0))
        if weights[-1] < 1:
            assert "p1" in plan.active and "p1" not in plan.completed
    assert weights == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0])


def test_new_prompt_mid_blend_starts_from_the_blended_text_and_completes_the_old_event():
    d = director()
    d.submit(Interaction("p1", prompt="a desert", transition_chunks=2))
    d.plan_block()  # forest 0.5, desert 0.5
    d.submit(Interaction("p2", prompt="the sea", transition_chunks=2))
    plan = d.plan_block()
    assert "p1" in plan.completed and plan.started == ("p2",)
    assert dict(plan.prompt_mix) == pytest.approx({"a forest": 0.25, "a desert": 0.25, "the sea": 0.5})


def test_velocity_moves_every_latent_frame_until_replaced():
    d = director()
    d.submit(Interaction("v1", camera=CameraCommand("velocity", translation=(0.0, 0.0, 0.5))))
    plan = d.plan_block()
    assert [p.translation[2] for p in plan.poses] == pytest.approx([0.5, 1.0, 1.5])
    plan = d.plan_block()
    assert plan.poses[-1].translation[2] == pytest.approx(3.0) and plan.active == ("v1",) and plan.completed == ()
    d.submit(Interaction("v2", camera=CameraCommand("velocity", translation=(0.1, 0.0, 0.0))))
    plan = d.plan_block()
    assert plan.completed == ("v1",) and plan.started == ("v2",)
    assert plan.poses[-1].translation[0] == pytest.approx(0.3)


def test_target_reaches_the_pose_after_transition_chunks_then_completes():
    d = director()
    yaw = tuple(quat_axis_angle(1, math.pi / 2).tolist())
    d.submit(Interaction("t1", camera=CameraCommand("target", (3.0, 0.0, 6.0), yaw), transition_chunks=2))
    first = d.plan_block()
    assert first.poses[-1].translation == pytest.approx((1.5, 0.0, 3.0))
    second = d.plan_block()
    assert second.poses[-1].translation == pytest.approx((3.0, 0.0, 6.0))
    assert np.allclose(second.poses[-1].rotation, yaw) and second.completed == ("t1",)


def test_keyboard_actions_move_in_the_camera_frame_one_frame_at_a_time():
    d = director()
    d.plan_block()
    d.submit(Interaction("k1", actions=(("l",),) * 30))  # turn right 90 degrees over 30 frames
    for _ in range(10):
        d.plan_block()
    d.submit(Interaction("k2", actions=(("w",), ("w",), ())))
    plan = d.plan_block()
    assert plan.started == ("k2",) and plan.completed == ("k2",)
    # Facing +X after the turn, "w" moves along world +X.
    assert plan.poses[-1].translation == pytest.approx((0.2, 0.0, 0.0), abs=1e-9)


def test_queued_actions_play_in_order_across_blocks():
    d = director()
    d.submit(Interaction("a", actions=(("w",),) * 4))
    d.submit(Interaction("b", actions=(("s",),) * 2))
    p1, p2 = d.plan_block(), d.plan_block()
    assert p1.started == ("a",) and p1.active == ("a",) and p1.completed == ()
    assert p2.started == ("b",) and p2.completed == ("a", "b")
    z = [p.translation[2] for p in p1.poses + p2.poses]
    assert z == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.3, 0.2])


@pytest.mark.parametrize(
    "event, reason",
    [
        (Interaction("x"), "needs a prompt"),
        (Interaction("x", prompt="   "), "non-blank"),
        (Interaction("", prompt="a"), "non-empty"),
        (Interaction("x", prompt="a", transition_chunks=-1), ">= 0"),
        (Interaction("x", prompt="a", transition_chunks=True), "integer"),
        (Interaction("x", actions=(("q",),)), "unknown key 'q'"),
        (Interaction("x", actions=()), "at least one"),
        (Interaction("x", camera=CameraCommand("orbit")), "'velocity' or 'target'"),
        (Interaction("x", camera=CameraCommand("target", rotation=(0, 0, 0, 0))), "non-zero"),
    ],
)
def test_bad_interactions_are_refused_with_the_reason(event, reason):
    d = director()
    with pytest.raises(InteractionRefused, match=reason):
        d.submit(event)
    assert d.pending_ids == ()


def test_camera_on_a_model_without_adapter_is_refused_and_prompts_still_work():
    d = director(camera=False)
    with pytest.raises(InteractionRefused, match="no camera adapter"):
        d.submit(Interaction("c", actions=(("w",),)))
    d.submit(Interaction("c", prompt="a desert"))  # a refused id may be reused
    assert d.plan_block().prompt_mix == (("a desert", 1.0),)


def test_event_ids_are_unique_per_session():
    d = director()
    d.submit(Interaction("e", prompt="one"))
    with pytest.raises(EventIdConflict):
        d.submit(Interaction("e", prompt="two"))


def test_plucker_rays_encode_direction_and_moment():
    pose = Pose((1.0, 2.0, 0.0))
    rays = plucker_rays([Pose(), pose], height=16, width=16)
    assert rays.shape == (6, 2, 16, 16)
    d = rays[3:, 1]
    assert np.allclose(np.linalg.norm(d, axis=0), 1.0, atol=1e-6)
    assert (d[2] > 0).all()  # every ray looks forward (+Z)
    assert np.allclose(rays[:3, 0], 0.0)  # at the origin the moment vanishes
    moment = np.cross(np.array(pose.translation)[:, None, None], d, axis=0)
    assert np.allclose(rays[:3, 1], moment, atol=1e-6)


def test_key_motion_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown key"):
        KeyMotion().delta(("x",))
