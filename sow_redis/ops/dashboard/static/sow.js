/* sow_redis dashboard, SOW page: refreshes the figures (#figures, rendered and escaped by
   the server: the fetched page's #figures replaces this one's) and draws the charts of the
   rates and the lag from /sow/data/series.json with uPlot (static/uPlot.iife.min.js).
   Text from Redis is only ever set with textContent or comes escaped by the server. */
(function () {
  "use strict";
  var refreshMs = parseInt(document.body.getAttribute("data-refresh-ms"), 10) || 2000;
  var toggle = document.getElementById("sow-autorefresh");
  var charts = {};

  function on() { return !toggle || toggle.checked; }

  function refreshFigures() {
    var box = document.getElementById("figures");
    if (!box) { return Promise.resolve(); }
    return fetch(box.getAttribute("data-src"), {cache: "no-store", credentials: "same-origin"})
      .then(function (resp) { return resp.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("figures");
        var chartBox = document.getElementById("charts");
        if (fresh) {
          var freshCharts = fresh.querySelector("#charts");
          if (freshCharts && chartBox) { freshCharts.replaceWith(chartBox); }  // keep the charts drawn
          box.replaceWith(fresh);
        }
      })
      .catch(function () { /* a failed refresh keeps the figures shown */ });
  }

  function width(el) { return Math.max(320, (el.parentElement || el).clientWidth - 10); }

  function draw(id, title, data, series, axes) {
    var el = document.getElementById(id);
    if (!el || typeof uPlot === "undefined") { return; }
    if (charts[id] && charts[id].root.isConnected) {
      charts[id].setData(data);
      return;
    }
    el.textContent = "";
    charts[id] = new uPlot({title: title, width: width(el), height: 200,
                            series: series, axes: axes}, data, el);
  }

  function refreshCharts() {
    var box = document.getElementById("charts");
    if (!box) { return Promise.resolve(); }
    return fetch(box.getAttribute("data-src"), {cache: "no-store", credentials: "same-origin"})
      .then(function (resp) { return resp.json(); })
      .then(function (s) {
        draw("chart-rates", "rate (log entries/s)", [s.t, s["in"], s.applied],
             [{}, {label: "in /s", stroke: "#1f77b4", width: 2},
              {label: "applied /s", stroke: "#2ca02c", width: 2, dash: [6, 4]}],
             [{}, {label: "entries/s"}]);
        draw("chart-lag", "lag", [s.t, s.lag, s.lag_age_s],
             [{}, {label: "lag (entries)", stroke: "#d62728", width: 2, scale: "n"},
              {label: "lag age (s)", stroke: "#ff7f0e", width: 2, scale: "s"}],
             [{}, {scale: "n", label: "entries"}, {scale: "s", side: 1, label: "s", grid: {show: false}}]);
        document.body.setAttribute("data-chart-points", String(s.t.length));
      })
      .catch(function () { /* no data yet */ });
  }

  function tick() {
    if (on()) { refreshFigures().then(refreshCharts); }
  }

  refreshCharts();
  setInterval(tick, refreshMs);
})();
