"""Remote and file image sources: SSRF guard, redirects, caps, timeouts, file:// confinement.

A real aiohttp server on 127.0.0.1 plays the image host; it is reachable only through `allow_hosts`.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from deployments.config import ImageInputConfig
from deployments.errors import InvalidImageError
from deployments.ingress.media.fetch import address_category, fetch_image
from deployments.ingress.vision.check import load_image, load_image_url
from deployments.monitoring.access_log import ImageStats
from tests.conftest import data_url, png_bytes

PNG = png_bytes()
CAP = 4096
LOCAL = ImageInputConfig(
    allow_hosts=["127.0.0.1/32"], max_image_bytes=CAP, connect_timeout_s=1, read_timeout_s=0.3, total_timeout_s=3
)


def local(**changes) -> ImageInputConfig:
    return LOCAL.model_copy(update=changes)


@pytest.fixture
async def server():
    release = asyncio.Event()

    async def image(_: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def loop(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"/loop/{int(request.match_info['n']) + 1}")

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"\0" * (CAP + 1), content_type="image/png")

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(4):
            await resp.write(b"\0" * (CAP // 2))
        await release.wait()  # a client that does not stop at the cap would hang here
        return resp

    async def slow(_: web.Request) -> web.Response:
        await release.wait()
        return web.Response(body=PNG)

    async def drip(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        while not release.is_set():
            await resp.write(b"\0")
            await asyncio.sleep(0.05)
        return resp

    async def text(_: web.Request) -> web.Response:
        return web.Response(text="not an image")

    app = web.Application()
    app.router.add_get("/x.png", image)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/loop/{n}", loop)
    app.router.add_get("/big", big)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/slow", slow)
    app.router.add_get("/drip", drip)
    app.router.add_get("/text", text)
    async with TestServer(app, host="127.0.0.1") as srv:
        yield srv
        release.set()


def base(srv: TestServer, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{srv.port}"


async def refused(url: str, config: ImageInputConfig, match: str) -> InvalidImageError:
    with pytest.raises(InvalidImageError, match=match) as info:
        await fetch_image(url, config, param="messages[0].content[1].image_url")
    assert info.value.param == "messages[0].content[1].image_url"
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("8.8.8.8", None),
        ("172.32.0.1", None),
        ("100.128.0.1", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("2002:808:808::1", None),
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::127.0.0.1", "loopback"),
        ("2002:7f00:1::1", "loopback"),
        ("64:ff9b::7f00:1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("::ffff:10.0.0.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "link-local (cloud metadata)"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("100.64.0.1", "CGNAT (shared)"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "reserved"),
        ("2001:db8::1", "reserved"),
        ("2001::1", "reserved"),
    ],
)
def test_address_category(address, category):
    assert address_category(address) == category


@pytest.mark.parametrize(
    ("host", "what"),
    [
        ("10.0.0.1", "a private address"),
        ("169.254.169.254", r"a link-local \(cloud metadata\) address"),
        ("[::1]", "a loopback address"),
        ("[::ffff:127.0.0.1]", r"a loopback address \(it embeds IPv4 127.0.0.1\)"),
        ("0.0.0.0", "an unspecified address"),
        ("100.64.0.1", r"a CGNAT \(shared\) address"),
    ],
)
async def test_ip_literals_are_refused_without_connecting(host, what):
    await refused(f"http://{host}/x.png", ImageInputConfig(), f"is {what}; fetching it is not allowed")


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0127.0.0.1"])
async def test_non_canonical_ip_literals_are_refused(host):
    await refused(f"http://{host}/x.png", ImageInputConfig(), "is not a valid IP address")


async def test_loopback_is_refused_by_default(server):
    await refused(f"{base(server)}/x.png", ImageInputConfig(), "'127.0.0.1' is a loopback address")
    await refused(f"{base(server, 'localhost')}/x.png", ImageInputConfig(), "'localhost' resolves to .*, a loopback")


async def test_names_resolving_to_loopback_in_other_spellings_are_refused(server):
    await refused(f"{base(server, '0x7f000001')}/x.png", ImageInputConfig(), "resolves to 127.0.0.1, a loopback")


async def test_allow_hosts_lets_the_local_server_through(server):
    assert await fetch_image(f"{base(server)}/x.png", LOCAL, param="p") == PNG
    # localhost may also resolve to ::1: that address is dropped, 127.0.0.1 is used.
    assert await fetch_image(f"{base(server, 'localhost')}/x.png", LOCAL, param="p") == PNG
    assert await fetch_image(f"{base(server, 'localhost')}/x.png", local(allow_hosts=["LocalHost"]), param="p") == PNG


async def test_redirects_are_followed_and_every_hop_checked(server):
    assert await fetch_image(f"{base(server)}/redirect?to=/x.png", LOCAL, param="p") == PNG
    await refused(
        f"{base(server)}/redirect?to=http://10.0.0.1/x.png", LOCAL, "redirect #1 host '10.0.0.1' is a private"
    )
    metadata = "http://169.254.169.254/latest/meta-data/"
    await refused(f"{base(server)}/redirect?to={metadata}", LOCAL, "cloud metadata")
    # Only the name is exempt: its redirect to the loopback literal is not.
    by_name = local(allow_hosts=["localhost"])
    to_literal = f"{base(server, 'localhost')}/redirect?to={base(server)}/x.png"
    await refused(to_literal, by_name, "redirect #1 host '127.0.0.1' is a loopback address")


async def test_redirect_limit(server):
    await refused(f"{base(server)}/loop/0", local(max_redirects=2), "redirected more than 2 times")
    await refused(f"{base(server)}/loop/0", local(max_redirects=0), "redirected more than 0 times")


async def test_redirect_to_file_is_refused(server, tmp_path):
    config = local(file_root=str(tmp_path))
    await refused(f"{base(server)}/redirect?to=file:///etc/passwd", config, "uses scheme 'file'")


async def test_content_length_over_cap_is_refused(server):
    await refused(f"{base(server)}/big", LOCAL, f"Image is {CAP + 1} bytes; the limit is {CAP}")


async def test_chunked_body_over_cap_is_cut_off_while_streaming(server):
    # The server never finishes this body; the fetch must stop at the cap, not at a timeout.
    await refused(f"{base(server)}/chunked", local(read_timeout_s=5, total_timeout_s=5), f"larger than {CAP} bytes")


async def test_slow_server_hits_the_read_timeout(server):
    await refused(f"{base(server)}/slow", LOCAL, r"sent nothing for 0.3 s \(read timeout\)")


async def test_dripping_server_hits_the_total_deadline(server):
    await refused(f"{base(server)}/drip", local(read_timeout_s=1, total_timeout_s=0.3), "did not finish within 0.3 s")


async def test_http_errors(server):
    await refused(f"{base(server)}/missing.png", LOCAL, "answered HTTP 404 Not Found")


async def test_unresolvable_host():
    await refused(
        "http://no-such-host.invalid/x.png", ImageInputConfig(), "'no-such-host.invalid' could not be resolved"
    )


async def test_closed_port(server):
    port = server.port
    await server.close()
    await refused(f"http://127.0.0.1:{port}/x.png", LOCAL, "Could not connect to image URL host '127.0.0.1'")


async def test_schemes():
    await refused("ftp://example.com/x.png", ImageInputConfig(), "Unsupported image URL scheme 'ftp'")
    await refused("x.png", ImageInputConfig(), r"Unsupported image URL scheme '\(none\)'")
    await refused("https://example.com/x.png", ImageInputConfig(allow_remote=False), "Remote image URLs .* disabled")


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("http://[::1/x.png", "not a valid URL"),
        ("http://example.com:99999/x.png", "not a valid URL"),
        ("http://" + "a" * 300 + ".com/x.png", "not a valid URL"),
        ("http:///x.png", "has no host"),
    ],
)
async def test_malformed_urls_are_clean_errors(url, match):
    await refused(url, ImageInputConfig(), match)


async def test_file_urls(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "sub").mkdir()
    (root / "sub" / "x.png").write_bytes(PNG)
    (outside / "secret.png").write_bytes(PNG)
    (root / "link.png").symlink_to(outside / "secret.png")
    (root / "inner-link.png").symlink_to(root / "sub" / "x.png")
    (root / "big.png").write_bytes(b"\0" * (CAP + 1))
    config = local(file_root=str(root))

    assert await fetch_image(f"file://{root}/sub/x.png", config, param="p") == PNG
    assert await fetch_image(f"file://{root}/inner-link.png", config, param="p") == PNG
    for escape in (f"file://{root}/sub/../../outside/secret.png", f"file://{root}/link.png", "file:///etc/passwd"):
        await refused(escape, config, "outside the directory")
    await refused(f"file://{root}/sub", config, "not a regular file")
    await refused(f"file://{root}/nope.png", config, "does not exist")
    await refused(f"file://{root}/big.png", config, f"the limit is {CAP}")
    await refused(f"file://otherhost{root}/sub/x.png", config, "without a host")
    await refused(f"file://{root}/sub/x%00.png", config, "outside the directory")
    await refused(f"file://{root}/sub/x.png", local(), r"file:// image URLs are disabled")


async def test_load_image_dispatches_and_checks_the_bytes(server, tmp_path):
    (tmp_path / "x.png").write_bytes(PNG)
    config = local(file_root=str(tmp_path))
    assert await load_image(data_url(PNG), config, param="p") == PNG
    assert await load_image(f"{base(server)}/x.png", config, param="p") == PNG
    assert await load_image(f"file://{tmp_path}/x.png", config, param="p") == PNG
    with pytest.raises(InvalidImageError, match="not a readable image"):
        await load_image(f"{base(server)}/text", config, param="p")
    with pytest.raises(InvalidImageError, match="the limit is 100"):
        await load_image(f"{base(server)}/x.png", local(max_image_pixels=100), param="p")
    with pytest.raises(InvalidImageError, match="loopback"):
        await load_image(f"{base(server)}/x.png", ImageInputConfig(), param="p")


def test_data_url_limits_come_from_the_config():
    assert load_image_url(data_url(PNG), param="p") == PNG
    with pytest.raises(InvalidImageError, match="larger than 100 bytes"):
        load_image_url(data_url(PNG), param="p", config=ImageInputConfig(max_image_bytes=100))
    with pytest.raises(InvalidImageError, match="48x32 pixels; the limit is 1000"):
        load_image_url(data_url(PNG), param="p", config=ImageInputConfig(max_image_pixels=1000))


def test_allow_hosts_entries_are_validated():
    assert ImageInputConfig(allow_hosts=["Images.Internal.", "10.0.0.0/8"]).allow_hosts == [
        "images.internal",
        "10.0.0.0/8",
    ]
    for bad in ("http://x", "10.0.0.0/33", ""):
        with pytest.raises(ValueError, match="neither a host name"):
            ImageInputConfig(allow_hosts=[bad])


async def test_image_stats_record_sizes_and_each_fetch(server, tmp_path):
    """What the access log and the ingress metrics get: accepted images' bytes and pixels, and each
    URL fetch with its scheme, time and outcome (data URLs are not fetches)."""
    (tmp_path / "a.png").write_bytes(png_bytes())
    stats = ImageStats()
    config = local(file_root=str(tmp_path))
    await load_image(data_url(png_bytes()), config, param="p", stats=stats)
    await load_image(f"file://{tmp_path}/a.png", config, param="p", stats=stats)
    await load_image(f"{base(server)}/x.png", config, param="p", stats=stats)
    with pytest.raises(InvalidImageError):
        await load_image(f"file://{tmp_path}/missing.png", config, param="p", stats=stats)
    assert (stats.count, stats.nbytes, stats.pixels) == (3, 3 * len(png_bytes()), 3 * 48 * 32)
    assert [(scheme, ok) for scheme, _, ok in stats.fetches] == [("file", True), ("http", True), ("file", False)]
    assert all(seconds >= 0 for _, seconds, _ in stats.fetches)
