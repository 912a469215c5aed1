"""The session autoscaling policy, fed the way Serve's controller feeds it."""

from types import SimpleNamespace

from deployments.scaling.sessions_policy import SessionAutoscalingPolicy


def ctx(active, capacity=2, refused=None, replicas=("r1",), lowest=1, highest=4):
    metrics = {
        "active_sessions": dict(zip(replicas, active)),
        "session_capacity": {r: capacity for r in replicas},
        "refused_sessions": dict(zip(replicas, refused or [0] * len(replicas))),
    }
    return SimpleNamespace(
        aggregated_metrics=metrics,
        running_replicas=list(replicas),
        capacity_adjusted_min_replicas=lowest,
        capacity_adjusted_max_replicas=highest,
    )


def test_enough_replicas_for_the_sessions_within_bounds():
    policy = SessionAutoscalingPolicy()
    assert policy(ctx([2]))[0] == 1
    assert policy(ctx([2, 1], replicas=("a", "b")))[0] == 2
    assert policy(ctx([2, 2, 2], replicas=("a", "b", "c"), highest=2))[0] == 2
    assert policy(ctx([0, 0], replicas=("a", "b")))[0] == 1  # idle: back to the minimum (Serve drains)


def test_refused_sessions_and_headroom_bring_a_replica_up():
    assert SessionAutoscalingPolicy()(ctx([2], refused=[3]))[0] == 2
    assert SessionAutoscalingPolicy(headroom_sessions=1)(ctx([2]))[0] == 2
    assert SessionAutoscalingPolicy(headroom_sessions=1)(ctx([1]))[0] == 1


def test_replicas_that_left_do_not_count():
    c = ctx([2, 2], replicas=("a", "b"))
    c.running_replicas = ["a"]
    target, state = SessionAutoscalingPolicy()(c)
    assert target == 1 and state["active_sessions"] == 2
