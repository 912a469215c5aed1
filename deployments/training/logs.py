"""Training logs: one JSON record per line, to a file and to the terminal."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def jsonl_logger(path: Path, echo: Callable[[str], None] = print) -> Callable[[dict], None]:
    def log(record: dict) -> None:
        line = json.dumps(record)
        with open(path, "a") as f:
            f.write(line + "\n")
        echo(line)

    return log
