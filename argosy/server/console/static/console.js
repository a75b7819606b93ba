// argosy console: charts (uPlot) from JSON embedded in .chart elements, and log streaming.
"use strict";

const COLORS = ["#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c"];

function width(el) { return Math.max(320, Math.min(el.parentElement.clientWidth || 800, 900)); }

function timeChart(el, d) {
  const total = Number(el.dataset.total || 0);
  const data = [d.t, d.allocated, d.useful];
  const series = [{}, {label: "allocated devices", stroke: COLORS[0], width: 2},
                  {label: "useful devices", stroke: COLORS[1], width: 2}];
  if (total) { data.push(d.t.map(() => total)); series.push({label: "owned", stroke: "#999", dash: [4, 4]}); }
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
  const opts = {width: width(el), height: 240, scales: {x: {time: false}},
    axes: [{values: (u, splits) => splits.map(i => labels[i] || "")},
           {values: (u, splits) => splits.map(v => percent ? (v * 100).toFixed(0) + "%" : v)}],
    series};
  return new uPlot(opts, [x].concat(rows), el);
}

function factorChart(el, d) {
  const labels = Object.keys(d.factors);
  const rows = d.policies.map((_, p) => labels.map(f => d.factors[f][p]));
  return categoryChart(el, labels.map(l => l.replaceAll("_", " ")), rows, d.policies, true);
}

function jctChart(el, d) {
  const labels = Object.keys(d.jct_p50_s);
  const rows = d.policies.map((_, p) => labels.map(c => d.jct_p50_s[c][p]));
  return categoryChart(el, labels, rows, d.policies, false);
}

const CHARTS = {utilization: timeChart, loss: lossChart, factors: factorChart, jct: jctChart};

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
      const r = await fetch(`/jobs/${pre.dataset.job}/log?offset=${offset}&file=${encodeURIComponent(file)}`,
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
  const pre = document.getElementById("log");
  if (pre) streamLog(pre);
});
document.body && document.body.addEventListener("htmx:afterSettle", e => drawCharts(e.target));
document.addEventListener("htmx:afterSettle", e => drawCharts(e.target));
document.addEventListener("htmx:sendError", () => {
  const f = document.getElementById("flash");
  if (f) f.innerHTML = '<div class="flash error">the server did not answer; retrying</div>';
});
