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


class AcceleratorError(RuntimeError):
    """The config asks for GPUs the cluster does not have."""


def use_gpus(config: AppConfig, cluster_gpus: float) -> bool:
    """`auto` takes GPUs only where the cluster has them, so a laptop never waits for one forever."""
    need = config.tensor_parallel_size * config.num_replicas
    if config.accelerator == "cpu":
        return False
    if config.accelerator == "gpu":
        if cluster_gpus < config.tensor_parallel_size:
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
    if gpus:
        # Bundle 0 for the replica, one GPU bundle per tensor-parallel rank, all on one node.
        options["ray_actor_options"] = {"num_cpus": config.replica_cpus, "num_gpus": 0}
        options["placement_group_bundles"] = [{"CPU": config.replica_cpus}] + [{"GPU": 1}] * config.tensor_parallel_size
        options["placement_group_strategy"] = "STRICT_PACK"
    else:
        options["ray_actor_options"] = {"num_cpus": config.replica_cpus}
    return options


def understanding_options(config: AppConfig, gpus: bool) -> dict[str, Any]:
    options = session_deployment_options(config, config.num_understanding_replicas, "run_chat")
    options["ray_actor_options"] = {"num_cpus": config.replica_cpus, "num_gpus": 1 if gpus else 0}
    return options


def ingress_options(config: AppConfig) -> dict[str, Any]:
    # Each open WebSocket holds one slot: the default of 5 would queue the sixth viewer.
    return {"max_ongoing_requests": config.ingress_max_ongoing_requests, "ray_actor_options": {"num_cpus": 0}}


def build_app(args: dict[str, Any] | AppConfig | None = None) -> Application:
    import ray

    from deployments.ingress.app import VideoIngress
    from deployments.understanding.server import UnderstandingServer
    from deployments.world_model.server import WorldModelServer

    config = args if isinstance(args, AppConfig) else AppConfig.model_validate(args or {})
    cluster_gpus = ray.cluster_resources().get("GPU", 0.0) if ray.is_initialized() else 0.0
    gpus = use_gpus(config, cluster_gpus)
    replica_config = config.for_replicas()
    world = serve.deployment(WorldModelServer, name="WorldModel").options(**world_model_options(config, gpus)).bind(replica_config)
    understanding = None
    if config.understanding_model is not None:
        understanding = (
            serve.deployment(UnderstandingServer, name="Understanding")
            .options(**understanding_options(config, gpus))
            .bind(replica_config)
        )
    return VideoIngress.options(**ingress_options(config)).bind(replica_config, world, understanding)
