"""The Monitoring page's metric table lists every metric the service exports, under its exported name."""

from pathlib import Path

from deployments.monitoring.metrics import SPECS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"


def test_monitoring_page_lists_every_metric():
    section = PAGE.read_text().split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    missing = [spec.exported for spec in SPECS if f"| `{spec.exported}` |" not in section]
    assert not missing, f"docs/monitoring.md's Metrics table lacks {missing}"
