"""README's Monitoring table lists every metric the service exports, under its exported name."""

from pathlib import Path

from deployments.monitoring.metrics import SPECS

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_lists_every_metric():
    section = README.read_text().split("## Monitoring", 1)[1].split("\n## ", 1)[0]
    missing = [spec.exported for spec in SPECS if f"`{spec.exported}`" not in section]
    assert not missing, f"README's Monitoring table lacks {missing}"
