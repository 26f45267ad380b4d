"""The Grafana dashboard (deployments/monitoring/dashboard.py, committed as
docs/monitoring/mmserve_grafana_dashboard.json): valid JSON, the same as the generator makes now,
and every query names only metrics the service exports (`metrics.SPECS`), each of them somewhere."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.monitoring import dashboard
from deployments.monitoring.metrics import PREFIX, SPECS

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "docs" / "monitoring" / "mmserve_grafana_dashboard.json"
REGENERATE = "regenerate it: .venv/bin/python scripts/grafana_dashboard.py"

# Ray's per-dashboard overrides (grafana_dashboard_factory.py); the committed JSON has none.
RAY_OVERRIDES = (
    "RAY_GRAFANA_MMSERVE_DASHBOARD_UID",
    "RAY_GRAFANA_MMSERVE_DASHBOARD_GLOBAL_FILTERS",
    "RAY_GRAFANA_MMSERVE_LOG_LINK_URL",
)

HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
EXPORTED: dict[str, str] = {}  # Prometheus series name -> spec name
for _spec in SPECS:
    for _suffix in HISTOGRAM_SERIES if _spec.kind == "histogram" else ("",):
        EXPORTED[_spec.exported + _suffix] = _spec.name

# PromQL words that can stand before "(" and so never before "{" or "[" in valid PromQL; excluded
# all the same, so that a function is never taken for a metric.
PROMQL_WORDS = frozenset(
    """abs absent absent_over_time acos acosh asin asinh atan atanh avg avg_over_time bool bottomk ceil
    changes clamp clamp_max clamp_min count count_over_time count_values day_of_month day_of_week
    day_of_year days_in_month deg delta deriv exp floor group group_left group_right histogram_avg
    histogram_count histogram_fraction histogram_quantile histogram_stddev histogram_stdvar histogram_sum
    holt_winters hour idelta ignoring increase irate label_join label_replace last_over_time limitk
    limit_ratio ln log10 log2 mad_over_time max max_over_time min min_over_time minute month offset on
    predict_linear present_over_time quantile quantile_over_time rad rate resets round scalar sgn sort
    sort_by_label sort_by_label_desc sort_desc sqrt stddev stddev_over_time stdvar stdvar_over_time sum
    sum_over_time time timestamp topk vector year by without and or unless""".split()  # noqa: SIM905 (a list of 90 words)
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"(?<![\w:$])([A-Za-z_:][\w:]*)\s*[{\[]")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers followed by `{` or `[`, outside strings."""
    return {name for name in _SELECTOR.findall(_STRING.sub('""', expr)) if name not in PROMQL_WORDS}


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that is not a row, collapsed rows' panels included."""
    found: list[dict[str, Any]] = []
    for panel in board["panels"]:
        found += panel.get("panels", []) if panel["type"] == "row" else [panel]
    return found


def exprs(board: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in panels(board) for target in panel["targets"]]


@pytest.fixture
def generated(monkeypatch) -> str:
    for name in RAY_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    content, uid = dashboard.generate_dashboard()
    assert uid == dashboard.DASHBOARD_UID
    return content


@pytest.fixture(scope="module")
def board() -> dict[str, Any]:
    return json.loads(COMMITTED.read_text())


def test_the_committed_json_is_what_the_generator_makes_now(board, generated):
    assert json.loads(generated) == board, REGENERATE
    assert COMMITTED.read_text() == generated, REGENERATE


def test_the_uid_is_stable(board):
    assert dashboard.DASHBOARD_UID == "rayMmserveDashboard"
    assert board["uid"] == dashboard.DASHBOARD_UID


def test_rows_and_panels_with_queries(board):
    rows = [panel["title"] for panel in board["panels"] if panel["type"] == "row"]
    assert rows == [
        "Overview",
        "Decoder",
        "Captioner",
        "Images and cache",
        "Embeddings",
        "Batches",
        "LoRA adapters",
        "API keys",
    ]
    assert len(panels(board)) >= 20
    for panel in panels(board):
        assert panel["title"] and panel["description"], panel["id"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    ids = [panel["id"] for panel in board["panels"] if panel["type"] == "row"] + [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))


def test_every_query_names_only_metrics_the_service_exports(board):
    for expr in exprs(board):
        names = metric_names(expr)
        assert names, f"no metric found in {expr!r}"
        assert names <= EXPORTED.keys(), f"not exported by the service: {sorted(names - EXPORTED.keys())} in {expr!r}"


def test_every_metric_is_on_the_dashboard(board):
    shown = {EXPORTED[name] for expr in exprs(board) for name in metric_names(expr)}
    assert shown == {spec.name for spec in SPECS}


def test_every_query_follows_the_dashboard_variables(board):
    for expr in exprs(board):
        for selector in re.findall(r"\{[^{}]*\}", expr):
            for variable in ("application", "deployment", "model"):
                assert f'{variable}=~"${variable}"' in selector, expr


def test_the_variables_list_the_service_own_series(board):
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "application", "deployment", "model", "interval"} <= variables.keys()
    assert all(spec.exported.startswith(f"ray_{PREFIX}") for spec in SPECS)
    for name in ("application", "deployment", "model"):
        query = variables[name]["query"]["query"]
        assert query.startswith(f'label_values({{__name__=~"ray_{PREFIX}.+"'), query
        assert query.endswith(f", {name})"), query
        assert variables[name]["definition"] == query


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(ray_mmserve_x_bucket{a=~"$a", b="{c}[d]"}[$interval]))', {"ray_mmserve_x_bucket"}),
        ("histogram_quantile(0.5, sum by (le) (rate(m1[5m]))) / on(job) group_left vector(1)", {"m1"}),
        ("sum(rate(ray_mmserve_prompt_token_total{}[1m])) + m2 {x='y'}", {"ray_mmserve_prompt_token_total", "m2"}),
        ("rate(m3{}[5m])[1h:] offset 5m", {"m3"}),
    ],
)
def test_metric_names_reads_selectors_only(expr, names):
    assert metric_names(expr) == names


def test_a_misspelt_metric_is_caught():
    typo = SPECS[0].exported.replace("_seconds", "_second")
    assert typo not in EXPORTED
    assert metric_names(f'sum(rate({typo}_bucket{{model=~"$model"}}[$interval]))') - EXPORTED.keys()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian: apt-get install prometheus)")
def test_promtool_parses_every_query(board, tmp_path):
    """With Grafana's variables replaced as Grafana would, each query is valid PromQL."""
    values = {"$interval": "1m", "$__range": "1h", "$application": ".*", "$deployment": ".*", "$model": ".*"}
    rules = []
    for i, expr in enumerate(exprs(board)):
        for variable, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"mmserve:check_{i}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
