#!/usr/bin/env python
"""Wait until the service answers, then print one line: its URL, model(s) and vision state; and a
second: where the Ray dashboard is, and the command that prints the token it asks for.

    mmserve ready: http://127.0.0.1:8000 | model: smollm2-135m-instruct | vision: degraded (...)
    mmserve dashboard: http://127.0.0.1:8265/#/serve | token: .venv/bin/ray get-auth-token

vision: ok, off, degraded or loading (while the captioner's replica starts), then in brackets the
captioner's status as /health has it (`vision_state`): its state, the model it is loading, the
attempt and when the next one runs, and the cause, once. Then it goes on watching, for at most
`VISION_WAIT_S`, and prints one more line once the captioner has loaded or failed:

    mmserve vision: ok
    mmserve vision: degraded (llava-interleave-qwen-0.5b failed, attempt 1, next at 2026-11-27T13:45:07Z: OSError: ...)

`--vision-only` prints just that state, as `vision: ...` (scripts/status.sh's line).

scripts/run.sh starts it beside `serve run` with `--pid` (it gives up when that process is gone).
Until then /health gives no answer, Ray's plain-text 404 (routes not deployed yet) or a JSON 503
(decoder loading): only a JSON 200 means ready. Exit status 0 when ready, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = "http://127.0.0.1:8265"  # where `serve run` (and `ray start --head`) put Ray's dashboard
TOKEN_COMMAND = ".venv/bin/ray get-auth-token"  # Ray's CLI of this checkout: `ray` is not on PATH
VISION_WAIT_S = 300.0  # a captioner still loading after this is left to /health
CAUSE_CHARS = 160  # the cause's share of the line; /health has it whole


def base_url(config: Path) -> str:
    http = (yaml.safe_load(config.read_text()) or {}).get("http_options") or {}
    host = http.get("host", "127.0.0.1")
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{http.get('port', 8000)}"


def get_json(url: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, parsed JSON body); (0, None) when nothing answers or the body is not JSON."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    except (OSError, ValueError):
        return 0, None
    try:
        return status, json.loads(body)
    except ValueError:
        return 0, None


def alive(pid: int) -> bool:
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except OSError:
        return False


def ready_line(url: str, health: dict[str, Any]) -> str:
    keys = [k for k in os.environ.get("MMSERVE_API_KEYS", "").split(",") if k.strip()]
    status, models = get_json(f"{url}/v1/models", {"Authorization": f"Bearer {keys[0].strip()}"} if keys else None)
    if status == 200:
        model = ", ".join(m["id"] for m in models["data"])
    else:
        model = f"? (/v1/models answered {status}: set MMSERVE_API_KEYS to one of the keys)"
    return f"mmserve ready: {url} | model: {model} | vision: {vision_state(health)}"


def vision_state(health: dict[str, Any]) -> str:
    """The captioner's status in /health's body on one line: ``off``, ``ok``, or ``loading`` /
    ``degraded`` with the captioner's own state, model, attempt, next attempt and cause (cut to
    `CAUSE_CHARS`): the ready line's, the watch's and scripts/status.sh's words.
    """
    captioner = health["components"].get("captioner")
    if captioner is None:
        return "off"
    if captioner["ready"]:
        return "ok"
    details = captioner.get("details") or {}
    state = details.get("state") or "unavailable"
    facts = [f"{captioner.get('model') or 'captioner'} {state}"]
    if details.get("attempts"):
        facts.append(f"attempt {details['attempts']}")
    if details.get("next_retry_at"):
        facts.append(f"next at {details['next_retry_at']}")
    cause = " ".join(str(captioner.get("reason") or "no reason given").split())  # one line, however written
    cause = cause if len(cause) <= CAUSE_CHARS else cause[: CAUSE_CHARS - 3] + "..."
    return f"{'loading' if state == 'loading' else 'degraded'} ({', '.join(facts)}: {cause})"


def watch_vision(url: str, pid: int | None) -> None:
    """Once the captioner has left `loading`, its state on one line; nothing while it still loads
    after VISION_WAIT_S (/health goes on telling).
    """
    deadline = time.monotonic() + VISION_WAIT_S
    while time.monotonic() < deadline and (pid is None or alive(pid)):
        time.sleep(2)
        status, health = get_json(f"{url}/health")
        vision = vision_state(health) if status == 200 and isinstance(health, dict) else "loading"
        if not vision.startswith("loading"):
            print(f"mmserve vision: {vision}", flush=True)
            return


def dashboard_line(url: str = DASHBOARD) -> str:
    """Where the Ray dashboard answers (its Serve page), and how to get the token it asks for when
    Ray's token auth is on (Ray 2.60 turns it on for the cluster `serve run` starts).
    """
    status, mode = get_json(f"{url}/api/authentication_mode")  # one of the paths it serves without a token
    if status != 200 or not isinstance(mode, dict):
        return f"mmserve dashboard: none at {url} (Serve's view without it: scripts/status.sh)"
    token = f" | token: {TOKEN_COMMAND}" if mode.get("authentication_mode") == "token" else ""
    return f"mmserve dashboard: {url}/#/serve{token}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--pid", type=int, help="give up when this process (serve run) has exited")
    parser.add_argument("--vision-only", action="store_true", help="print the vision state once, then exit")
    args = parser.parse_args()
    url = base_url(args.config)
    if args.vision_only:
        url = os.environ.get("MMSERVE_URL") or url  # scripts/status.sh's
        status, health = get_json(f"{url}/health")
        ok = isinstance(health, dict) and "components" in health
        print(f"vision: {vision_state(health) if ok else f'? (no /health answer from {url})'}", flush=True)
        return 0 if ok else 1
    while args.pid is None or alive(args.pid):
        status, health = get_json(f"{url}/health")
        if status == 200 and isinstance(health, dict) and "components" in health:
            print(ready_line(url, health), flush=True)
            print(dashboard_line(), flush=True)
            if vision_state(health).startswith("loading"):
                watch_vision(url, args.pid)
            return 0
        time.sleep(1)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
