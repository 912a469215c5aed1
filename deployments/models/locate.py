"""`model:` / `--model` as a folder here, or as a Hugging Face hub id resolved through the hub's cache."""

from __future__ import annotations

import os
import re
from pathlib import Path

from deployments.generation.geometry import CheckpointError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_TRUE = {"1", "true", "yes", "on"}


def hub_offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def locate_model(spec: str | os.PathLike) -> Path:
    """A folder that exists is taken as it is; otherwise `org/name` is a hub id, fetched (or, offline, found
    in the cache). Raises CheckpointError naming what was tried."""
    path = Path(spec).expanduser()
    if path.exists():
        return path.resolve()
    text = str(spec)
    if not HUB_ID.match(text):
        raise CheckpointError(f"model folder {path} does not exist")
    from huggingface_hub import snapshot_download

    offline = hub_offline()
    try:
        return Path(snapshot_download(text, local_files_only=offline))
    except Exception as exc:  # the hub raises many types: offline, not found, gated, network
        if offline:
            raise CheckpointError(
                f"model {text!r} is neither a folder here nor in the Hugging Face cache, and HF_HUB_OFFLINE is set: "
                f"download it where the hub is reachable (huggingface-cli download {text}) or give a folder"
            ) from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"model {text!r} is not a folder here and could not be fetched from the Hugging Face hub: {first}") from None
