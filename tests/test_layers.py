"""The house's layering: the contract at the bottom imports nothing of ours; the protocol and the engine
import the contract and never each other (issue 16)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "deployments"


def imported(package: str) -> dict[str, set[str]]:
    """Per module of `deployments/<package>`, the `deployments.*` packages it imports (at any depth of the file)."""
    found = {}
    for path in sorted((ROOT / package).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[path.name] = {n.split(".")[1] for n in names if n.startswith("deployments.") and n.count(".") >= 1}
    return found


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("contract", {"contract"}),
        ("protocol", {"contract", "protocol", "jobs"}),  # jobs: the /v1/videos objects are built from job records
        ("generation", {"contract", "generation"}),
    ],
)
def test_each_layer_imports_only_what_lies_below_it(package: str, allowed: set[str]) -> None:
    modules = imported(package)
    assert modules, f"no modules found under deployments/{package}"
    wrong = {name: sorted(deps - allowed) for name, deps in modules.items() if deps - allowed}
    assert not wrong, f"deployments/{package} imports past its layer: {wrong}"
