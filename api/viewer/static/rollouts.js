// The rollout list: filters (task, harness, status, reward range) kept in the page's query string, paged.
"use strict";

const PAGE_ROWS = 50;
const FILTERS = ["task_id", "harness", "status", "min_reward", "max_reward"];

function currentFilters() {
  const query = new URLSearchParams(window.location.search);
  const found = {};
  for (const name of FILTERS) found[name] = query.get(name) || "";
  found.offset = Number(query.get("offset") || 0);
  return found;
}

function fillMenus(form, facets, filters) {
  for (const [name, values] of [["harness", facets.harnesses], ["status", facets.statuses]]) {
    const menu = form.elements[name];
    for (const value of values) menu.append(el("option", { value, text: value }));
  }
  for (const name of FILTERS) form.elements[name].value = filters[name];
}

function statusBadge(status) {
  return el("span", { class: `badge ${status}`, text: status });
}

function rolloutRow(row) {
  const link = el("a", { href: `/viewer/rollout?id=${encodeURIComponent(row.rollout_id)}`, text: row.rollout_id });
  const harness = row.harness_name ? `${row.harness_name}@${row.harness_version || "?"}` : "–";
  return el("tr", { "data-rollout": row.rollout_id },
    el("td", { class: "mono" }, link), el("td", { class: "mono", text: row.task_id }), el("td", { text: harness }),
    el("td", {}, statusBadge(row.status)), el("td", { class: "num", text: fmtNumber(row.reward, 3) }),
    el("td", { class: "num", text: row.n_llm_calls }), el("td", { class: "num", text: row.n_tool_calls }),
    el("td", { class: "num", text: fmtNumber(row.n_response_tokens, 0) }),
    el("td", { class: "num", text: fmtMs(row.llm_latency_ms) }), el("td", { text: fmtTime(row.started_at) }));
}

function go(filters, offset) {
  const query = new URLSearchParams();
  for (const name of FILTERS) if (filters[name]) query.set(name, filters[name]);
  if (offset) query.set("offset", offset);
  window.location.search = query.toString();
}

async function start() {
  const form = document.getElementById("filters");
  const filters = currentFilters();
  const [facets, page] = await Promise.all([
    api("/v1/viewer/facets"),
    api("/v1/viewer/rollouts", { ...filters, limit: PAGE_ROWS }),
  ]);
  fillMenus(form, facets, filters);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const chosen = {};
    for (const name of FILTERS) chosen[name] = form.elements[name].value.trim();
    go(chosen, 0);
  });
  const body = document.querySelector("#rollouts tbody");
  body.replaceChildren(...page.items.map(rolloutRow));
  document.getElementById("empty").hidden = page.items.length > 0;
  const last = page.offset + page.items.length;
  document.getElementById("page-info").textContent =
    `${page.items.length ? page.offset + 1 : 0}–${last} shown · ${facets.n_rollouts} rollouts in all`;
  const prev = document.getElementById("prev");
  const next = document.getElementById("next");
  prev.disabled = page.offset === 0;
  next.disabled = page.next_offset === null;
  prev.addEventListener("click", () => go(filters, Math.max(0, page.offset - PAGE_ROWS)));
  next.addEventListener("click", () => go(filters, page.next_offset));
  document.body.dataset.ready = "rollouts";
}

document.addEventListener("DOMContentLoaded", () => boot(start));
