"""The HTML, CSS and script of the report page (``searchlab report``).

Kept as Python strings rather than package data files, so an installed searchlab always has
them. ``PAGE`` is filled with ``str.format``; ``STYLE`` and ``SCRIPT`` go in as values, so
their braces need no escaping.
"""

from __future__ import annotations

__all__ = ["PAGE", "SCRIPT", "STYLE"]

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="searchlab report">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<header>
<h1>{heading}</h1>
{summary}
<ul id="errors" class="errors" hidden></ul>
</header>
<main>
<section class="wide"><div id="learning-curves" class="chart"></div></section>
<section><div id="best-so-far" class="chart"></div></section>
<section><div id="rung-occupancy" class="chart"></div></section>
<section class="wide"><div id="parallel-coordinates" class="chart"></div></section>
<section class="wide"><div id="importance" class="chart short"></div></section>
<section class="wide">
<h2>Trials <small>(best first; click a column to sort)</small></h2>
<div class="table-box">{table}</div>
</section>
</main>
<script>{plotly_js}</script>
<script type="application/json" id="figures">{figures}</script>
<script>{script}</script>
</body>
</html>
"""

STYLE = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       margin: 0; background: #f4f5f7; color: #1d1f23; }
header { padding: 18px 28px 10px; background: #fff; border-bottom: 1px solid #dde1e6; }
h1 { font-size: 22px; margin: 0 0 8px; }
h2 { font-size: 16px; margin: 4px 0 10px; }
h2 small { font-weight: normal; color: #6b7280; }
table.summary th { text-align: left; padding-right: 16px; color: #6b7280; font-weight: 600; }
main { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; padding: 16px 28px 32px; }
section { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; padding: 10px;
          min-width: 0; }
section.wide { grid-column: 1 / -1; }
.chart { height: 440px; }
#parallel-coordinates { height: 420px; }
.chart.short { height: 300px; }
.errors { color: #b42318; background: #fef3f2; border: 1px solid #fecdca; padding: 8px 24px; }
.table-box { overflow-x: auto; max-height: 640px; overflow-y: auto; }
table.trials { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
table.trials th, table.trials td { padding: 4px 10px; border-bottom: 1px solid #eceef1;
                                   white-space: nowrap; text-align: left; }
table.trials td.number { text-align: right; }
table.trials td.missing { color: #9ca3af; text-align: center; }
table.trials thead th { position: sticky; top: 0; background: #f9fafb; cursor: pointer;
                        user-select: none; }
table.trials thead th:hover { background: #eef2f7; }
table.trials th[aria-sort="ascending"]::after { content: " \\25B2"; font-size: 10px; }
table.trials th[aria-sort="descending"]::after { content: " \\25BC"; font-size: 10px; }
table.trials tr.best td { font-weight: 600; }
table.trials tbody tr:hover td { background: #f5f8ff; }
@media (max-width: 900px) { main { grid-template-columns: 1fr; } }
"""

SCRIPT = """
(function () {
  "use strict";
  var errors = document.getElementById("errors");
  function showError(message) {
    var item = document.createElement("li");
    item.textContent = message;
    errors.appendChild(item);
    errors.hidden = false;
  }
  window.addEventListener("error", function (event) { showError(String(event.message)); });
  window.addEventListener("unhandledrejection", function (event) {
    showError(String(event.reason));
  });

  // Charts: every figure's div gets its plot; body[data-rendered] counts them when done.
  var figures = JSON.parse(document.getElementById("figures").textContent);
  var options = { responsive: true, displaylogo: false };
  var ids = Object.keys(figures);
  var plots = ids.map(function (id) {
    return Plotly.newPlot(id, figures[id].data, figures[id].layout, options);
  });
  Promise.all(plots).then(
    function () { document.body.setAttribute("data-rendered", String(ids.length)); },
    function (error) { showError("a chart could not be drawn: " + error); }
  );

  // The trials table: a click on a column header sorts by it (again: the other way).
  var table = document.getElementById("trials");
  var headers = table.tHead.rows[0].cells;
  function key(row, column) { return row.cells[column].getAttribute("data-sort"); }
  function sortBy(column, descending) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var numeric = rows.every(function (row) {
      var text = key(row, column);
      return text === "" || !isNaN(Number(text));
    });
    rows.sort(function (a, b) {
      var x = key(a, column), y = key(b, column);
      if (x === "" || y === "") { return (x === "") - (y === ""); }  // missing values last
      var order = numeric ? Number(x) - Number(y) : x.localeCompare(y, undefined, { numeric: true });
      return descending ? -order : order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.prototype.forEach.call(headers, function (cell, i) {
      if (i === column) { cell.setAttribute("aria-sort", descending ? "descending" : "ascending"); }
      else { cell.removeAttribute("aria-sort"); }
    });
  }
  Array.prototype.forEach.call(headers, function (cell, column) {
    cell.addEventListener("click", function () {
      sortBy(column, cell.getAttribute("aria-sort") === "ascending");
    });
  });
})();
"""
