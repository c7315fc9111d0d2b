"""The Grafana dashboard in examples/grafana queries only metrics a live server exports.

Every PromQL expression in it (panel targets and template variable queries) is tokenized, its
metric selectors picked out (not functions, keywords, label names or Grafana variables), and
each metric name looked up among the series a real server's /metrics exposes: a counter
``octavo:x`` is queried as ``octavo:x_total``, a histogram as ``_bucket`` / ``_sum`` /
``_count``, a gauge by its name.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from octavo.engine.arg_utils import EngineArgs  # noqa: E402
from octavo.engine.async_llm import AsyncLLM  # noqa: E402
from octavo.entrypoints.openai.api_server import ServerSettings, build_app  # noqa: E402
from tests.running_server import RunningServer  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402

DASHBOARD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "examples", "grafana", "octavo_dashboard.json")

_TOKENS = re.compile(r"""
      (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
    | (?P<range>\[[^\]]*\])                     # [5m], [$__rate_interval], [1h:5m]
    | (?P<variable>\$\{[^}]*\}|\$\w+)           # Grafana's $var / ${var}
    | (?P<duration>(?:\d+(?:ms|[smhdwy]))+)   # offset 5m, @ ... offset 1h30m
    | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<number>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)
    | (?P<op>==|!=|=~|!~|<=|>=|[-+*/%^<>=(){},@])
    | (?P<space>\s+)
""", re.VERBOSE)
# Words that are never metric names where PromQL puts them.
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan"}
# Keywords followed by a parenthesized list of label names.
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def promql_metrics(expr: str) -> set[str]:
    """The metric names an expression selects. ValueError when it does not tokenize or its
    brackets do not balance."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKENS.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot tokenize {expr[pos:pos + 20]!r} in {expr!r}")
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
        pos = m.end()
    names: set[str] = set()
    stack: list[str] = []  # "{" label matchers, "labels" a label list, "(" anything else
    for i, (kind, text) in enumerate(tokens):
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
        if text == "{":
            stack.append("{")
        elif text == "(":
            prev = tokens[i - 1][1] if i else None
            stack.append("labels" if prev in _LABEL_LISTS else "(")
        elif text in ")}":
            if not stack or (stack.pop() == "{") != (text == "}"):
                raise ValueError(f"unbalanced {text!r} in {expr!r}")
        elif kind == "ident":
            inside_labels = stack and stack[-1] in ("{", "labels")
            # A function or an aggregation ("sum (...)", "sum by (le) (...)") is no metric.
            if not inside_labels and nxt not in ("(", "by", "without") \
                    and text not in _KEYWORDS:
                names.add(text)
    if stack:
        raise ValueError(f"unclosed {stack[-1]!r} in {expr!r}")
    return names


_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<selector>.*),)?\s*(?P<label>\w+)\s*\)\s*$")


def dashboard_queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target (rows' nested panels too) and every query
    variable (Grafana's label_values(selector, label): its selector)."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p.get('title')!r} target {t.get('refId')}", t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]
        query = query.get("query", "") if isinstance(query, dict) else query
        m = _LABEL_VALUES.match(query)
        if m:
            query = m.group("selector") or ""
        if query.strip():
            out.append((f"variable {var['name']!r}", query))
    return out


def exposed_series(metrics_text: str) -> set[str]:
    """The series names a Prometheus server scraping this text can be queried by."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(metrics_text):
        names.update(s.name for s in fam.samples)
        # A labelled family with no child yet has no sample lines, but its series will exist.
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "histogram":
            names.update(fam.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        elif fam.type in ("gauge", "untyped"):
            names.add(fam.name)
    return names


def missing_metrics(dashboard: dict, exposed: set[str]) -> dict[str, set[str]]:
    """where -> the metrics it queries that ``exposed`` lacks (also a query naming none)."""
    missing: dict[str, set[str]] = {}
    for where, expr in dashboard_queries(dashboard):
        names = promql_metrics(expr)
        if not names:
            missing[where] = {"<no metric in the query>"}
        elif names - exposed:
            missing[where] = names - exposed
    return missing


# ------------------------------------------------------------------------------ the parser
@pytest.mark.parametrize("expr,names", [
    ('histogram_quantile(0.99, sum by (le) (rate(octavo:a_bucket{model_name=~"$model_name",'
     ' le!="+Inf"}[$__rate_interval])))', {"octavo:a_bucket"}),
    ("sum(rate(octavo:x_sum[5m])) / sum(rate(octavo:x_count[5m]))",
     {"octavo:x_sum", "octavo:x_count"}),
    ("sum without (instance) (up) > bool 0", {"up"}),
    ("a / on (job) group_left (model_name) b offset 5m", {"a", "b"}),
    ("sum(rate(octavo:t_total{model_name=~\"${model_name}\"}[1h:5m])) by (mode)",
     {"octavo:t_total"}),
])
def test_promql_metrics(expr, names):
    assert promql_metrics(expr) == names


@pytest.mark.parametrize("expr", ["sum(rate(x[5m])", "x{a=\"1\"", "sum(x))", "x ? y"])
def test_promql_metrics_refuses_malformed(expr):
    with pytest.raises(ValueError):
        promql_metrics(expr)


# ------------------------------------------------------------------------------ the server
@pytest.fixture(scope="module")
def metrics_text(tmp_path_factory) -> str:
    """/metrics of a live server (a tiny checkpoint) after one request."""
    path = make_checkpoint("llama", str(tmp_path_factory.mktemp("llama_grafana")))
    engine = AsyncLLM.from_engine_args(EngineArgs(model=path, dtype="float32",
                                                  skip_tokenizer_init=True, max_model_len=128))
    srv = RunningServer(build_app(engine, ServerSettings()))  # stops the engine with it
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": [1, 2, 3, 4], "max_tokens": 3, "ignore_eos": True}),
            headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read().decode()
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def test_every_queried_metric_is_exported(dashboard, metrics_text):
    exposed = exposed_series(metrics_text)
    assert "octavo:e2e_request_latency_seconds_bucket" in exposed
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 20, "the dashboard lost its panels"
    assert missing_metrics(dashboard, exposed) == {}
    # The panels vLLM's example dashboard has, by the metric each one reads.
    queried = set().union(*(promql_metrics(q) for _, q in queries))
    for name in ("e2e_request_latency_seconds_bucket", "time_to_first_token_seconds_bucket",
                 "time_per_output_token_seconds_bucket", "prompt_tokens_total",
                 "generation_tokens_total", "kv_cache_usage_perc", "num_requests_running",
                 "num_requests_waiting", "num_requests_swapped", "request_success_total",
                 "prefix_cache_hits_total", "prefix_cache_queries_total"):
        assert "octavo:" + name in queried, name


def test_a_panel_querying_a_missing_metric_fails(dashboard, metrics_text):
    exposed = exposed_series(metrics_text)
    broken = copy.deepcopy(dashboard)
    targets = broken["panels"][1]["targets"]
    targets.append({"refId": "Y", "expr": 'sum(rate(octavo:no_such_metric_total[5m]))'})
    # A histogram is queried through its suffixes: the bare family name is no series.
    targets.append({"refId": "Z", "expr": "rate(octavo:e2e_request_latency_seconds[5m])"})
    title = broken["panels"][1]["title"]
    assert missing_metrics(broken, exposed) == {
        f"panel {title!r} target Y": {"octavo:no_such_metric_total"},
        f"panel {title!r} target Z": {"octavo:e2e_request_latency_seconds"}}
    # A variable's label_values() selector is checked too.
    broken = copy.deepcopy(dashboard)
    var = next(v for v in broken["templating"]["list"] if v["type"] == "query")
    var["query"]["query"] = "label_values(octavo:gone, model_name)"
    assert missing_metrics(broken, exposed) == {
        f"variable {var['name']!r}": {"octavo:gone"}}
