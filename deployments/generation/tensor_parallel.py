"""Tensor parallel for the stock WanTransformer3DModel, with torch's own TP API.

Every block is sharded Megatron-style with `parallelize_module`: the q/k/v
projections of self- and cross-attention column-wise (each rank holds
heads / N whole heads), `to_out[0]` row-wise (one all-reduce per attention),
the FFN's first linear column-wise and its second row-wise (one all-reduce).
Module outputs stay local tensors, so the rest of the block (norms,
modulation, residuals) and everything outside the blocks (patch embedding,
camera adapter, time/text embedders, output head) run replicated, unchanged.

The one trap: Wan's `norm_q` / `norm_k` are RMSNorms over all heads together
(`rms_norm_across_heads`). With heads sharded a rank sees only its slice, so
they are replaced by `HeadShardedRMSNorm`, which all-reduces the sum of
squares (one scalar per token) and applies its own slice of the weight.

The attention processors reshape with -1 heads and so run on a rank's share
of the heads unchanged; the session's KV cache holds only those heads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from deployments.generation.geometry import CheckpointError


@dataclass(frozen=True)
class TensorParallel:
    """Where this process sits in a 1-D tensor-parallel group; every rank builds the same engine."""

    mesh: DeviceMesh

    @property
    def rank(self) -> int:
        return self.mesh.get_local_rank()

    @property
    def world_size(self) -> int:
        return self.mesh.size()

    @property
    def group(self) -> dist.ProcessGroup:
        return self.mesh.get_group()

    @property
    def device_type(self) -> str:
        return self.mesh.device_type

    @classmethod
    def from_default_group(cls, device_type: str = "cpu") -> TensorParallel:
        """A mesh over every rank of the already initialized default process group."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call TensorParallel.initialize or init_process_group first")
        return cls(init_device_mesh(device_type, (dist.get_world_size(),)))

    @classmethod
    def initialize(
        cls,
        rank: int,
        world_size: int,
        init_method: str,
        device_type: str = "cpu",
        backend: str | None = None,
        timeout: timedelta | None = None,
    ) -> TensorParallel:
        """Join the default process group (gloo on CPU, nccl on CUDA) and build the mesh over it.

        `init_method` is what `init_process_group` takes: "tcp://host:port" or
        "file:///path". On CUDA the caller sets the rank's device first.
        """
        if not dist.is_initialized():
            backend = backend or ("nccl" if device_type == "cuda" else "gloo")
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
        tp = cls.from_default_group(device_type)
        if (tp.rank, tp.world_size) != (rank, world_size):
            raise RuntimeError(f"process group is rank {tp.rank} of {tp.world_size}, expected rank {rank} of {world_size}")
        return tp


def check_shardable(config: dict, world_size: int) -> None:
    """Refuse, before any weight is loaded, a transformer whose heads or FFN do not split evenly."""
    if world_size < 1:
        raise ValueError(f"tensor parallel world size must be >= 1, got {world_size}")
    heads = config.get("num_attention_heads")
    ffn = config.get("ffn_dim")
    if heads is None or heads % world_size:
        raise CheckpointError(
            f"tensor parallel over {world_size} ranks needs the attention heads to divide evenly, "
            f"but transformer/config.json has num_attention_heads={heads}"
        )
    if ffn is None or ffn % world_size:
        raise CheckpointError(
            f"tensor parallel over {world_size} ranks needs the FFN width to divide evenly, "
            f"but transformer/config.json has ffn_dim={ffn}"
        )


class HeadShardedRMSNorm(nn.Module):
    """An RMSNorm over all heads, for a rank that holds a contiguous slice of them.

    The mean square is taken over the full width: the local sum of squares is
    all-reduced across the group, then each rank scales its own slice with its
    slice of the weight. Computed in float32, cast back to the input dtype.
    """

    def __init__(self, norm: nn.RMSNorm, tp: TensorParallel) -> None:
        super().__init__()
        (full,) = tuple(norm.normalized_shape)
        if full % tp.world_size:
            raise ValueError(f"RMSNorm width {full} does not split over {tp.world_size} ranks")
        local = full // tp.world_size
        self.full_dim, self.local_dim = full, local
        self.eps = norm.eps
        self.group = tp.group
        weight = None
        if norm.weight is not None:
            weight = nn.Parameter(norm.weight.detach()[tp.rank * local : (tp.rank + 1) * local].clone(), requires_grad=False)
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.local_dim:
            raise ValueError(f"expected the local slice of {self.local_dim} channels, got {x.shape[-1]}")
        xf = x.float()
        sum_sq = xf.pow(2).sum(-1, keepdim=True)
        dist.all_reduce(sum_sq, op=dist.ReduceOp.SUM, group=self.group)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        out = xf * torch.rsqrt(sum_sq / self.full_dim + eps)
        if self.weight is not None:
            out = out * self.weight.float()
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.local_dim} of {self.full_dim}, eps={self.eps}"


def _attention_plan(prefix: str, attn: nn.Module) -> dict:
    if hasattr(attn, "to_qkv") or hasattr(attn, "to_kv"):
        raise ValueError(f"{prefix} has fused projections; shard before fusing (or unfuse)")
    plan = {
        f"{prefix}.to_q": ColwiseParallel(),
        f"{prefix}.to_k": ColwiseParallel(),
        f"{prefix}.to_v": ColwiseParallel(),
        f"{prefix}.to_out.0": RowwiseParallel(),
    }
    if getattr(attn, "add_k_proj", None) is not None:  # Wan 2.1 image-to-video image K/V
        plan[f"{prefix}.add_k_proj"] = ColwiseParallel()
        plan[f"{prefix}.add_v_proj"] = ColwiseParallel()
    return plan


def _ffn_plan(prefix: str, ffn: nn.Module) -> dict:
    # diffusers FeedForward: net = [GELU(proj=Linear dim->inner), Dropout, Linear inner->dim, (Dropout)]
    first = getattr(ffn.net[0], "proj", None)
    if not isinstance(first, nn.Linear) or not isinstance(ffn.net[2], nn.Linear):
        raise TypeError(f"{prefix} is not a diffusers FeedForward with net.0.proj and net.2 linears")
    return {f"{prefix}.net.0.proj": ColwiseParallel(), f"{prefix}.net.2": RowwiseParallel()}


def _shard_norms(attn: nn.Module, tp: TensorParallel) -> None:
    for name in ("norm_q", "norm_k", "norm_added_k"):
        norm = getattr(attn, name, None)
        if norm is None or isinstance(norm, nn.Identity):
            continue
        if not isinstance(norm, nn.RMSNorm):
            raise TypeError(f"cannot shard {type(norm).__name__} {name}: expected an RMSNorm across heads")
        setattr(attn, name, HeadShardedRMSNorm(norm, tp))


def shard_transformer(transformer: nn.Module, tp: TensorParallel) -> nn.Module:
    """Shard every block of a stock WanTransformer3DModel over `tp`'s mesh, in place; returns it.

    Every rank must hold the same full weights (each loads the checkpoint):
    shards are cut from the local copy, with no broadcast from rank 0.
    """
    config = transformer.config
    check_shardable(dict(config), tp.world_size)
    if tp.world_size == 1:
        return transformer
    param_device = next(transformer.parameters()).device.type
    if param_device != tp.device_type:
        raise ValueError(f"transformer is on {param_device} but the tensor-parallel mesh is on {tp.device_type}")
    for block in transformer.blocks:
        plan = _attention_plan("attn1", block.attn1) | _attention_plan("attn2", block.attn2) | _ffn_plan("ffn", block.ffn)
        parallelize_module(block, tp.mesh, plan, src_data_rank=None)
        for attn in (block.attn1, block.attn2):
            _shard_norms(attn, tp)
            attn.heads = attn.heads // tp.world_size  # what this rank holds, for anyone who reads it
    return transformer
