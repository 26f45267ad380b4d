#!/usr/bin/env python
"""Screenshot a page of the Ray dashboard with headless Chromium, signed in with Ray's token.

    .venv/bin/python scripts/dashboard_screenshot.py docs/images/dashboard-serve-unhealthy.png
    .venv/bin/python scripts/dashboard_screenshot.py out.png --page '#/serve/applications/vision'

A docs tool (the screenshots in docs/monitoring.md), not a test. It needs Chromium (Debian:
`apt-get install chromium`) and the service running with its dashboard (`scripts/run.sh`). The
dashboard asks for Ray's token and keeps it in the cookie `ray-authentication-token`; Chromium's own
`--screenshot` cannot set a cookie, so this drives Chromium through its DevTools protocol (the
`websockets` package that Ray brings into .venv): set the cookie, open the page, wait for it to draw,
capture it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = "http://127.0.0.1:8265"
COOKIE = "ray-authentication-token"  # what the dashboard's sign-in box sets (Ray 2.60)
FLAGS = [  # quiet, offline, throwaway profile
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def ray_token() -> str:
    """What `.venv/bin/ray get-auth-token` prints."""
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ray"), "get-auth-token"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    raise SystemExit("no Chromium found: apt-get install chromium")


def devtools_page(profile: Path, timeout_s: float = 30.0) -> str:
    """The WebSocket URL of the browser's first page, once Chromium has written its DevTools port."""
    deadline = time.monotonic() + timeout_s
    port_file = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if port_file.exists() and (port := port_file.read_text().split("\n")[0].strip()):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
                pages = [t for t in json.load(response) if t["type"] == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
        time.sleep(0.2)
    raise SystemExit("Chromium did not open its DevTools port")


class Page:
    """One DevTools session: `call` sends a command and returns its result (events are skipped)."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        sent = next(self._ids)
        await self._socket.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = json.loads(await self._socket.recv())
            if message.get("id") == sent:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))


# Opens the last status message that the page shows cut short (on the Serve page, the last deployment's).
EXPAND = """(() => {
  const links = [...document.querySelectorAll("a, button, span")].filter(e => e.textContent.trim() === "Expand");
  if (links.length) links[links.length - 1].click();
  return links.length;
})()"""
# Scrolls what the opened message scrolls to its end: a failed replica's traceback ends with the error.
SCROLL_TO_END = """(() => {
  for (const e of document.querySelectorAll("[role=dialog] *")) {
    if (e.scrollHeight > e.clientHeight) e.scrollTop = e.scrollHeight;
  }
})()"""


async def capture(
    ws_url: str, url: str, token: str, out: Path, size: tuple[int, int], wait_s: float, expand: bool
) -> None:
    async with websockets.connect(ws_url, max_size=64 * 2**20) as socket:
        page = Page(socket)
        await page.call("Network.enable")
        await page.call("Network.setCookie", name=COOKIE, value=token, url=url.split("#")[0], path="/")
        width, height = size
        await page.call(
            "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False
        )
        await page.call("Page.enable")
        await page.call("Page.navigate", url=url)
        await asyncio.sleep(wait_s)  # the dashboard fetches its data after the page loads, then draws
        if expand:
            await page.call("Runtime.evaluate", expression=EXPAND)
            await asyncio.sleep(1.0)
            await page.call("Runtime.evaluate", expression=SCROLL_TO_END)
            await asyncio.sleep(0.5)
        shot = await page.call("Page.captureScreenshot", format="png")
    out.write_bytes(base64.b64decode(shot["data"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--dashboard", default=DASHBOARD)
    parser.add_argument("--page", default="#/serve", help="the dashboard's page (default: Serve's overview)")
    parser.add_argument("--size", default="1400x900", help="window size, WIDTHxHEIGHT")
    parser.add_argument("--wait", type=float, default=8.0, help="seconds to let the page draw")
    parser.add_argument(
        "--expand", action="store_true", help="open the last status message shown cut short, at its end"
    )
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    url = f"{args.dashboard}/{args.page.lstrip('/')}"
    with tempfile.TemporaryDirectory(prefix="mmserve-chromium-", ignore_cleanup_errors=True) as profile:
        browser = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            ws_url = devtools_page(Path(profile))
            asyncio.run(capture(ws_url, url, ray_token(), args.out, (width, height), args.wait, args.expand))
        finally:
            browser.terminate()
            browser.wait(timeout=30)
    print(f"{args.out}: {url} at {width}x{height}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
