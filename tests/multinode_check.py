"""Run by test_multinode.py in its own process: a simulated three-node cluster (a head without GPUs and
two nodes with two logical GPUs each), the app with two TP=2 replicas, and two sessions.

Prints one JSON line: where each replica and each of its ranks ran, and which replica served each session.
"""

import asyncio
import json
import socket
import sys

import ray
from ray import serve
from ray.cluster_utils import Cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(model_dir: str) -> None:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from conftest import app_args
    from wsclient import run_to_end, send, start, until

    from deployments.app import build_app

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 0})
    nodes = [cluster.add_node(num_cpus=4, num_gpus=2) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False)
    port = free_port()
    # One machine plays every node: only the head runs an HTTP proxy (they would share the port).
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    args = app_args(model_dir, accelerator="gpu", tensor_parallel_size=2, num_replicas=2, max_sessions_per_replica=2, routing_stats_period_s=0.5)
    serve.run(build_app(args), name="multinode", route_prefix="/")
    handle = serve.get_deployment_handle("WorldModel", app_name="multinode")

    replicas = {}
    for _ in range(20):
        stats = handle.stats.remote().result(timeout_s=60)
        replicas[stats["replica_id"]] = {"node_id": stats["node_id"], "rank_nodes": [r["node_id"] for r in stats["ranks"]], "gpu_ids": [r["gpu_ids"] for r in stats["ranks"]]}
        if len(replicas) == 2:
            break

    async def sessions():
        opened = [await start(f"127.0.0.1:{port}", prompt=f"node {i}") for i in range(2)]
        for ws, t, _ in opened:
            await until(ws, t, lambda m: m["type"] == "video.chunk_metadata")
            await send(ws, {"type": "session.stop"})
        for ws, t, _ in opened:
            await run_to_end(ws, t)
        return [first["replica_id"] for _, _, first in opened], [bool(t.done and not t.errors) for _, t, _ in opened]

    served_by, clean = asyncio.run(sessions())
    print(json.dumps({
        "replicas": replicas,
        "gpu_nodes": sorted(n.node_id for n in nodes),
        "head_node": cluster.head_node.node_id,
        "served_by": served_by,
        "clean": clean,
    }))
    serve.shutdown()
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
