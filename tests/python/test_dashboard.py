"""The Grafana dashboard (deploy/grafana/plinth.json) queries only what
Plinth serves: every metric family named in a panel's PromQL, or in the
`model` variable, is on the /metrics of a server serving the example
repository, with every label the expression groups by or matches on.

Some families get their first series only with an event (a failed request,
an eviction), so the server runs on demand with one resident model, and the
test makes each event happen once before it scrapes."""

import json
import re
import urllib.error
import urllib.request

import pytest

from conftest import HANG_GUARD_S, ROOT, Plinth, wait_until

DASHBOARD = ROOT / "deploy/grafana/plinth.json"

# Words of PromQL that are not metric names and are not always followed by
# `(`: aggregation operators (`sum by (model) (...)`), binary operators and
# modifiers, and the literals inf and nan.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile",
    "limitk", "limit_ratio", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "atan2", "offset", "inf", "nan",
}
GROUPING = r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)"
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def strip_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)


def queried_names(expr):
    """The metric names `expr` queries: identifiers followed by `{`, `[`,
    `)`, an operator or the end, never by `(` (a function), that are not
    PromQL words, label names (inside `{...}` or a grouping's `(...)`) or
    part of a number or a `$variable`."""
    bare = strip_strings(expr)
    bare = re.sub(r"\{[^}]*\}", "{}", bare)
    bare = re.sub(r"\[[^\]]*\]", "[]", bare)
    bare = re.sub(GROUPING, r"\1 ()", bare)
    names = re.findall(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(?!\s*\()(?![\w:])", bare)
    return {name for name in names if name not in PROMQL_WORDS}


def named_labels(expr):
    """The labels `expr` groups by or matches on."""
    bare = strip_strings(expr)
    grouped = {label.strip() for _, labels in re.findall(GROUPING, bare) for label in labels.split(",")}
    matched = {label for block in re.findall(r"\{([^}]*)\}", bare) for label in re.findall(r"(\w+)\s*[=!]", block)}
    return (grouped | matched) - {""}


def family(name, histograms):
    """The family of series `name`: a histogram's `_bucket`, `_sum` and
    `_count` series belong to it (`nv_inference_count` is no histogram's)."""
    for suffix in HISTOGRAM_SERIES:
        if name.endswith(suffix) and name[:-len(suffix)] in histograms:
            return name[:-len(suffix)]
    return name


class Scrape:
    """A /metrics text: the histogram families and, for each family with
    at least one series, the label names its series carry."""

    def __init__(self, text):
        self.histograms = set(re.findall(r"^# TYPE (\S+) histogram$", text, re.MULTILINE))
        self.labels = {}
        for name, labels in re.findall(r"^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})? \S+$", text, re.MULTILINE):
            names = set(re.findall(r'(\w+)="', labels))
            self.labels.setdefault(family(name, self.histograms), set()).update(names)


def panels():
    return json.loads(DASHBOARD.read_text())["panels"]


def expressions():
    return [(panel["title"], target["expr"]) for panel in panels() for target in panel["targets"]]


def variable_queries():
    """(metric, label) of each `label_values(metric, label)` variable."""
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    return [re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", v["definition"]).groups() for v in variables]


def post(server, path, body):
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def scrape(server):
    return urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()


@pytest.fixture(scope="module")
def served():
    """The /metrics of the example repository served on demand with one
    resident model, after an eviction, a failed request and a request to
    ocr_cls's /predict (so its per-model series exist)."""
    server = Plinth(ROOT / "model_repository", "--model-control-mode", "on_demand", "--max-loaded-models", "1")
    try:
        assert post(server, "/v2/models/ocr_rec/predict", (ROOT / "tests/fixtures/line_hello.png").read_bytes()) == 200
        # Loading ocr_cls evicts ocr_rec.
        assert post(server, "/v2/models/ocr_cls/predict", (ROOT / "tests/fixtures/cls_upright.png").read_bytes()) == 200
        wrong_shape = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        assert post(server, "/v2/models/ocr_cls/infer", json.dumps(wrong_shape).encode()) == 400
        evicted = 'plinth_model_evictions_total{model="ocr_rec"} 1'
        wait_until("the eviction is counted", lambda: evicted in scrape(server))
        yield Scrape(scrape(server))
    finally:
        server.stop()


def test_the_dashboard_parses_and_every_panel_has_a_title_and_a_query():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["model"]
    assert panels()
    for panel in panels():
        assert panel.get("title"), panel
        assert panel.get("targets"), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_the_parser_finds_metric_names_and_only_those():
    assert queried_names(
        'histogram_quantile(0.99, sum by (model, le) (rate(a_seconds_bucket{model=~"$model", le!="x y"}'
        '[$__rate_interval])))') == {"a_seconds_bucket"}
    assert queried_names("sum by (model) (rate(b_us[5m])) / on (model) group_left sum(c) > 0") == {"b_us", "c"}
    assert queried_names("d / 1e6 + sum without (stage) (e{stage='pre'}) or f") == {"d", "e", "f"}
    assert named_labels('sum by (model, le) (rate(x{stage="pre", reason!~"a"}[1m]))') == {"model", "le", "stage",
                                                                                           "reason"}
    assert family("h_bucket", {"h"}) == "h" and family("nv_inference_count", {"h"}) == "nv_inference_count"


def test_every_panel_query_names_a_served_family_with_its_labels(served):
    missing = []
    for title, expr in expressions():
        names = queried_names(expr)
        assert names, f"{title}: no metric in {expr}"
        for name in names:
            served_labels = served.labels.get(family(name, served.histograms))
            if served_labels is None:
                missing.append(f"{title}: {name} is not in /metrics")
            elif not named_labels(expr) <= served_labels:
                missing.append(f"{title}: {name} has no label {named_labels(expr) - served_labels} in {expr}")
    assert not missing, "\n".join(missing)


def test_the_model_variable_reads_a_served_label(served):
    for metric, label in variable_queries():
        assert label in served.labels.get(metric, set()), f"label_values({metric}, {label})"
