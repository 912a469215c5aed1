"""Shared fixtures: tiny checkpoints built once per test session, never downloaded."""

from __future__ import annotations

import os
from contextlib import contextmanager

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest


@pytest.fixture(scope="session")
def world_model_dir(tmp_path_factory):
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model

    return make_world_model(tmp_path_factory.mktemp("models") / "world-model", WorldModelSpec())


@pytest.fixture(scope="session")
def i2v_model_dir(tmp_path_factory):
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model

    spec = WorldModelSpec(image_conditioned=True)
    return make_world_model(tmp_path_factory.mktemp("models") / "world-model-i2v", spec)


@pytest.fixture(scope="session")
def plain_model_dir(tmp_path_factory):
    """No camera adapter, and a short window so a few blocks roll it."""
    from deployments.models.tiny_world_model import WorldModelSpec, make_world_model

    spec = WorldModelSpec(camera_adapter=False, sliding_window_num_frames=6)
    return make_world_model(tmp_path_factory.mktemp("models") / "world-model-plain", spec)


@pytest.fixture(scope="session")
def engine(world_model_dir):
    from deployments.generation.engine import WorldModelEngine

    return WorldModelEngine.from_pretrained(world_model_dir)


_REPORTS = pytest.StashKey[list]()


def pytest_configure(config):
    config.stash[_REPORTS] = []


@pytest.fixture
def report(request):
    """`report(line)`: a line for the run's summary (fuzz example counts, leak and load readings)."""
    return request.config.stash[_REPORTS].append


def pytest_terminal_summary(terminalreporter, config):
    lines = config.stash.get(_REPORTS, [])
    if lines:
        terminalreporter.section("reports")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def omni_dir(tmp_path_factory):
    """The tiny understanding model (Qwen2.5-Omni thinker layout), built once per test run."""
    from deployments.models.tiny_vlm import make_tiny_vlm

    return make_tiny_vlm(tmp_path_factory.mktemp("models") / "omni")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_metrics_port():
    return _free_port()


@pytest.fixture(scope="session")
def serve_address(ray_metrics_port):
    """One Ray instance and one Serve HTTP proxy for every test that serves; apps come per module."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(
            num_cpus=16,
            num_gpus=4,
            include_dashboard=False,
            log_to_driver=False,
            _metrics_export_port=ray_metrics_port,
            _system_config={"metrics_report_interval_ms": 1000},  # metrics reach the endpoint within seconds
        )
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def metrics_url(serve_address, ray_metrics_port):
    """Prometheus text of this node's Ray metrics agent (Serve application metrics included)."""
    return f"http://127.0.0.1:{ray_metrics_port}/metrics"


@contextmanager
def deployed(name: str, prefix: str, args: dict):
    """The app built from `args`, served as `name` under `prefix` for the length of the block."""
    from ray import serve

    from deployments.app import build_app

    serve.run(build_app(args), name=name, route_prefix=prefix)
    try:
        yield
    finally:
        serve.delete(name)


def wait_for(predicate, timeout: float, interval: float = 0.2):
    """Poll `predicate` until it returns something truthy or `timeout` passes; its last value."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def chat_app_args(model_dir, omni_dir, **overrides) -> dict:
    """`app_args` with the tiny understanding model, answering in a few tokens."""
    return app_args(model_dir, **{"understanding_model": str(omni_dir), "chat_min_new_tokens": 2, "chat_max_new_tokens": 4, **overrides})


def app_args(model_dir, **overrides) -> dict:
    """`build_app` arguments for a test app: CPU only, no understanding model unless asked, nothing built on the fly."""
    return {
        "model": str(model_dir),
        "build_tiny_models": False,
        "accelerator": "cpu",
        "replica_cpus": 0,
        "understanding_model": None,
        **overrides,
    }
