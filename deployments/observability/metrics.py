"""Prometheus metrics through Ray Serve (`ray.serve.metrics`), one small object per replica.

Serve adds the deployment, replica and application tags; Ray's metrics agent
exports everything with a `ray_` prefix on each node's metrics port. Metric
objects are created inside the replica that records them (never at import).
"""

from __future__ import annotations

from ray.serve import metrics

LATENCY_BOUNDARIES = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]


class ReplicaMetrics:
    """Recorded by the session replicas (WorldModel, Understanding)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        tags = ("endpoint",)
        self._starts = metrics.Counter("rtv_session_starts", "Sessions asked of this replica, by outcome.", tag_keys=tags + ("outcome",))
        self._active = metrics.Gauge("rtv_sessions_active", "Sessions this replica holds.", tag_keys=tags)
        self._free = metrics.Gauge("rtv_slots_free", "Session slots this replica has free.", tag_keys=tags)
        self._first_chunk = metrics.Histogram(
            "rtv_time_to_first_chunk_seconds", "From a session's start on the replica to its first chunk.", LATENCY_BOUNDARIES, tag_keys=tags
        )
        self._block = metrics.Histogram("rtv_block_latency_seconds", "Time to generate one block.", LATENCY_BOUNDARIES, tag_keys=tags)
        self._frames = metrics.Counter("rtv_frames_generated", "Video frames generated.", tag_keys=tags)
        self._interactions = metrics.Counter("rtv_interactions", "Interactions by outcome.", tag_keys=tags + ("outcome",))
        for gauge in (self._active, self._free):
            gauge.set_default_tags({"endpoint": endpoint})
        for metric in (self._starts, self._first_chunk, self._block, self._frames, self._interactions):
            metric.set_default_tags({"endpoint": endpoint})

    def session_start(self, outcome: str) -> None:
        self._starts.inc(tags={"outcome": outcome})

    def slots(self, active: int, free: int) -> None:
        self._active.set(active)
        self._free.set(free)

    def first_chunk(self, seconds: float) -> None:
        self._first_chunk.observe(seconds)

    def block(self, seconds: float, frames: int) -> None:
        self._block.observe(seconds)
        self._frames.inc(frames)

    def interaction(self, outcome: str) -> None:
        self._interactions.inc(tags={"outcome": outcome})


class IngressMetrics:
    """Recorded by the ingress: what clients were told, and what the frame filter did."""

    def __init__(self) -> None:
        self._errors = metrics.Counter("rtv_errors", "Error messages sent to clients, by endpoint and code.", tag_keys=("endpoint", "code"))
        self._interactions = metrics.Counter("rtv_interactions", "Interactions by outcome.", tag_keys=("endpoint", "outcome"))
        self._evs = metrics.Counter("rtv_evs_frames", "Frames the near-duplicate filter kept or dropped.", tag_keys=("decision",))

    def error(self, endpoint: str, code: str | None) -> None:
        self._errors.inc(tags={"endpoint": endpoint, "code": code or "none"})

    def interaction(self, endpoint: str, outcome: str) -> None:
        self._interactions.inc(tags={"endpoint": endpoint, "outcome": outcome})

    def evs(self, kept: bool) -> None:
        self._evs.inc(tags={"decision": "kept" if kept else "dropped"})
