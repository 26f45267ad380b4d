#!/usr/bin/env python
"""Write the mmserve Grafana dashboard (deployments/monitoring/dashboard.py) as JSON, and with
--install put it beside the dashboards Ray generated for its current session, which the Grafana
started with Ray's grafana.ini provisions (folder "Ray"; docs/monitoring.md).

    .venv/bin/python scripts/grafana_dashboard.py             # docs/monitoring/mmserve_grafana_dashboard.json
    .venv/bin/python scripts/grafana_dashboard.py --install   # and into Ray's session dashboards folder

Ray rewrites its session's grafana/ folder when its dashboard starts, so install again after each
`ray start` (or `serve run` that starts Ray). Exit status 1 when there is no such folder.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from deployments.monitoring.dashboard import generate_dashboard

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "monitoring" / "mmserve_grafana_dashboard.json"
FILE_NAME = "mmserve_grafana_dashboard.json"
# Where Ray 2.60 writes its own dashboards (metrics_head.py), unless
# RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR says otherwise; session_latest is the newest session.
RAY_DASHBOARDS = Path("/tmp/ray/session_latest/metrics/grafana/dashboards")


def ray_dashboards_dir() -> Path:
    return Path(os.environ.get("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR") or RAY_DASHBOARDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON (default: %(default)s)")
    parser.add_argument(
        "--install",
        action="store_true",
        help=f"also copy it into Ray's session dashboards folder ({RAY_DASHBOARDS})",
    )
    parser.add_argument("--dashboards-dir", type=Path, help="with --install: that folder instead of Ray's")
    args = parser.parse_args(argv)

    content, uid = generate_dashboard()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(content)
    print(f"wrote {args.out} (uid {uid})")
    if not args.install:
        return 0

    target = args.dashboards_dir or ray_dashboards_dir()
    if not target.is_dir():
        print(f"no {target}: start Ray first (ray start --head, or serve run)", file=sys.stderr)
        return 1
    (target / FILE_NAME).write_text(content)
    print(f"installed {target / FILE_NAME}: Grafana shows it within ~10 s at /d/{uid} (Dashboards > Ray)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
