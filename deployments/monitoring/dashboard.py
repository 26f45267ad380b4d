"""The Grafana dashboard over `metrics.SPECS`: its rows and panels (`dashboard_panels`, as Ray keeps
its own beside its factory) in Ray's `DashboardConfig`, rendered by Ray's dashboard factory onto
`mmserve_grafana_dashboard_base.json` (the template variables `$application`, `$deployment`,
`$model` and `$interval`, modelled on Ray's Serve LLM base).

`scripts/grafana_dashboard.py` writes the JSON (docs/monitoring/) and installs it beside Ray's
dashboards; docs/monitoring.md shows the whole setup.

Like Ray's dashboards, this one honours `RAY_GRAFANA_MMSERVE_DASHBOARD_UID`,
`RAY_GRAFANA_MMSERVE_DASHBOARD_GLOBAL_FILTERS` and `RAY_GRAFANA_MMSERVE_LOG_LINK_URL`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray.dashboard.modules.metrics.dashboards.common import DashboardConfig

from deployments.monitoring.dashboard_panels import ROWS

DASHBOARD_UID = "rayMmserveDashboard"
BASE_JSON = Path(__file__).with_name("mmserve_grafana_dashboard_base.json")

MMSERVE_DASHBOARD_CONFIG = DashboardConfig(
    # The key of Ray's RAY_GRAFANA_<name>_DASHBOARD_* overrides.
    name="MMSERVE",
    default_uid=DASHBOARD_UID,
    standard_global_filters=[],
    # Ray's factory joins this to its own dashboards folder; os.path.join keeps an absolute path as is.
    base_json_file_name=str(BASE_JSON),
    rows=ROWS,
)


def generate_dashboard() -> tuple[str, str]:
    """(dashboard JSON, uid), rendered by Ray's dashboard factory as it renders its own dashboards.

    The one place that calls Ray's private `_generate_grafana_dashboard` (its annotation says `str`;
    it returns `(content, uid)`).
    """
    from ray.dashboard.modules.metrics.grafana_dashboard_factory import _generate_grafana_dashboard

    generated: Any = _generate_grafana_dashboard(MMSERVE_DASHBOARD_CONFIG)
    content, uid = generated
    json.loads(content)  # Ray writes it as is; fail here rather than in Grafana
    return content, uid
