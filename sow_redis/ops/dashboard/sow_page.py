"""The dashboard's **SOW** page: a Flask blueprint added to rq-dashboard's app
(:func:`install`), under ``/sow/``.

* ``/sow/``: per topic, the figures of ``sow-redis stats`` (records, lag in entries and its
  age, rejections, records with an expiry, expiries, subscribers, change feed) and the rates
  in and applied over the last second and the last minute (:mod:`.sampler`);
* ``/sow/topic?name=T``: one topic: the same figures, charts of the rates and the lag over
  the last minutes, rejections by reason with the newest samples, change-feed retention, per
  partition its records, cursor, entries behind and owner (lease holder); and a ``sow`` query
  (``filter``, ``orderby``, ``top_n``) shown as a table;
* ``/sow/data/series.json?name=T``: the charts' data (:meth:`.sampler.Sampler.series`).

Nothing read from Redis is trusted: every value reaches the page through Jinja's
autoescaping (or the DOM's ``textContent`` in ``static/sow.js``); a bad filter or a Redis
failure shows one line on the page (HTTP 200; 404 for an unknown topic), never a traceback.
"""

from __future__ import annotations

import datetime as _dt
import hmac
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import orjson
from flask import Blueprint, Flask, Response, redirect, render_template, request, url_for
from redis.exceptions import RedisError
from werkzeug.wrappers import Response as WerkzeugResponse

from ...client import Sow
from ...errors import SowError
from ...model.records import Record
from ...model.values import JSONObject
from ...registry import load_topics
from ...settings import QUEUE_NAME
from ..status import partition_table
from .sampler import RATE_WINDOWS_S, Sampler, rates, reading

HERE = Path(__file__).parent

REJECTIONS_READ = 1000
"""Newest error-stream entries read per topic page; the per-reason counts are among them."""

SAMPLES_PER_REASON = 3
"""Newest rejected entries shown per reason."""

SAMPLE_TEXT_MAX = 300
"""Characters of a rejected entry's data shown (the rest is cut, marked ``…``)."""

TOP_N_DEFAULT = 100
"""Records a query shows unless ``top_n`` says otherwise."""

TOP_N_MAX = 5000
"""Most records a query from the page shows."""

FIELDS_MAX = 30
"""Most message fields shown as columns of the query table (the first seen)."""

REFRESH_MS = 2000
"""Milliseconds between two refreshes of the figures and charts in the browser."""


def rejections(entries: list[JSONObject], samples: int = SAMPLES_PER_REASON
               ) -> list[JSONObject]:
    """Error-stream entries (:meth:`sow_redis.client.Sow.errors`, oldest first) grouped by
    reason: ``[{"reason", "count", "latest": [entry, …]}]``, most frequent reason first (then
    by name), ``latest`` the newest ``samples`` entries of the reason, newest first, each with
    ``data`` cut to :data:`SAMPLE_TEXT_MAX` characters."""
    counts = Counter(e.get("reason", "") for e in entries)
    latest: dict[str, list[JSONObject]] = {}
    for e in reversed(entries):
        got = latest.setdefault(e.get("reason", ""), [])
        if len(got) < samples:
            data = e.get("data", "")
            got.append(dict(e, data=data if len(data) <= SAMPLE_TEXT_MAX
                            else data[:SAMPLE_TEXT_MAX] + "…"))
    return [{"reason": reason, "count": n, "latest": latest[reason]}
            for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def record_table(records: list[Record]) -> tuple[list[str], list[list[str]]]:
    """Query results as a table: the columns (``SOW key``, then the top-level fields in the
    order first seen, at most :data:`FIELDS_MAX`, and ``data`` when a record is no JSON
    object) and one row of texts per record (strings as they are, other values as JSON)."""
    objs: list[JSONObject | None] = []
    fields: dict[str, None] = {}
    for rec in records:
        try:
            obj = orjson.loads(rec.data)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            for k in obj:
                if len(fields) < FIELDS_MAX:
                    fields.setdefault(k, None)
            objs.append(obj)
        else:
            objs.append(None)
    raw = any(o is None for o in objs)
    columns = ["SOW key", *fields, *(["data"] if raw else [])]
    rows = []
    for rec, obj in zip(records, objs):
        row = [rec.sow_key]
        for k in fields:
            v = obj.get(k, "") if obj is not None else ""
            row.append(v if isinstance(v, str) else orjson.dumps(v).decode())
        if raw:
            row.append("" if obj is not None else rec.data.decode("utf-8", "replace"))
        rows.append(row)
    return columns, rows


def one_line(exc: BaseException) -> str:
    """An exception as one line of text."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _top_n(text: str | None) -> int:
    if not text:
        return TOP_N_DEFAULT
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"top_n must be a whole number, got {text!r}") from None
    if not 0 <= n <= TOP_N_MAX:
        raise ValueError(f"top_n must be from 0 to {TOP_N_MAX:,}, got {n}")
    return n


def make_blueprint(sow: Sow, sampler: Sampler, username: str | None = None,
                   password: str | None = None) -> Blueprint:
    """The SOW page's blueprint over ``sow`` (the data plane) and ``sampler``; with
    ``username`` it asks for HTTP basic auth, as rq-dashboard's own pages then do."""
    bp = Blueprint("sow", __name__, template_folder=str(HERE / "templates"),
                   static_folder=str(HERE / "static"), static_url_path="/static")

    if username:
        @bp.before_request
        def basic_auth() -> Response | None:
            auth = request.authorization
            if (auth is None or not hmac.compare_digest(auth.username or "", username)
                    or not hmac.compare_digest(auth.password or "", password or "")):
                return Response("Please login", 401,
                                {"WWW-Authenticate": 'Basic realm="RQ Dashboard"'})
            return None

    @bp.app_template_filter("sow_utc")
    def sow_utc(ms: int) -> str:
        """Milliseconds since the epoch as ``YYYY-MM-DD HH:MM:SS.mmm`` (UTC)."""
        return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).strftime(
            "%Y-%m-%d %H:%M:%S.%f")[:-3]

    def common() -> JSONObject:
        return {"refresh_ms": REFRESH_MS, "windows": list(RATE_WINDOWS_S),
                "interval_s": sampler.interval_s, "sampler_error": sampler.error,
                "top_n_default": TOP_N_DEFAULT}

    @bp.route("/")
    def overview() -> Response:
        error = None
        rows = []
        try:
            topics = load_topics(sow.r)
            for name in sorted(topics):
                rows.append({"name": name, "config": topics[name],
                             "x": sampler.latest(name)})
        except (RedisError, SowError) as exc:
            error = f"cannot read the topics: {one_line(exc)}"
        return _page(render_template("sow/overview.html", rows=rows, error=error, **common()))

    @bp.route("/topic")
    def topic() -> Response:
        return _topic_page(sow, sampler, common)

    @bp.route("/data/series.json")
    def series() -> Response:
        body = orjson.dumps(sampler.series(request.args.get("name", "")))
        return Response(body, mimetype="application/json",
                        headers={"Cache-Control": "no-store"})

    return bp


def _topic_page(sow: Sow, sampler: Sampler, common: Callable[[], JSONObject]) -> Response:
    """The topic page of the request's ``name`` (404 for an unknown topic), with the result
    of the request's ``sow`` query when it has a ``filter``; ``common()``: the values every
    page shows."""
    name = request.args.get("name", "")
    try:
        topics = load_topics(sow.r)
    except (RedisError, SowError) as exc:
        return _page(render_template("sow/topic.html", name=name, t=None,
                                     error=f"cannot read the topics: {one_line(exc)}",
                                     **common()))
    t = topics.get(name)
    if t is None:
        return _page(render_template("sow/topic.html", name=name, t=None,
                                     error=f"no topic {name!r} is defined", **common()),
                     404)
    ctx: JSONObject = {"name": name, "t": t, "error": None, "query": None}
    try:
        x = sampler.latest(name)
        if x is None:  # not read yet (the dashboard just started): read it now
            first = reading(sow.r, t)
            x = dict(first, rates=rates([first]))
        ctx.update(x=x, partitions=partition_table(sow.r, t),
                   rejections=rejections(sow.errors(name, REJECTIONS_READ)),
                   rejections_read=REJECTIONS_READ)
    except (RedisError, SowError) as exc:
        ctx["error"] = f"cannot read topic {name!r}: {one_line(exc)}"
    if "filter" in request.args:
        ctx["query"] = _query(sow, name)
    return _page(render_template("sow/topic.html", uplot=True, **ctx, **common()))


def _query(sow: Sow, name: str) -> JSONObject:
    """The page's ``sow`` query from the request's ``filter``, ``orderby`` and ``top_n``:
    ``{"filter", "orderby", "top_n", "columns", "rows", "error"}`` (``error``: one line)."""
    q: JSONObject = {"filter": request.args.get("filter", ""),
                         "orderby": request.args.get("orderby", ""),
                         "top_n": request.args.get("top_n", ""), "columns": [], "rows": [],
                         "error": None}
    try:
        top_n = _top_n(q["top_n"])
        records = sow.sow(name, q["filter"].strip() or None, top_n=top_n,
                          order_by=q["orderby"].strip() or None)
        q["columns"], q["rows"] = record_table(records)
        q["top_n"] = top_n
    except (SowError, RedisError, ValueError, RecursionError) as exc:
        q["error"] = one_line(exc)
    return q


def _page(html: str, status: int = 200) -> Response:
    return Response(html, status, mimetype="text/html",
                    headers={"Cache-Control": "no-store"})


SOW_TAB = '<li class="nav-item{active}"><a href="{href}" class="nav-link" id="sow-tab">SOW</a></li>'
"""The tab added to rq-dashboard's navigation bar."""


def _add_tab(app: Flask) -> None:
    """Add the SOW tab to rq-dashboard's navigation bar (its pages are rendered from its own
    templates: the tab goes in after the last of its tabs, when the bar is found)."""

    @app.after_request
    def add(resp: Response) -> Response:
        if (request.blueprint != "rq_dashboard" or resp.direct_passthrough
                or resp.mimetype != "text/html"):
            return resp
        html = resp.get_data()
        start = html.find(b'<ul class="navbar-nav')
        end = html.find(b"</ul>", start) if start >= 0 else -1
        if end >= 0:
            tab = SOW_TAB.format(active="", href=url_for("sow.overview")).encode()
            resp.set_data(html[:end] + tab + html[end:])
        return resp


def _jobs_on_sow(app: Flask) -> None:
    """rq-dashboard's Jobs tab (``/<n>/view/jobs``) shows the queue ``default``, which
    sow_redis never uses: send it to the queue ``sow`` instead."""

    @app.before_request
    def jobs_on_sow() -> WerkzeugResponse | None:
        args = request.view_args or {}
        if request.endpoint == "rq_dashboard.jobs_overview" and args.get("queue_name") is None:
            return redirect(url_for("rq_dashboard.jobs_overview",
                                    instance_number=args.get("instance_number", 0),
                                    queue_name=QUEUE_NAME, registry_name="queued",
                                    per_page=8, order="asc", page=1))
        return None


def install(app: Flask, sow: Sow, username: str | None = None, password: str | None = None,
            url_prefix: str = "", sampler: Sampler | None = None) -> Sampler:
    """Add the SOW page to rq-dashboard's ``app`` (under ``<url_prefix>/sow/``), its tab to the
    navigation bar, the Jobs tab's redirect to the queue ``sow``, and start sampling.

    Returns:
        The sampler (running in a daemon thread).
    """
    sampler = sampler or Sampler(sow.r)
    app.register_blueprint(make_blueprint(sow, sampler, username, password),
                           url_prefix=url_prefix.rstrip("/") + "/sow")
    _add_tab(app)
    _jobs_on_sow(app)
    sampler.start()
    return sampler
