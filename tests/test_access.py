"""Access rules and input limits, without Serve: API keys, origins, sessions per key, rates, remote images."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from deployments.ingress.access import (
    ORIGIN_NOT_ALLOWED,
    UNAUTHORIZED,
    AccessDenied,
    AccessPolicy,
    key_fingerprint,
    keys_from,
)
from deployments.ingress.image_fetch import FetchPolicy, fetch_image, public_address
from deployments.ingress.limits import TokenBucket
from deployments.protocol.errors import ProtocolError

KEYS = AccessPolicy(keys=frozenset({"k-one", "k-two"}))


# -- API keys ------------------------------------------------------------------------------
def test_open_server_needs_no_key():
    assert AccessPolicy().check({}, {}).key_id is None


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({"authorization": "Bearer k-one"}, {}),
        ({"authorization": "bearer   k-one "}, {}),
        ({"sec-websocket-protocol": "realtime, openai-insecure-api-key.k-one"}, {}),
        ({"sec-websocket-protocol": "rtv-api-key.k-one"}, {}),
        ({}, {"api_key": "k-one"}),
    ],
)
def test_a_key_is_read_from_header_subprotocol_or_query(headers, query):
    assert KEYS.check(headers, query).key_id == key_fingerprint("k-one")


@pytest.mark.parametrize(
    ("headers", "query", "text"),
    [
        ({}, {}, "Missing API key"),
        ({"authorization": "Basic azpr"}, {}, "Missing API key"),
        ({"authorization": "Bearer nope"}, {}, "Invalid API key"),
        ({"sec-websocket-protocol": "openai-insecure-api-key."}, {}, "Missing API key"),
        ({}, {"api_key": "k-on"}, "Invalid API key"),
    ],
)
def test_missing_or_wrong_keys_are_refused(headers, query, text):
    with pytest.raises(AccessDenied) as info:
        KEYS.check(headers, query)
    assert info.value.code == UNAUTHORIZED and text in info.value.message


def test_the_key_is_never_echoed_when_another_protocol_was_offered():
    grant = KEYS.check({"sec-websocket-protocol": "openai-insecure-api-key.k-two, realtime"}, {})
    assert grant.subprotocol == "realtime" and grant.key_id == key_fingerprint("k-two")
    # a browser that offered only the key protocol must get one back, or it drops the connection
    assert KEYS.check({"sec-websocket-protocol": "rtv-api-key.k-two"}, {}).subprotocol == "rtv-api-key.k-two"
    assert KEYS.check({"authorization": "Bearer k-two"}, {}).subprotocol is None


def test_keys_come_from_config_and_environment():
    assert keys_from(["a", " ", "b "], {"RTV_API_KEYS": "c, d,,"}) == {"a", "b", "c", "d"}
    assert keys_from(None, {}) == frozenset()


# -- origins ----------------------------------------------------------------------------------
def test_origins_are_checked_only_for_browsers_and_same_origin_passes():
    policy = AccessPolicy(allowed_origins=("https://app.example.com",))
    policy.check({"origin": "https://app.example.com"}, {})
    policy.check({}, {})  # no Origin header: not a browser
    policy.check({"origin": "http://10.0.0.5:8000", "host": "10.0.0.5:8000"}, {})  # the server's own pages
    with pytest.raises(AccessDenied) as info:
        policy.check({"origin": "https://evil.example.net", "host": "10.0.0.5:8000"}, {})
    assert info.value.code == ORIGIN_NOT_ALLOWED and "evil.example.net" in info.value.message
    # the origin is checked before the key, so a foreign page learns nothing about keys
    with pytest.raises(AccessDenied, match="Origin"):
        AccessPolicy(keys=frozenset({"k"}), allowed_origins=()).check({"origin": "https://x.test", "authorization": "Bearer k"}, {})


# -- rates ------------------------------------------------------------------------------------------
def test_token_bucket_allows_bursts_then_the_rate():
    now = [0.0]
    bucket = TokenBucket(10, burst=3, now=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] += 0.1
    assert bucket.take() and not bucket.take()
    now[0] += 10
    assert sum(bucket.take() for _ in range(10)) == 3  # refilled only up to the burst
    assert bucket.refused == 9


# -- remote images ---------------------------------------------------------------------------------
def _png(size=(6, 4)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def image_server():
    """A real HTTP server on loopback: /a.png, /big, /redirect, /missing."""
    body = _png()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path == "/a.png":
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path == "/big":
                self.send_response(200)  # no Content-Length: the limit must be counted as bytes arrive
                self.end_headers()
                for _ in range(64):
                    self.wfile.write(b"\0" * 4096)
            elif self.path == "/slow":  # headers at once, then a byte now and then: only a total deadline ends it
                self.send_response(200)
                self.end_headers()
                for _ in range(40):
                    try:
                        self.wfile.write(b"\0")
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(0.25)
            elif self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/a.png")
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def fetch(url: str, **policy) -> bytes:
    return asyncio.run(asyncio.wait_for(fetch_image(url, FetchPolicy(**policy)), 20))


def refusal(url: str, **policy) -> str:
    with pytest.raises(ProtocolError) as info:
        fetch(url, **policy)
    assert info.value.code == "invalid_request"
    return info.value.message


@pytest.mark.timeout(60)
def test_allowed_host_on_an_allowed_network_is_fetched(image_server):
    assert fetch(f"{image_server}/a.png", allowed_hosts=("127.0.0.1",), allow_private_networks=True) == _png()


@pytest.mark.timeout(60)
def test_remote_image_rules(image_server):
    allowed = {"allowed_hosts": ("127.0.0.1", "localhost"), "allow_private_networks": True}
    assert "not fetched by this server" in refusal(f"{image_server}/a.png")
    assert "not on this server's allow-list" in refusal("http://images.example.com/a.png", allowed_hosts=("cdn.example.com",))
    assert "non-public address" in refusal(f"{image_server}/a.png", allowed_hosts=("127.0.0.1",))
    host = image_server.replace("127.0.0.1", "localhost")
    assert "non-public address" in refusal(f"{host}/a.png", allowed_hosts=("localhost",))  # caught at resolution
    assert "only data:, http and https" in refusal("file:///etc/passwd", **allowed)
    assert "redirects are not followed" in refusal(f"{image_server}/redirect", **allowed)
    assert "HTTP 404" in refusal(f"{image_server}/missing", **allowed)
    assert "more than the limit of 1000 bytes" in refusal(f"{image_server}/big", max_bytes=1000, **allowed)
    assert "more than the limit of 10 bytes" in refusal(f"{image_server}/a.png", max_bytes=10, **allowed)


@pytest.mark.timeout(60)
def test_odd_address_forms_slow_answers_and_environment_proxies(image_server, monkeypatch):
    port = image_server.rsplit(":", 1)[1]
    # Short, unspecified and IPv4-mapped forms of loopback are loopback: refused as literals or once resolved.
    for host in ("127.1", "0.0.0.0", "[::ffff:127.0.0.1]", "2130706433"):
        plain = host.strip("[]")
        assert "non-public address" in refusal(f"http://{host}:{port}/a.png", allowed_hosts=(plain,)), host
    # A response that never ends is cut at the total deadline, however steadily it trickles.
    assert "fetching failed" in refusal(f"{image_server}/slow", allowed_hosts=("127.0.0.1",), allow_private_networks=True, timeout_s=1.0)
    # Proxies named in the environment are not used: the fetch goes where the policy checked, or nowhere.
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert fetch(f"{image_server}/a.png", allowed_hosts=("127.0.0.1",), allow_private_networks=True) == _png()


def test_host_patterns_and_public_addresses():
    policy = FetchPolicy(allowed_hosts=("*.example.com", "img.test"))
    assert policy.host_allowed("a.example.com") and policy.host_allowed("A.B.Example.COM.")
    assert not policy.host_allowed("example.com") and not policy.host_allowed("badexample.com")
    assert policy.host_allowed("img.test") and not policy.host_allowed("x.img.test")
    assert public_address("93.184.216.34") and public_address("2606:2800:220:1::1")
    for address in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "::1", "fe80::1%eth0", "::ffff:127.0.0.1", "0.0.0.0", "224.0.0.1"):
        assert not public_address(address), address
