"""Serve options computed from the one config: the same function serves `serve run`, tests and KubeRay."""

import pytest

from deployments.app import (
    AcceleratorError,
    ingress_options,
    understanding_gpus,
    use_gpus,
    world_model_options,
)
from deployments.config import AppConfig


def test_auto_takes_gpus_only_where_the_cluster_has_them():
    assert use_gpus(AppConfig(), 0) is False
    assert use_gpus(AppConfig(), 1) is True
    assert use_gpus(AppConfig(tensor_parallel_size=2), 1) is False
    assert use_gpus(AppConfig(accelerator="cpu"), 8) is False


def test_gpu_without_gpus_fails_with_a_clear_message_unless_told_to_wait():
    with pytest.raises(AcceleratorError, match="asks for 2 GPU\\(s\\) per replica .* the Ray cluster has 0"):
        use_gpus(AppConfig(accelerator="gpu", tensor_parallel_size=2), 0)
    assert use_gpus(AppConfig(accelerator="gpu", require_gpus_at_deploy=False), 0) is True


def test_tensor_parallel_replicas_get_one_bundle_per_rank_strictly_packed():
    options = world_model_options(AppConfig(tensor_parallel_size=4, replica_cpus=2), gpus=True)
    assert options["placement_group_bundles"] == [{"CPU": 2}] + [{"GPU": 1}] * 4
    assert options["placement_group_strategy"] == "STRICT_PACK"
    assert options["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0}
    cpu = world_model_options(AppConfig(tensor_parallel_size=2, replica_cpus=0), gpus=False)
    assert cpu["placement_group_bundles"] == [{"CPU": 0.01}, {"CPU": 0.01}, {"CPU": 0.01}]
    single = world_model_options(AppConfig(), gpus=True)
    assert "placement_group_bundles" not in single and single["ray_actor_options"]["num_gpus"] == 1


def test_sessions_are_routed_by_free_slots_and_drain_as_long_as_a_session_lasts():
    options = world_model_options(AppConfig(graceful_shutdown_timeout_s=900), gpus=False)
    router = options["request_router_config"]
    assert router["request_router_class"].endswith(":FreeSlotsRouter")
    assert router["request_router_kwargs"] == {"session_method": "run_session"}
    assert options["graceful_shutdown_timeout_s"] == 900
    ingress = ingress_options(AppConfig(graceful_shutdown_timeout_s=900))
    assert ingress["graceful_shutdown_timeout_s"] == 900 and ingress["max_ongoing_requests"] >= 100


def test_autoscaling_replaces_a_fixed_replica_count():
    options = world_model_options(AppConfig(min_replicas=1, max_replicas=4, num_replicas=2), gpus=False)
    assert "num_replicas" not in options
    scaling = options["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"], scaling["initial_replicas"]) == (1, 4, 2)
    assert scaling["policy"]["policy_function"].endswith(":SessionAutoscalingPolicy")
    with pytest.raises(ValueError, match="min_replicas 3 is above max_replicas 2"):
        AppConfig(min_replicas=3, max_replicas=2)


def test_understanding_gets_a_gpu_only_when_one_is_left():
    assert understanding_gpus(AppConfig(), True, 1) is False
    assert understanding_gpus(AppConfig(), True, 2) is True
    assert understanding_gpus(AppConfig(accelerator="gpu"), True, 0) is True
    assert understanding_gpus(AppConfig(), False, 8) is False
