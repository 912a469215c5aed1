"""Replicas over a simulated multi-node cluster: each replica with all its ranks on one node, sessions spread."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(420)


def test_tp_replicas_land_on_different_nodes_with_their_ranks_and_sessions_spread(world_model_dir):
    # Its own process: a multi-node Cluster cannot share the test session's Ray instance.
    script = Path(__file__).with_name("multinode_check.py")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = subprocess.run([sys.executable, str(script), str(world_model_dir)], capture_output=True, text=True, timeout=400, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith('{"replicas"')))
    replicas = result["replicas"]
    assert len(replicas) == 2
    nodes = [r["node_id"] for r in replicas.values()]
    assert sorted(nodes) == result["gpu_nodes"]  # one replica on each GPU node, none on the head
    for replica in replicas.values():
        assert replica["rank_nodes"] == [replica["node_id"]] * 2  # STRICT_PACK: its ranks beside it
        assert len({tuple(ids) for ids in replica["gpu_ids"]}) == 2
    assert sorted(result["served_by"]) == sorted(replicas)  # two sessions, one on each replica
    assert result["clean"] == [True, True]
