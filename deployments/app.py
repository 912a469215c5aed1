"""Build the Serve application from one `AppConfig`.

`serve run serve_config.yaml` calls `build_app(args)`; KubeRay's RayService
carries the same YAML; tests call it directly. Every Serve option is computed
here from the config, so the three never drift apart.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from deployments.config import AppConfig

ROUTER_PATH = "deployments.routing.free_slots:FreeSlotsRouter"
AUTOSCALING_POLICY_PATH = "deployments.scaling.sessions_policy:SessionAutoscalingPolicy"


class AcceleratorError(RuntimeError):
    """The config asks for GPUs the cluster does not have."""


def use_gpus(config: AppConfig, cluster_gpus: float) -> bool:
    """`auto` takes GPUs only where the cluster has them, so a laptop never waits for one forever."""
    need = config.tensor_parallel_size * config.num_replicas
    if config.accelerator == "cpu":
        return False
    if config.accelerator == "gpu":
        if config.require_gpus_at_deploy and cluster_gpus < config.tensor_parallel_size:
            raise AcceleratorError(
                f"accelerator: gpu asks for {config.tensor_parallel_size} GPU(s) per replica "
                f"({need} for {config.num_replicas} replicas) but the Ray cluster has {cluster_gpus:g}"
            )
        return True
    return cluster_gpus >= config.tensor_parallel_size


def session_deployment_options(config: AppConfig, num_replicas: int, session_method: str) -> dict[str, Any]:
    """What every deployment that pins sessions shares: routing by free slots, long graceful drains."""
    return {
        "num_replicas": num_replicas,
        # Sessions are refused by the replica itself when its slots are full; Serve's own cap only
        # has to leave room for them and for small calls like `stats`.
        "max_ongoing_requests": 1000,
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
        "graceful_shutdown_wait_loop_s": 1.0,
        "request_router_config": {
            "request_router_class": ROUTER_PATH,
            "request_router_kwargs": {"session_method": session_method},
            "request_routing_stats_period_s": config.routing_stats_period_s,
            "request_routing_stats_timeout_s": max(5.0, 5 * config.routing_stats_period_s),
        },
    }


def world_model_options(config: AppConfig, gpus: bool) -> dict[str, Any]:
    options = session_deployment_options(config, config.num_replicas, "run_session")
    if config.autoscaling:
        del options["num_replicas"]
        lowest = config.min_replicas or 1
        options["autoscaling_config"] = {
            "min_replicas": lowest,
            "max_replicas": config.max_replicas,
            "initial_replicas": max(lowest, min(config.num_replicas, config.max_replicas)),
            "metrics_interval_s": 1.0,
            "look_back_period_s": 2.0,
            "upscale_delay_s": 0.0,
            "downscale_delay_s": config.autoscaling_downscale_delay_s,
            "policy": {
                "policy_function": AUTOSCALING_POLICY_PATH,
                "policy_kwargs": {"headroom_sessions": config.autoscaling_headroom_sessions},
            },
        }
    if config.tensor_parallel_size > 1:
        # Bundle 0 for the replica, one bundle per tensor-parallel rank (a GPU each where there are
        # GPUs), all on one node: the ranks talk over NCCL/gloo within it.
        rank_bundle = {"GPU": 1} if gpus else {"CPU": 0.01}
        options["ray_actor_options"] = {"num_cpus": config.replica_cpus, "num_gpus": 0}
        options["placement_group_bundles"] = [{"CPU": max(config.replica_cpus, 0.01)}] + [rank_bundle] * config.tensor_parallel_size
        options["placement_group_strategy"] = "STRICT_PACK"
    else:
        options["ray_actor_options"] = {"num_cpus": config.replica_cpus, "num_gpus": 1 if gpus else 0}
    return options


def understanding_gpus(config: AppConfig, world_gpus: bool, cluster_gpus: float) -> bool:
    """`auto` gives the understanding model a GPU only if one is left after the world model's."""
    if not world_gpus:
        return False
    if config.accelerator == "gpu":
        return True
    left = cluster_gpus - config.tensor_parallel_size * config.num_replicas
    return left >= config.num_understanding_replicas


def understanding_options(config: AppConfig, gpus: bool) -> dict[str, Any]:
    options = session_deployment_options(config, config.num_understanding_replicas, "run_chat")
    options["ray_actor_options"] = {"num_cpus": config.replica_cpus, "num_gpus": 1 if gpus else 0}
    return options


def ingress_options(config: AppConfig) -> dict[str, Any]:
    # Each open WebSocket holds one slot: the default of 5 would queue the sixth viewer. A draining
    # ingress keeps its WebSockets as long as a session may last.
    return {
        "num_replicas": config.num_ingress_replicas,
        "max_ongoing_requests": config.ingress_max_ongoing_requests,
        "graceful_shutdown_timeout_s": config.graceful_shutdown_timeout_s,
        "ray_actor_options": {"num_cpus": 0},
    }


def jobs_options(config: AppConfig) -> dict[str, Any]:
    # Exactly one: it is the only writer of the jobs' SQLite file. Waiting callers (sync renders) and
    # downloads each hold a request slot.
    return {"num_replicas": 1, "max_ongoing_requests": 1000, "ray_actor_options": {"num_cpus": 0}}


def key_sessions_options() -> dict[str, Any]:
    # Exactly one: it is the count every ingress replica shares (soft state, rebuilt from their renewals).
    return {"num_replicas": 1, "max_ongoing_requests": 10000, "ray_actor_options": {"num_cpus": 0}}


def build_app(args: dict[str, Any] | AppConfig | None = None) -> Application:
    import ray

    from deployments.ingress.app import VideoIngress
    from deployments.jobs.server import VideoJobs
    from deployments.sessions.key_sessions_server import KeySessionsServer
    from deployments.understanding.server import UnderstandingServer
    from deployments.world_model.server import WorldModelServer

    config = args if isinstance(args, AppConfig) else AppConfig.model_validate(args or {})
    cluster_gpus = ray.cluster_resources().get("GPU", 0.0) if ray.is_initialized() else 0.0
    gpus = use_gpus(config, cluster_gpus)
    world = serve.deployment(WorldModelServer, name="WorldModel").options(**world_model_options(config, gpus)).bind(config)
    understanding = None
    if config.understanding_model is not None:
        understanding = (
            serve.deployment(UnderstandingServer, name="Understanding")
            .options(**understanding_options(config, understanding_gpus(config, gpus, cluster_gpus)))
            .bind(config)
        )
    jobs = None
    if config.jobs_db_path is not None:
        jobs = serve.deployment(VideoJobs, name="VideoJobs").options(**jobs_options(config)).bind(config, world)
    key_sessions = None
    if config.max_sessions_per_key is not None:
        key_sessions = serve.deployment(KeySessionsServer, name="KeySessions").options(**key_sessions_options()).bind(config)
    return VideoIngress.options(**ingress_options(config)).bind(config, world, understanding, jobs, key_sessions)
