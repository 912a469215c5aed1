"""One typed config drives the whole app: `serve run`, `serve build` and KubeRay read the same object."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The world model: a causal Wan checkpoint folder in the diffusers layout, or a hub id (org/name) resolved
    # through the Hugging Face cache (offline: the cache only).
    model: str = "models/world-model"
    served_model_name: str | None = None  # default: the folder's name
    # Build the tiny random-weight models into the model's parent folder when it is absent.
    build_tiny_models: bool = True

    # Defaults a session gets when it does not ask (the tiny models are sized for CPU).
    height: PositiveInt = 64
    width: PositiveInt = 64
    fps: PositiveInt = 16
    num_inference_steps: PositiveInt | None = None

    # Where and how replicas run.
    accelerator: Literal["auto", "cpu", "gpu"] = "auto"
    # With accelerator: gpu, refuse to deploy when the cluster has too few GPUs right now. A cluster whose
    # GPU nodes join later (KubeRay with the autoscaler) sets this false and lets the replicas wait.
    require_gpus_at_deploy: bool = True
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    vae_dtype: Literal["float32", "bfloat16", "float16"] | None = None  # None: the same as dtype
    # Which decoder turns latents into frames: the model's Wan VAE (exact), the tiny streaming decoder in the
    # model folder's `tiny_decoder/` (deployments/generation/tiny_decoder.py; much cheaper), or `auto`: the tiny
    # one when it was trained for the model (the built-in world model's), else the VAE.
    video_decoder: Literal["auto", "vae", "tiny"] = "auto"
    # Regional torch.compile of the transformer's repeated blocks (the KV cache is read and written outside
    # the graphs). The warm-up then runs every context length a session meets, so the compiling happens
    # before the replica says it is ready; worth it on GPUs, where it cuts the per-forward overhead.
    compile_transformer: bool = False
    tensor_parallel_size: PositiveInt = 1
    gpu_memory_fraction: float = Field(0.9, gt=0.0, le=1.0)
    num_replicas: PositiveInt = 1
    # Autoscaling on sessions: set max_replicas above min_replicas (num_replicas is then where it starts).
    min_replicas: PositiveInt | None = None
    max_replicas: PositiveInt | None = None
    autoscaling_headroom_sessions: int = Field(0, ge=0)  # free slots to keep ready for the next viewers
    autoscaling_downscale_delay_s: PositiveFloat = 60.0
    max_sessions_per_replica: PositiveInt | None = 4  # None: as many as the memory budget allows
    max_batch_sessions: PositiveInt = 8  # sessions of a replica denoised together in one forward, at most
    # Blocks of a throwaway session each replica runs at start (default size, every step: denoise, decode,
    # encode) before it says it is ready, so the first real session does not pay for first-call setup.
    # 0 turns it off.
    warmup_blocks: int = Field(default=2, ge=0, le=64)
    # Decode each block beside the next block's denoising; None: on GPU replicas, off on CPU ones.
    decode_beside_next_block: bool | None = None
    replica_cpus: float = Field(1.0, ge=0.0)
    torch_threads: PositiveInt | None = None

    # The understanding model (a Qwen2.5-Omni thinker or Qwen2.5-VL checkpoint); None: no chat endpoint.
    understanding_model: str | None = "models/omni"
    understanding_served_name: str | None = None
    num_understanding_replicas: PositiveInt = 1
    max_chat_sessions_per_replica: PositiveInt = 8
    chat_max_new_tokens: PositiveInt = 64
    # Random tiny models may stop at once; real ones need no floor.
    chat_min_new_tokens: PositiveInt | None = None
    chat_frame_max_side: PositiveInt = 448  # frames are kept no larger than this (the model resizes anyway)
    chat_config_timeout_s: PositiveFloat = 10.0
    # Sessions whose questions see every retained frame (num_sample_frames >= max_frames) keep their video
    # prefilled in the model's cache as frames arrive (Qwen2.5-Omni thinkers), so a question pays only for
    # its own text. The context starts over at the ring's oldest frame once it reaches this many frames
    # further back than the ring.
    chat_live_context: bool = True
    chat_context_rebuild_frames: PositiveInt = 8
    chat_idle_timeout_s: PositiveFloat = 60.0

    # Session life.
    max_session_seconds: PositiveFloat = 3600.0
    start_timeout_s: PositiveFloat = 10.0
    stall_timeout_s: PositiveFloat = 60.0
    lease_timeout_s: PositiveFloat = 15.0
    retry_after_s: PositiveFloat = 5.0
    # A session that starts while its model's replicas still load waits this long for one, then is told to retry.
    model_wait_s: PositiveFloat = 60.0
    routing_stats_period_s: PositiveFloat = 1.0
    # A draining replica keeps streaming its sessions this long before Serve stops it.
    graceful_shutdown_timeout_s: PositiveFloat = 3600.0
    ingress_max_ongoing_requests: PositiveInt = 1000
    num_ingress_replicas: PositiveInt = 1

    # Access. API keys (also from the RTV_API_KEYS environment variable, comma-separated); none: open.
    api_keys: list[str] = Field(default_factory=list)
    allowed_origins: list[str] | None = None  # browser Origins allowed to connect; None: any; same-origin always
    max_sessions_per_key: PositiveInt | None = None  # across every ingress replica (one KeySessions ledger)
    # Input limits per session (PROTOCOL.md's message sizes are fixed; these are rates).
    max_messages_per_second: PositiveFloat = 100.0  # any client message; bursts of twice that pass
    max_frames_per_second_in: PositiveFloat = 30.0  # chat video.frame messages
    # image_reference over http(s): only these hosts ("example.com", "*.example.com"); none: data URLs only.
    image_url_allowed_hosts: list[str] = Field(default_factory=list)
    image_url_allow_private_networks: bool = False  # loopback, private and link-local addresses
    image_url_max_bytes: PositiveInt = 10 * 1024 * 1024
    image_url_timeout_s: PositiveFloat = 10.0
    # Slow clients (README, "Slow clients"): generation waits while it is this far ahead of the position the
    # client confirms with session.playback; a reporting client stuck that long is dropped (client_too_slow).
    max_media_ahead_s: PositiveFloat = 30.0
    client_stalled_timeout_s: PositiveFloat = 20.0

    # Video jobs API (HTTP). OpenAI's /v1/videos, run by one VideoJobs replica that owns the records.
    # None: no jobs API (nothing written to disk). On a cluster, put both on storage that outlives the
    # node (a volume; the content may be an fsspec URL such as s3://bucket/videos).
    jobs_db_path: str | None = None  # SQLite file, e.g. state/jobs.db
    jobs_content_dir: str = "state/videos"  # a folder or an fsspec URL
    jobs_expiry_s: PositiveFloat = 86400.0  # a finished job and its video are removed this long after it ends
    max_queued_jobs: PositiveInt = 64  # jobs waiting for a session slot; beyond: 503 with Retry-After
    # Per API key (with api_keys set; each key sees only its own jobs): beyond, 429 naming the limit. None: no limit.
    jobs_in_flight_per_key: PositiveInt | None = 16  # queued or rendering
    jobs_stored_per_key: PositiveInt | None = 1000  # completed videos kept until they expire or are deleted
    jobs_stored_bytes_per_key: PositiveInt | None = 10 * 1024**3
    jobs_default_seconds: PositiveInt = 4  # OpenAI's default when a job gives neither seconds nor num_frames
    jobs_sync_timeout_s: PositiveFloat = 600.0  # POST /v1/videos/sync gives up waiting after this

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None and self.max_replicas > (self.min_replicas or 1)

    @model_validator(mode="after")
    def _replica_bounds(self) -> "AppConfig":
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}")
        return self

    @property
    def model_path(self) -> Path:
        return Path(self.model).expanduser().resolve()

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path.name

    @property
    def understanding_path(self) -> Path | None:
        return None if self.understanding_model is None else Path(self.understanding_model).expanduser().resolve()

    @property
    def understanding_name(self) -> str | None:
        path = self.understanding_path
        return None if path is None else self.understanding_served_name or path.name

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

