// argosy console: charts (uPlot) from JSON embedded in .chart elements, and log streaming.
"use strict";

const COLORS = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c"];

function width(el) { return Math.max(320, Math.min(el.parentElement.clientWidth || 800, 900)); }

function timeChart(el, d) {
  const total = Number(el.dataset.total || 0);
  const data = [d.t, d.allocated, d.useful];
  const series = [{}, {label: "allocated devices", stroke: COLORS[0], width: 2, points: {show: false}},
                  {label: "useful devices", stroke: COLORS[1], width: 2, points: {show: false}}];
  if (total) { data.push(d.t.map(() => total)); series.push({label: "owned", stroke: "#999", dash: [4, 4], points: {show: false}}); }
  return new uPlot({width: width(el), height: 220, series, scales: {y: {range: [0, Math.max(1, total)]}}}, data, el);
}

function lossChart(el, d) {
  return new uPlot({width: width(el), height: 200, scales: {x: {time: false}},
    series: [{label: "step"}, {label: "loss", stroke: COLORS[2], width: 2}]}, [d.step, d.loss], el);
}

function categoryChart(el, labels, rows, names, percent) {
  const x = labels.map((_, i) => i);
  const series = [{}].concat(names.map((n, i) => ({label: n, stroke: COLORS[i % COLORS.length], width: 2,
    points: {size: 8}, value: (u, v) => v == null ? "—" : (percent ? (v * 100).toFixed(1) + "%" : v.toFixed(0))})));
  const opts = {width: width(el), height: 240, padding: [12, 60, 0, 60],
    scales: {x: {time: false, range: [-0.3, labels.length - 0.7]}},
    axes: [{incrs: [1], values: (u, splits) => splits.map(i => Number.isInteger(i) ? (labels[i] || "") : "")},
           {values: (u, splits) => splits.map(v => percent ? (v * 100).toFixed(0) + "%" : v)}],
    series};
  return new uPlot(opts, [x].concat(rows), el);
}

function categories(el, items, names, percent) {
  const rows = names.map((_, p) => items.map(it => it.values[p]));
  return categoryChart(el, items.map(it => it.name), rows, names, percent);
}

function factorChart(el, d) { return categories(el, d.factors, d.policies, true); }

function jctChart(el, d) { return categories(el, d.jct, d.policies, false); }

function replicaChart(el, d) {
  if (!d.series.length) return null;
  const data = uPlot.join(d.series.map(([t, n]) => [t, n]));
  const series = [{}].concat(d.names.map((n, i) => ({label: n, stroke: COLORS[i % COLORS.length], width: 2,
    spanGaps: true, points: {show: false}, paths: uPlot.paths.stepped({align: 1})})));
  return new uPlot({width: width(el), height: 200, series, scales: {y: {range: (u, lo, hi) => [0, Math.max(1, hi + 1)]}}}, data, el);
}

function energyChart(el, d) {
  return new uPlot({width: width(el), height: 200, scales: {y: {range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)]}},
    series: [{}, {label: "average power (W)", stroke: COLORS[4], width: 2, points: {show: false}, paths: uPlot.paths.stepped({align: 1})}]},
    [d.t, d.watts], el);
}

const CHARTS = {replicas: replicaChart, utilization: timeChart, loss: lossChart, factors: factorChart, jct: jctChart, energy: energyChart};

function drawCharts(root) {
  root.querySelectorAll(".chart[data-chart]").forEach(el => {
    if (el.dataset.drawn) return;
    const d = JSON.parse(el.textContent);
    el.textContent = "";
    el.dataset.drawn = "1";
    CHARTS[el.dataset.chart](el, d);
  });
}

function streamLog(pre) {
  let offset = 0, file = "";
  const tick = async () => {
    try {
      const rank = encodeURIComponent(pre.dataset.rank || "0");
      const r = await fetch(`/jobs/${pre.dataset.job}/log?rank=${rank}&offset=${offset}&file=${encodeURIComponent(file)}`,
                            {credentials: "same-origin"});
      if (r.ok) {
        const body = await r.json();
        if (body.file !== file) { pre.textContent = ""; file = body.file; }
        offset = body.next;
        if (body.text) {
          const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          pre.textContent = (pre.textContent + body.text).slice(-200000);
          if (stick) pre.scrollTop = pre.scrollHeight;
        }
      }
    } catch (e) { /* the next tick tries again */ }
    setTimeout(tick, 1500);
  };
  tick();
}

document.addEventListener("DOMContentLoaded", () => {
  drawCharts(document);
  document.querySelectorAll("pre.log[data-job]").forEach(streamLog);  // ranks, launcher
});
document.body && document.body.addEventListener("htmx:afterSettle", e => drawCharts(e.target));
document.addEventListener("htmx:afterSettle", e => drawCharts(e.target));
// behaviour the templates would otherwise need inline handlers for (the CSP allows none)
document.addEventListener("change", e => {
  const form = e.target.closest && e.target.closest("form[data-autosubmit]");
  if (form) form.requestSubmit();
});
document.addEventListener("click", e => {
  if (e.target.matches && e.target.matches(".flash button.dismiss")) e.target.parentElement.remove();
});
document.addEventListener("htmx:sendError", () => {
  const f = document.getElementById("flash");
  if (f) f.innerHTML = '<div class="flash error">the server did not answer; retrying</div>';
});
