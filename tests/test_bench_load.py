"""A short, bounded run of `bench/load.py` against a served app: the load bench's smoke test in CI.

The full run (8 generation + 32 chat sessions for 60 s) is `python -m bench.load`; here two of each
for a few seconds must finish sessions and answers with no protocol errors, and memory is read.
"""

import asyncio

import pytest
from conftest import chat_app_args, deployed

pytestmark = pytest.mark.timeout(300)

APP, PREFIX = "load", "/load"


@pytest.fixture(scope="module")
def address(serve_address, world_model_dir, omni_dir):
    with deployed(APP, PREFIX, chat_app_args(
        world_model_dir,
        omni_dir,)):
        yield serve_address


def test_short_load_run_has_no_protocol_errors(address, report):
    from bench.load import measured_load

    result = asyncio.run(measured_load(f"ws://{address}{PREFIX}", APP, gen=2, chat=2, seconds=8.0, warmup_s=3.0))
    report(f"load smoke (2 generation + 2 chat sessions, 8 s): {result}")
    assert result["protocol_errors"] == 0, result
    assert result["generation"]["sessions_completed"] >= 2 and result["generation"]["chunks"] >= 4
    assert result["generation"]["chunk_interval"]["n"] >= 2
    assert result["chat"]["answers"] >= 1 and result["chat"]["sessions_completed"] >= 2
    memory = result["memory_mib"]
    assert set(memory["end"]) == {"VideoIngress", "WorldModel", "Understanding"}
    assert all(value and value > 0 for value in memory["end"].values())
