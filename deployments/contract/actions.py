"""Held keys over time: a session's `multi_modal_data.actions` and a whole action script.

One parser for every place that reads them: the WebSocket protocol, the
`/v1/videos` jobs API and the `rtv` commands that read a script from a file.
Errors are ValueError naming the offending entry, so each caller adds only its
own prefix.
"""

from __future__ import annotations

import re
from typing import Any

from deployments.contract.keys import KEYS

KEY_LIST = " ".join(sorted(KEYS))

Actions = tuple[tuple[str, ...], ...]  # one set of held keys per latent frame


def _json_type(value: object) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def parse_actions(payload: Any) -> Actions:
    """`[[keys of latent frame 0], [keys of frame 1], ...]`; an empty inner list is a frame with no key held."""
    if not isinstance(payload, list) or not payload:
        raise ValueError("actions must be a non-empty list of per-latent-frame key lists")
    frames = []
    for i, frame in enumerate(payload):
        if not isinstance(frame, list):
            raise ValueError(f"actions[{i}] must be a list of keys, got a JSON {_json_type(frame)}")
        for key in frame:
            if not isinstance(key, str) or key not in KEYS:
                raise ValueError(f"actions[{i}] has unknown key {repr(key)[:32]}; keys are {KEY_LIST}")
        frames.append(tuple(frame))
    return tuple(frames)


def parse_action_script(script: Any, frames_per_block: int, num_blocks: int | None = None, *, name: str = "actions") -> Actions:
    """An action script (`examples/actions.json`: one entry per block, each `frames_per_block` lists of keys),
    flattened to one key set per latent frame. Raises ValueError naming the entry, as `name[block][frame]`."""
    shape = f"a list with one entry per block, each a list of {frames_per_block} per-latent-frame lists of keys"
    if not isinstance(script, list):
        raise ValueError(f"{name}: must be {shape}, got a JSON {_json_type(script)}")
    if not script:
        raise ValueError(f"{name}: must be {shape}, got no blocks")
    if num_blocks is not None and len(script) > num_blocks:
        raise ValueError(f"{name}: {len(script)} blocks of actions for a video of {num_blocks} blocks")
    frames = []
    for b, block in enumerate(script):
        if not isinstance(block, list) or len(block) != frames_per_block:
            got = f"{len(block)} latent frames" if isinstance(block, list) else f"a JSON {_json_type(block)}"
            raise ValueError(f"{name}[{b}]: must be a list of {frames_per_block} per-latent-frame lists of keys "
                             f"(the model's frames per block), got {got}")
        frames.extend(block)
    try:
        return parse_actions(frames)
    except ValueError as exc:
        # parse_actions counts latent frames over the whole script: name the block too.
        def label(m: re.Match) -> str:
            index = int(m.group(1))
            return f"{name}[{index // frames_per_block}][{index % frames_per_block}]"

        raise ValueError(re.sub(r"actions\[(\d+)\]", label, str(exc), count=1)) from None


def by_block(actions: Actions, frames_per_block: int) -> list[Actions]:
    """A flat script cut back into its blocks."""
    return [actions[i : i + frames_per_block] for i in range(0, len(actions), frames_per_block)]
