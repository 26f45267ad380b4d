"""Fetch bytes from ``http(s)://`` URLs behind an SSRF guard (an image's URL, a document's `file_url`),
and an image's from a ``file://`` URL inside `images.file_root`.

A client-supplied URL must not turn the service into a proxy into its own network. Every host is
checked after DNS resolution, and the connection goes only to an address that passed the check: a
resolver wrapped around aiohttp's default one drops refused addresses before the connector sees them
(IP-literal hosts skip resolvers, so they are checked here first). Refused: loopback, private
(RFC 1918, fc00::/7), link-local (169.254/16 with the cloud metadata address, fe80::/10), CGNAT
100.64/10, unspecified, multicast, reserved and documentation ranges, and IPv6 forms that embed such
an IPv4 address (``::ffff:127.0.0.1``, 6to4, NAT64). ``ImageInputConfig.allow_hosts`` exempts host
names or networks. Redirects are followed by hand, each hop checked again; bytes are capped while
streaming. Every failure is an `InvalidImageError` (400) whose message says what happened.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from deployments.config import ImageInputConfig
from deployments.errors import InvalidImageError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_CHUNK = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_EMBEDS_V4 = "embeds"  # rule kind: classify the IPv4 address inside this IPv6 one


def _rules(*pairs: tuple[str, str]) -> tuple[tuple[Network, str], ...]:
    return tuple((ipaddress.ip_network(net), kind) for net, kind in pairs)


# First match wins; anything else Python does not call global is "reserved".
_RULES = _rules(
    ("0.0.0.0/8", "unspecified"),
    ("127.0.0.0/8", "loopback"),
    ("10.0.0.0/8", "private"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("100.64.0.0/10", "CGNAT (shared)"),
    ("169.254.169.254/32", "link-local (cloud metadata)"),
    ("169.254.0.0/16", "link-local"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::ffff:0:0/96", _EMBEDS_V4),  # IPv4-mapped
    ("::ffff:0:0:0/96", _EMBEDS_V4),  # IPv4-translated (SIIT)
    ("::/96", _EMBEDS_V4),  # IPv4-compatible (deprecated)
    ("64:ff9b::/96", _EMBEDS_V4),  # NAT64 well-known prefix
    ("2002::/16", _EMBEDS_V4),  # 6to4
    ("64:ff9b:1::/48", "private"),
    ("fc00::/7", "private"),
    ("fec0::/10", "private"),
    ("fe80::/10", "link-local"),
    ("ff00::/8", "multicast"),
    ("2001::/32", "reserved"),  # Teredo
)


def address_category(address: str | Address) -> str | None:
    """Why an address must not be fetched (``"loopback"``, ``"private"``, ``"link-local"``, ...), or
    None for a public one. IPv6 addresses that embed an IPv4 address get the category of that address.
    """
    found = _classify(ipaddress.ip_address(address) if isinstance(address, str) else address)
    return None if found is None else found[0]


def _classify(addr: Address) -> tuple[str, ipaddress.IPv4Address | None] | None:
    """``(category, embedded IPv4 address it came from, if any)``, or None for a public address."""
    for net, kind in _RULES:
        if addr in net:
            if kind != _EMBEDS_V4:
                return kind, None
            assert isinstance(addr, ipaddress.IPv6Address)
            inner = addr.sixtofour or ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
            found = _classify(inner)
            return None if found is None else (found[0], inner)
    return None if addr.is_global else ("reserved", None)


@dataclass(frozen=True)
class _Allow:
    """The parsed `allow_hosts`: exempt host names and networks."""

    hosts: frozenset[str]
    networks: tuple[Network, ...]

    @classmethod
    def of(cls, config: ImageInputConfig) -> _Allow:
        hosts, networks = set(), []
        for entry in config.allow_hosts:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.rstrip(".").lower())
        return cls(frozenset(hosts), tuple(networks))

    def host(self, host: str) -> bool:
        return host.rstrip(".").lower() in self.hosts

    def address(self, addr: Address) -> bool:
        mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
        return any(addr in net or (mapped is not None and mapped in net) for net in self.networks)

    def refusal(self, address: str) -> str | None:
        """Why a resolved or literal address is refused ("a loopback address", ...); None if allowed."""
        addr = ipaddress.ip_address(address)
        found = None if self.address(addr) else _classify(addr)
        if found is None:
            return None
        category, inner = found
        article = "an" if category[0] in "aeiou" else "a"
        return f"{article} {category} address" + (f" (it embeds IPv4 {inner})" if inner else "")


class _Refused(OSError):
    """Raised by the resolver; aiohttp wraps it in ClientConnectorDNSError, keeping it as os_error."""


class _GuardedResolver(AbstractResolver):
    """aiohttp's default resolver, minus the addresses the guard refuses: the connector never sees them."""

    def __init__(self, allow: _Allow, noun: str = "Image") -> None:
        self._inner = DefaultResolver()
        self._allow = allow
        self._noun = noun

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        if self._allow.host(host):
            return results
        refusals = [(result, self._allow.refusal(result["host"])) for result in results]
        kept = [result for result, reason in refusals if reason is None]
        if not kept and refusals:
            first, reason = refusals[0]
            raise _Refused(
                f"{self._noun} URL host {host!r} resolves to {first['host']}, {reason}; fetching it is not allowed."
            )
        return kept

    async def close(self) -> None:
        await self._inner.close()


def _check_target(url: URL, allow: _Allow, *, where: str, param: str) -> str:
    """Scheme and IP-literal checks of one hop; returns the host. Host names are checked by the resolver."""
    if url.scheme not in ("http", "https"):
        raise InvalidImageError(f"{where} uses scheme {url.scheme!r}; only http and https are followed.", param=param)
    host = url.raw_host
    if not host:
        raise InvalidImageError(f"{where} has no host.", param=param)
    if allow.host(host):
        return host
    try:
        reason = allow.refusal(host)
    except ValueError:
        # aiohttp treats digits-and-dots or any colon as an IP literal and skips the resolver.
        if ":" in host or host.replace(".", "").isdigit():
            raise InvalidImageError(f"{where} host {host!r} is not a valid IP address.", param=param) from None
        return host
    if reason is not None:
        raise InvalidImageError(f"{where} host {host!r} is {reason}; fetching it is not allowed.", param=param)
    return host


async def fetch_image(url: str, config: ImageInputConfig, *, param: str) -> bytes:
    """Bytes at an ``http://``, ``https://`` or ``file://`` URL, within `config`'s limits.

    The bytes are not checked as an image here (see `vision.check.check_image`). Raises `InvalidImageError`
    naming `param` for any failure: a refused scheme, host or path, a timeout, a non-2xx status, too
    many redirects, a body over `max_image_bytes`.
    """
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "file":
        return await _read_file(url, config, param=param)
    if scheme not in ("http", "https"):
        raise InvalidImageError(
            f"Unsupported image URL scheme {scheme or '(none)'!r}: use data:, http(s):// or file:// URLs.",
            param=param,
        )
    return await fetch_remote(url, config, param=param)


async def fetch_remote(
    url: str, config: ImageInputConfig, *, param: str, noun: str = "Image", accept: str = "image/*"
) -> bytes:
    """Bytes at an ``http(s)://`` URL behind the guard, within `config`'s limits and timeouts (the
    byte cap `max_image_bytes`); `noun` names what is fetched in the errors ("Document" for a
    document's `file_url`), `accept` is the request's Accept header.
    """
    if not config.allow_remote:
        raise InvalidImageError(f"Remote {noun.lower()} URLs (http, https) are disabled on this server.", param=param)
    try:
        return await asyncio.wait_for(
            _fetch_http(url, config, param=param, noun=noun, accept=accept), config.total_timeout_s
        )
    except TimeoutError:
        raise InvalidImageError(
            f"{noun} download did not finish within {config.total_timeout_s:g} s.", param=param
        ) from None


async def _fetch_http(url: str, config: ImageInputConfig, *, param: str, noun: str, accept: str) -> bytes:
    try:
        current = URL(url)
    except ValueError:
        raise InvalidImageError(f"{noun} URL is not a valid URL.", param=param) from None
    allow = _Allow.of(config)
    connect, read = config.connect_timeout_s, config.read_timeout_s
    timeout = aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect, sock_read=read)
    resolver = _GuardedResolver(allow, noun)
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False)
    try:
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False, headers={"Accept": accept}
        ) as session:
            for hop in range(config.max_redirects + 1):
                where = f"{noun} URL" if hop == 0 else f"{noun} URL redirect #{hop}"
                host = _check_target(current, allow, where=where, param=param)
                try:
                    async with session.get(current, allow_redirects=False) as resp:
                        if resp.status in _REDIRECTS:
                            current = _redirect_target(resp, where=where, param=param)
                            continue
                        if not 200 <= resp.status < 300:
                            raise InvalidImageError(
                                f"{where} answered HTTP {resp.status} {resp.reason or ''}".rstrip() + ".", param=param
                            )
                        return await _read_body(resp, config, param=param, noun=noun)
                except aiohttp.ClientError as exc:
                    raise _client_error(exc, host, config, param=param, noun=noun) from None
                except ValueError:  # e.g. a host name IDNA cannot encode
                    raise InvalidImageError(f"{where} is not a valid URL.", param=param) from None
    finally:
        await resolver.close()
    raise InvalidImageError(f"{noun} URL redirected more than {config.max_redirects} times.", param=param)


def _redirect_target(resp: aiohttp.ClientResponse, *, where: str, param: str) -> URL:
    location = resp.headers.get("Location")
    if not location:
        raise InvalidImageError(f"{where} answered HTTP {resp.status} without a Location.", param=param)
    try:
        return resp.url.join(URL(location))
    except ValueError:
        raise InvalidImageError(f"{where} redirects to an invalid URL.", param=param) from None


async def _read_body(resp: aiohttp.ClientResponse, config: ImageInputConfig, *, param: str, noun: str) -> bytes:
    cap = config.max_image_bytes
    if resp.content_length is not None and resp.content_length > cap:
        raise InvalidImageError(f"{noun} is {resp.content_length} bytes; the limit is {cap}.", param=param)
    body = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        body += chunk
        if len(body) > cap:
            raise InvalidImageError(f"{noun} is larger than {cap} bytes.", param=param)
    return bytes(body)


def _client_error(
    exc: aiohttp.ClientError, host: str, config: ImageInputConfig, *, param: str, noun: str = "Image"
) -> InvalidImageError:
    """One clear 400 for each way aiohttp can fail; no traceback and no internals in the message."""
    lower = noun.lower()
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        if isinstance(exc.os_error, _Refused):
            return InvalidImageError(str(exc.os_error), param=param)
        return InvalidImageError(f"{noun} URL host {host!r} could not be resolved.", param=param)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        message = f"Connecting to {lower} URL host {host!r} timed out after {config.connect_timeout_s:g} s."
    elif isinstance(exc, aiohttp.ServerTimeoutError):
        message = f"{noun} URL host {host!r} sent nothing for {config.read_timeout_s:g} s (read timeout)."
    elif isinstance(exc, aiohttp.ClientSSLError):
        message = f"TLS with {lower} URL host {host!r} failed (certificate or handshake)."
    elif isinstance(exc, aiohttp.ClientConnectorError):
        message = f"Could not connect to {lower} URL host {host!r}."
    elif isinstance(exc, aiohttp.InvalidURL):
        message = f"{noun} URL is not a valid URL."
    else:
        message = f"Downloading the {lower} from {host!r} failed ({type(exc).__name__})."
    return InvalidImageError(message, param=param)


async def _read_file(url: str, config: ImageInputConfig, *, param: str) -> bytes:
    if config.file_root is None:
        raise InvalidImageError("file:// image URLs are disabled on this server.", param=param)
    try:
        parsed = URL(url)
    except ValueError:
        raise InvalidImageError("Image URL is not a valid file:// URL.", param=param) from None
    if parsed.host not in (None, "", "localhost") or not parsed.path.startswith("/"):
        raise InvalidImageError("file:// image URLs must be file:///absolute/path, without a host.", param=param)
    return await asyncio.to_thread(_read_local, parsed.path, config.file_root, config.max_image_bytes, param)


def _read_local(path: str, root: str, cap: int, param: str) -> bytes:
    """Read a regular file inside `root` (after resolving symlinks and ``..``), at most `cap` bytes."""
    try:
        target = Path(path).resolve()
        inside = target.is_relative_to(Path(root).resolve())
    except (OSError, RuntimeError, ValueError):  # symlink loop, NUL byte
        inside = False
    if not inside:
        raise InvalidImageError("Image file is outside the directory this server serves images from.", param=param)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)  # O_NOFOLLOW: a symlink swapped in after resolve() is refused
    except FileNotFoundError:
        raise InvalidImageError("Image file does not exist.", param=param) from None
    except OSError:
        raise InvalidImageError("Image file could not be opened.", param=param) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidImageError("Image file is not a regular file.", param=param)
        if info.st_size > cap:
            raise InvalidImageError(f"Image is {info.st_size} bytes; the limit is {cap}.", param=param)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise InvalidImageError(f"Image is larger than {cap} bytes.", param=param)
    return data
