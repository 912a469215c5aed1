"""`image_reference` over http(s): fetched by the ingress, only from allowed hosts, never from inside the network.

Rules, each refused with a message naming it: http and https only (never
`file:`); the host must match the allow-list; every address the host resolves
to must be public (not loopback, private, link-local, multicast or reserved)
unless the operator allows private networks; the check runs inside the
connection's own resolver, so a second DNS answer cannot slip past it; no
redirects; at most `max_bytes`, counted as they arrive. The pixel limit is
checked later, by the same decoder that reads data URLs.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp.resolver import ThreadedResolver

from deployments.protocol.video import invalid_start


@dataclass(frozen=True)
class FetchPolicy:
    allowed_hosts: tuple[str, ...] = ()
    allow_private_networks: bool = False
    max_bytes: int = 10 * 1024 * 1024
    timeout_s: float = 10.0

    @classmethod
    def from_config(cls, config) -> "FetchPolicy":
        """The operator's settings (AppConfig's image_url_* fields)."""
        return cls(
            tuple(config.image_url_allowed_hosts),
            config.image_url_allow_private_networks,
            config.image_url_max_bytes,
            config.image_url_timeout_s,
        )

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        for pattern in self.allowed_hosts:
            pattern = pattern.lower().rstrip(".")
            if pattern.startswith("*.") and (host.endswith(pattern[1:]) and host != pattern[2:]):
                return True
            if host == pattern:
                return True
        return False


def is_remote_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in ("http", "https")


def public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def address_literal(host: str) -> str | None:
    """The address `host` names when it is an address literal, in canonical form: IPv6, dotted quads, and the
    forms C resolvers also read as IPv4 (`127.1`, `2130706433`, `0x7f.1`), which a check of the name alone misses."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.inet_ntoa(socket.inet_aton(host))
    except OSError:
        return None


def _refuse(why: str):
    return invalid_start(f"image_reference.image_url: {why}")


async def fetch_image(url: str, policy: FetchPolicy) -> bytes:
    """The image's bytes, or a ProtocolError (invalid_request) that says which rule refused it."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise _refuse("only data:, http and https URLs are accepted")
    host = parts.hostname
    if not host:
        raise _refuse("the URL has no host")
    if not policy.allowed_hosts:
        raise _refuse("remote URLs are not fetched by this server; send a data:image/...;base64 URL")
    if not policy.host_allowed(host):
        raise _refuse(f"host {host!r} is not on this server's allow-list")
    literal = address_literal(host)
    if literal is not None and not policy.allow_private_networks and not public_address(literal):
        # aiohttp does not resolve an address literal, so the resolver's check would not see it.
        raise _refuse(f"host {host!r} is a non-public address ({literal})")
    if literal is not None and ipaddress.ip_address(literal).version == 4 and literal != host:
        raise _refuse(f"host {host!r}: write an IPv4 address as four decimal numbers ({literal})")

    connector = aiohttp.TCPConnector(resolver=_CheckedResolver(policy.allow_private_networks), use_dns_cache=False)
    timeout = aiohttp.ClientTimeout(total=policy.timeout_s)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
            async with client.get(url, allow_redirects=False) as response:
                if 300 <= response.status < 400:
                    raise _refuse("redirects are not followed")
                if response.status != 200:
                    raise _refuse(f"the server answered HTTP {response.status}")
                if response.content_length is not None and response.content_length > policy.max_bytes:
                    raise _refuse(f"the image is {response.content_length} bytes, more than the limit of {policy.max_bytes} bytes")
                data = bytearray()
                async for piece in response.content.iter_chunked(64 * 1024):
                    data += piece
                    if len(data) > policy.max_bytes:
                        raise _refuse(f"the image is more than the limit of {policy.max_bytes} bytes")
                return bytes(data)
    except _AddressRefused as exc:
        raise _refuse(str(exc)) from None
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, _AddressRefused):
            raise _refuse(str(exc.os_error)) from None
        raise _refuse(f"could not connect to {host!r}") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _refuse(f"fetching failed ({type(exc).__name__})") from None


class _AddressRefused(OSError):
    pass


class _CheckedResolver(ThreadedResolver):
    """Resolves like aiohttp's threaded resolver, then refuses non-public addresses (unless allowed)."""

    def __init__(self, allow_private: bool) -> None:
        super().__init__()
        self.allow_private = allow_private

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET):
        results = await super().resolve(host, port, family)
        if not self.allow_private:
            for result in results:
                if not public_address(result["host"]):
                    raise _AddressRefused(f"host {host!r} resolves to a non-public address ({result['host']})")
        return results
