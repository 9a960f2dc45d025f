// Success rate by harness version over time: one line per version, its Wilson interval as a band.
"use strict";

const COLOURS = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f"];
const SIZE = { width: 960, height: 360, left: 56, right: 180, top: 16, bottom: 40 };

const BUCKET_MS = { hour: 3600e3, day: 86400e3 };

// x spans the buckets with half a bucket of room on each side; y is 0..100%.
function scales(series, bucketMs) {
  const times = series.flatMap((s) => s.points.map((p) => Date.parse(p.bucket)));
  const first = Math.min(...times);
  const last = Math.max(...times);
  const from = first - bucketMs / 2;
  const span = last - first + bucketMs;
  const plotW = SIZE.width - SIZE.left - SIZE.right;
  const plotH = SIZE.height - SIZE.top - SIZE.bottom;
  return {
    first, last,
    x: (iso) => SIZE.left + ((Date.parse(iso) - from) / span) * plotW,
    y: (rate) => SIZE.top + (1 - rate) * plotH,
  };
}

function axes(svg, scale, bucket) {
  for (const rate of [0, 0.25, 0.5, 0.75, 1]) {
    const y = scale.y(rate);
    svg.append(svgEl("line", { x1: SIZE.left, x2: SIZE.width - SIZE.right, y1: y, y2: y, class: "grid" }));
    const label = svgEl("text", { x: SIZE.left - 8, y: y + 4, class: "axis", "text-anchor": "end" });
    label.textContent = `${rate * 100}%`;
    svg.append(label);
  }
  const bucketMs = BUCKET_MS[bucket];
  const step = bucketMs * Math.max(1, Math.ceil((scale.last - scale.first) / bucketMs / 8));
  for (let t = scale.first; t <= scale.last; t += step) {
    const iso = new Date(t).toISOString();
    const label = svgEl("text", { x: scale.x(iso), y: SIZE.height - SIZE.bottom + 20, class: "axis",
      "text-anchor": "middle" });
    label.textContent = bucket === "hour" ? iso.slice(5, 16).replace("T", " ") : iso.slice(0, 10);
    svg.append(label);
  }
}

// Consecutive buckets form one run; a gap (no ended rollout in a bucket) breaks the line and its band.
function runs(points, bucketMs) {
  const found = [];
  for (const point of points) {
    const run = found[found.length - 1];
    if (run && Date.parse(point.bucket) - Date.parse(run[run.length - 1].bucket) === bucketMs) run.push(point);
    else found.push([point]);
  }
  return found;
}

function band(scale, run, halfWidth) {
  const xs = run.map((p) => scale.x(p.bucket));
  if (run.length === 1) xs.splice(0, 1, xs[0] - halfWidth, xs[0] + halfWidth);
  const at = (i) => run[Math.min(i, run.length - 1)];
  const upper = xs.map((x, i) => `${x},${scale.y(at(i).high)}`);
  const lower = xs.map((x, i) => `${x},${scale.y(at(i).low)}`).reverse();
  return [...upper, ...lower].join(" ");
}

function seriesShapes(svg, scale, series, colour, row, bucketMs) {
  const at = (t) => scale.x(new Date(t).toISOString());
  const halfWidth = (at(scale.first + bucketMs) - at(scale.first)) / 5;  // a lone bucket's band: 2/5 of a bucket
  for (const run of runs(series.points, bucketMs)) {
    svg.append(svgEl("polygon", { points: band(scale, run, halfWidth), class: "band", fill: colour,
      "data-harness": series.harness }));
    svg.append(svgEl("polyline", { points: run.map((p) => `${scale.x(p.bucket)},${scale.y(p.rate)}`).join(" "),
      class: "rate", stroke: colour }));
  }
  for (const p of series.points) {
    const dot = svgEl("circle", { cx: scale.x(p.bucket), cy: scale.y(p.rate), r: 3.5, fill: colour });
    const tip = svgEl("title", {});
    const interval = `${(p.low * 100).toFixed(0)}–${(p.high * 100).toFixed(0)}%`;
    tip.textContent = `${series.harness} ${p.bucket}: ${p.succeeded}/${p.n} succeeded (${interval})`;
    dot.append(tip);
    svg.append(dot);
  }
  const y = SIZE.top + 14 + row * 20;
  svg.append(svgEl("rect", { x: SIZE.width - SIZE.right + 16, y: y - 9, width: 12, height: 12, fill: colour }));
  const name = svgEl("text", { x: SIZE.width - SIZE.right + 34, y: y + 1, class: "legend-text" });
  name.textContent = series.harness;
  svg.append(name);
}

function draw(chart) {
  const holder = document.getElementById("chart");
  const series = chart.series.filter((s) => s.points.length);
  if (!series.length) {
    holder.replaceChildren(el("p", { class: "muted", text: "No ended rollout yet." }));
    return;
  }
  const svg = svgEl("svg", { viewBox: `0 0 ${SIZE.width} ${SIZE.height}`, role: "img",
    "aria-label": "success rate by harness version over time" });
  const bucketMs = BUCKET_MS[chart.bucket];
  const scale = scales(series, bucketMs);
  axes(svg, scale, chart.bucket);
  series.forEach((s, i) => seriesShapes(svg, scale, s, COLOURS[i % COLOURS.length], i, bucketMs));
  holder.replaceChildren(svg);
}

function table(chart) {
  const rows = chart.series.flatMap((s) => s.points.map((p) => el("tr", {},
    el("td", { text: s.harness }), el("td", { text: fmtTime(p.bucket) }), el("td", { class: "num", text: p.n }),
    el("td", { class: "num", text: p.succeeded }), el("td", { class: "num", text: `${(p.rate * 100).toFixed(1)}%` }),
    el("td", { class: "num", text: `${(p.low * 100).toFixed(1)}–${(p.high * 100).toFixed(1)}%` }))));
  document.querySelector("#chart-table tbody").replaceChildren(...rows);
}

async function start() {
  const form = document.getElementById("chart-form");
  const query = new URLSearchParams(window.location.search);
  const chosen = { harness: query.get("harness") || "", bucket: query.get("bucket") || "auto" };
  const [facets, chart] = await Promise.all([api("/v1/viewer/facets"), api("/v1/viewer/success-rate", chosen)]);
  const names = [...new Set(facets.harnesses.map((h) => h.split("@")[0]))];
  for (const name of names) form.elements.harness.append(el("option", { value: name, text: name }));
  form.elements.harness.value = chosen.harness;
  form.elements.bucket.value = chosen.bucket;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    if (form.elements.harness.value) next.set("harness", form.elements.harness.value);
    next.set("bucket", form.elements.bucket.value);
    window.location.search = next.toString();
  });
  document.getElementById("chart-note").textContent =
    `Ended rollouts per ${chart.bucket}; bands are ${Math.round(chart.confidence * 100)}% Wilson score intervals.`;
  draw(chart);
  table(chart);
  document.body.dataset.ready = "success";
}

document.addEventListener("DOMContentLoaded", () => boot(start));
