"""The dashboard's SOW page (issue 27 item 10) without a browser: the figures it adds to
``stats`` (:func:`sow_redis.ops.status.log_appended`, :func:`sow_redis.ops.status.partition_table`),
the sampler's rates, the rejection and record tables, and the pages served by Flask's test
client on rq-dashboard's app: figures equal to :func:`sow_redis.ops.status.topic_stats`, a query
with a filter, a bad filter in one line, values from Redis escaped, the Jobs tab on the queue
``sow``. The browser test is ``tests/test_dashboard_browser.py``."""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser

import orjson
import pytest

from sow_redis import keys
from sow_redis.client import Sow
from sow_redis.model.records import Record
from sow_redis.ops.dashboard.sampler import Sampler, rates
from sow_redis.ops.dashboard.sow_page import install, record_table, rejections
from sow_redis.ops.status import log_appended, partition_table, topic_stats
from sow_redis.partition_state import read_cursor
from sow_redis.registry import load_topics


def _topic(sow: Sow, name: str, partitions: int = 2, extra: str = ""):
    sow.apply_config(f'[[topic]]\nname = "{name}"\nkey = ["/k"]\npartitions = {partitions}\n'
                     + extra)
    return sow.topic(name)


class Tables(HTMLParser):
    """Every ``<table id=…>`` of a page: id → rows of cell texts (th and td), and the text of
    every element with an id."""

    def __init__(self, html: str):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.by_id: dict[str, str] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._open: list[tuple[str, str | None, list[str]]] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id"):
            self._table = a["id"]
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        if a.get("id") and tag not in ("input", "br", "img", "meta", "link"):
            self._open.append((tag, a["id"], []))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        if self._open and self._open[-1][0] == tag:
            _t, ident, text = self._open.pop()
            self.by_id[ident or ""] = " ".join("".join(text).split())

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        for _t, _i, text in self._open:
            text.append(data)


def num(text: str) -> float:
    """A figure as the page shows it (``1,234``, ``12.5``; ``—`` is None)."""
    return float(text.replace(",", "").rstrip("*"))


# -- the figures added to stats -----------------------------------------------------------
def test_log_appended_counts_every_entry_ever_appended(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name)
    assert log_appended(sow.r, t) == 0  # no log stream yet
    sow.publish(t.name, [{"k": i} for i in range(10)])
    assert log_appended(sow.r, t) == 10
    for p in range(t.partitions):  # trimming the logs does not lower it
        sow.r.xtrim(keys.log(t.name, p), maxlen=0)
    sow.r.xadd(keys.log(t.name, 1), {"cmd": "publish", "data": b'{"k": 99}'})
    assert log_appended(sow.r, t) == 11


def test_partition_table_gives_records_cursor_behind_and_owner(url, topic_name):
    sow = Sow(url, inline=True)
    t = _topic(sow, topic_name)
    sow.publish(t.name, [{"k": i} for i in range(20)])
    sow.r.xadd(keys.log(t.name, 1), {"cmd": "publish", "data": b'{"k": 1000}'})  # not applied
    sow.r.set(keys.lease(t.name, 0), "host-a:4242:abc", px=60_000)
    rows = partition_table(sow.r, t)
    print(rows)
    assert [x["partition"] for x in rows] == [0, 1]
    assert sum(x["records"] for x in rows) == 20 == topic_stats(sow.r, t)["records"]
    assert [x["cursor"] for x in rows] == [read_cursor(sow.r, t.name, p) for p in (0, 1)]
    assert [x["pending"] for x in rows] == [0, 1]
    assert rows[0]["owner"] == "host-a:4242:abc" and 0 < rows[0]["lease_left_ms"] <= 60_000
    assert rows[1]["owner"] is None and rows[1]["lease_left_ms"] is None


# -- the sampler's rates ------------------------------------------------------------------
def _reading(ms: int, appended: int) -> dict:
    return {"time_ms": ms, "counters": {"appended": appended, "applied": appended}}


def test_rates_over_one_second_and_one_minute():
    assert rates([]) == {}
    one = rates([_reading(0, 5)])
    assert one["1s"] == {"per_second": {"appended": 0.0, "applied": 0.0}, "window_s": 0.0}
    # readings 1 s apart for 90 s, 10 entries a second, then 100 in the last second
    h = [_reading(i * 1000, 10 * i) for i in range(90)] + [_reading(90_000, 990)]
    got = rates(h)
    assert got["1s"] == {"per_second": {"appended": 100.0, "applied": 100.0}, "window_s": 1.0}
    # 1 min: against the newest reading at least 60 s older (30 s → 300 entries before)
    assert got["1min"]["window_s"] == 60.0
    assert got["1min"]["per_second"]["appended"] == round((990 - 300) / 60, 1)
    # a history shorter than a minute: against the oldest reading
    short = rates(h[:11])
    assert short["1min"]["window_s"] == 10.0 and short["1min"]["per_second"]["appended"] == 10.0


# -- rejections and records as tables -----------------------------------------------------
def test_rejections_by_reason_with_the_newest_samples():
    entries = [{"reason": r, "error_id": f"{i}-0", "data": "x" * (400 if i == 4 else 3)}
               for i, r in enumerate(["bad_json", "bad_command", "bad_json", "bad_json",
                                      "bad_json", "too_large", "bad_command"])]
    got = rejections(entries, samples=3)
    assert [(x["reason"], x["count"]) for x in got] == [
        ("bad_json", 4), ("bad_command", 2), ("too_large", 1)]
    assert [e["error_id"] for e in got[0]["latest"]] == ["4-0", "3-0", "2-0"]  # newest first
    assert got[0]["latest"][0]["data"] == "x" * 300 + "…"  # cut
    assert [e["error_id"] for e in got[1]["latest"]] == ["6-0", "1-0"]


def test_record_table_has_a_column_per_field_and_data_for_the_rest():
    recs = [Record("K1", 1, 0, "1-0", b'{"k": 1, "s": "a", "o": {"x": [1]}}'),
            Record("K2", 2, 0, "1-1", b'{"k": 2, "z": null}'),
            Record("K3", 3, 0, "1-2", b"not json <b>")]
    columns, rows = record_table(recs)
    assert columns == ["SOW key", "k", "s", "o", "z", "data"]
    assert rows == [["K1", "1", "a", '{"x":[1]}', "", ""],
                    ["K2", "2", "", "", "null", ""],
                    ["K3", "", "", "", "", "not json <b>"]]


# -- the pages, through Flask's test client ------------------------------------------------
@pytest.fixture
def dash(url):
    """``(Flask test client, sampler, Sow)``: rq-dashboard's app with the SOW page on the
    test Redis; the sampler reads only when the test calls ``sampler.sample()``."""
    from rq_dashboard.cli import make_flask_app
    from rq_dashboard.web import setup_rq_connection

    app = make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = url
    setup_rq_connection(app)
    sow = Sow(url, inline=True)
    sampler = Sampler(sow.r, interval_s=3600)
    # stopped before install starts its thread, which then ends without reading: its first
    # reading, at once, raced the test's own (a loaded run, 2026-11-28: begun before the
    # test's topics existed, it ended after the test's two readings and dropped topic b's)
    sampler.stop()
    install(app, sow, sampler=sampler)
    yield app.test_client(), sampler, sow


def _workload(sow: Sow, a: str, b: str) -> None:
    """Topic ``a`` (2 partitions): 30 inserts, 10 updates, 3 entries rejected as bad_json
    and 2 as bad_command, one record holding HTML; topic ``b`` (1 partition, expiration 1h):
    25 inserts, one entry appended and not applied."""
    ta = _topic(sow, a)
    sow.publish(a, [{"k": i, "v": i, "s": "<b>bold</b>"} for i in range(30)])
    sow.publish(a, [{"k": i, "v": 100 + i, "note": "<script>window.pwned=1</script>"}
                    for i in range(10)])
    last = ""
    for data, cmd in [(b"{bad", "publish")] * 3 + [(b'{"k": 1}', "frob")] * 2:
        last = sow.r.xadd(keys.log(a, 0), {"cmd": cmd, "data": data}).decode()
    sow.handoff(ta, {0: last}, True, 30)
    tb = _topic(sow, b, 1, 'expiration = "1h"\n')
    sow.publish(b, [{"k": i} for i in range(25)])
    sow.r.xadd(keys.log(tb.name, 0), {"cmd": "publish", "data": b'{"k": 1000}'})


def test_sow_pages_show_the_figures_of_stats(dash, topic_name):
    http, sampler, sow = dash
    a, b = topic_name + "a", topic_name + "b"
    _workload(sow, a, b)
    sampler.sample()
    sampler.sample()
    page = http.get("/sow/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    rows = {r[0]: r for r in Tables(html).tables["topics"][2:]}
    topics = load_topics(sow.r)
    for name, appended in ((a, 45), (b, 26)):
        st = topic_stats(sow.r, topics[name])
        row = rows[name]
        print(name, row, st)
        assert [num(v) for v in row[1:2] + row[6:7] + row[8:]] == [
            st["records"], st["lag"], st["errors"], st["with_expiry"],
            st["counters"]["expiries"], st["subscribers"], st["change_feed_blocks"]]
        assert log_appended(sow.r, topics[name]) == appended
    assert num(rows[a][1]) == 30 and num(rows[a][8]) == 5 and num(rows[b][6]) == 1
    assert num(rows[b][9]) == 25
    # the topic page: figures, partitions, rejections by reason
    html = http.get("/sow/topic", query_string={"name": a}).get_data(as_text=True)
    page_a = Tables(html)
    st = topic_stats(sow.r, topics[a])
    assert num(page_a.by_id["f-records"]) == st["records"] == 30
    assert num(page_a.by_id["f-errors"]) == st["errors"] == 5
    assert page_a.by_id["f-retention"].startswith("age 1h, count 100,000")
    totals = {r[0]: num(r[-1]) for r in page_a.tables["rates"][1:]}
    assert totals == {"in (log entries)": 45, "applied (log entries passed)": 45,
                      "inserts": 30, "updates": 10, "deletes": 0, "expiries": 0,
                      "queries": 0}
    parts = page_a.tables["partitions"][1:]
    want = partition_table(sow.r, topics[a])
    assert [[int(num(c)) for c in (r[0], r[1], r[2], r[4])] + [r[3], r[5]] for r in parts] == [
        [x["partition"], x["records"], x["log"], x["pending"], x["cursor"], "—"] for x in want]
    reasons = {r[0]: (num(r[1]), r[2]) for r in page_a.tables["rejections"][1:]}
    assert set(reasons) == {"bad_json", "bad_command"}
    assert reasons["bad_json"][0] == 3 and reasons["bad_command"][0] == 2
    assert reasons["bad_json"][1].count("{bad") == 3  # the 3 newest samples, with their data
    html_b = Tables(http.get("/sow/topic", query_string={"name": b}).get_data(as_text=True))
    assert num(html_b.by_id["f-lag"]) == 1 and num(html_b.by_id["f-with_expiry"]) == 25
    totals_b = {r[0]: num(r[-1].rstrip("*")) for r in html_b.tables["rates"][1:]}
    assert totals_b["in (log entries)"] == 26 and totals_b["applied (log entries passed)"] == 25
    series = orjson.loads(http.get("/sow/data/series.json", query_string={"name": b}).data)
    assert series["lag"] == [1] and len(series["t"]) == 1 and series["in"] == [0.0]


def test_sow_query_with_a_filter_and_a_bad_one(dash, topic_name):
    http, _sampler, sow = dash
    a, b = topic_name + "a", topic_name + "b"
    _workload(sow, a, b)
    q = {"name": a, "filter": "/v >= 5 AND /v < 100", "orderby": "/k DESC", "top_n": "50"}
    resp = http.get("/sow/topic", query_string=q)
    html = resp.get_data(as_text=True)
    assert resp.status_code == 200
    table = Tables(html).tables["query-result"]
    want = sow.sow(a, q["filter"], order_by="/k DESC")
    assert table[0] == ["SOW key", "k", "v", "s"]
    assert table[1:] == [[r.sow_key, str(r.obj()["k"]), str(r.obj()["v"]), "<b>bold</b>"]
                         for r in want]
    assert [row[1] for row in table[1:]] == [str(k) for k in range(29, 9, -1)]
    # values from Redis are escaped: the record's HTML is text, not markup
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html
    html = http.get("/sow/topic", query_string={"name": a, "filter": "/k < 3"}).get_data(
        as_text=True)
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in html
    assert "<script>window.pwned" not in html
    # a bad filter, a bad top_n: one line on the page, HTTP 200, no traceback
    for args, text in ((("/k = = 1", ""), "filter syntax error at column"),
                       (("/k = 1", "many"), "top_n must be a whole number"),
                       (("/k = 1", "-3"), "top_n must be from 0 to")):
        resp = http.get("/sow/topic", query_string={"name": a, "filter": args[0],
                                                    "top_n": args[1]})
        page = Tables(resp.get_data(as_text=True))
        print(page.by_id["query-error"])
        assert resp.status_code == 200 and text in page.by_id["query-error"]
        assert "\n" not in page.by_id["query-error"]
        assert "Traceback" not in resp.get_data(as_text=True)
    # an unknown topic, named with markup: 404, escaped
    resp = http.get("/sow/topic", query_string={"name": "<i>nope</i>"})
    assert resp.status_code == 404
    assert "&lt;i&gt;nope&lt;/i&gt;" in resp.get_data(as_text=True)
    assert "<i>nope</i>" not in resp.get_data(as_text=True)


def test_jobs_tab_opens_on_the_sow_queue_and_rq_pages_have_a_sow_tab(dash):
    http, _sampler, _sow = dash
    resp = http.get("/0/view/jobs")
    assert resp.status_code == 302
    assert resp.headers["Location"].endswith("/0/view/jobs/sow/queued/8/asc/1")
    assert http.get("/0/view/jobs/sow/queued/8/asc/1").status_code == 200
    for page in ("/", "/0/view/workers", "/0/view/jobs/sow/queued/8/asc/1"):
        html = http.get(page).get_data(as_text=True)
        assert re.search(r'<a href="/sow/" class="nav-link" id="sow-tab">SOW</a>', html), page
    # the SOW pages link to the three rq-dashboard tabs, Jobs through the redirect
    html = http.get("/sow/").get_data(as_text=True)
    assert 'href="/0/view/jobs"' in html and 'href="/0/view/workers"' in html
    # the chart library is served from the package, and nothing from elsewhere
    js = http.get("/sow/static/uPlot.iife.min.js")
    assert js.status_code == 200 and js.data.startswith(b"/*! https://github.com/leeoniya/uPlot")
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_pages_say_in_one_line_when_redis_cannot_be_reached():
    from rq_dashboard.cli import make_flask_app
    from rq_dashboard.web import setup_rq_connection

    from sow_redis.ops.server import free_port

    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    app = make_flask_app(None, None, None, "")
    app.config["RQ_DASHBOARD_REDIS_URL"] = dead
    setup_rq_connection(app)
    sampler = Sampler(Sow(dead).r, interval_s=3600)
    install(app, Sow(dead), sampler=sampler)  # its first reading fails
    try:
        deadline = time.monotonic() + 20
        while sampler.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"sampler: {sampler.error}")
        assert sampler.error and "\n" not in sampler.error
        http = app.test_client()
        for path in ("/sow/", "/sow/topic?name=x&filter=/k%20%3D%201"):
            resp = http.get(path)
            html = resp.get_data(as_text=True)
            print(path, resp.status_code, re.findall(r'sow-error">([^<]*)<', html))
            assert resp.status_code == 200 and "Traceback" not in html
            assert re.search(r'sow-error">cannot read the topics: [^<\n]*connect', html), html
    finally:
        sampler.stop()
