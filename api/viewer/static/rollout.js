// One rollout (?id=ROLLOUT_ID): summary, a timeline of every step, and the token view.
"use strict";

const SPECIAL = /^<\|[^|]*\|>$/;  // chat-template markers such as <|im_start|>

function summaryList(summary) {
  const harness = summary.harness_name ? `${summary.harness_name}@${summary.harness_version || "?"}` : "–";
  const items = [
    ["Task", summary.task_id], ["Status", summary.status + (summary.reason ? ` (${summary.reason})` : "")],
    ["Reward", fmtNumber(summary.reward, 3)], ["Harness", harness], ["Policy", summary.policy_version || "–"],
    ["LLM calls", `${summary.n_llm_calls} (${summary.n_llm_errors} errors)`],
    ["Tool calls", `${summary.n_tool_calls} (${summary.n_tool_errors} errors)`],
    ["Tokens", `${fmtNumber(summary.n_prompt_tokens, 0)} prompt · ${fmtNumber(summary.n_response_tokens, 0)} sampled`],
    ["LLM latency", fmtMs(summary.llm_latency_ms)], ["Started", fmtTime(summary.started_at)],
  ];
  return items.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", { text: value })]);
}

// JSON text made readable: a JSON string shows as its text, anything else indented.
function prettyJson(text) {
  if (text === null || text === undefined) return null;
  try {
    const value = JSON.parse(text);
    return typeof value === "string" ? value : JSON.stringify(value, null, 2);
  } catch { return text; }
}

function messageList(messagesJson) {
  let messages;
  try { messages = JSON.parse(messagesJson); } catch { return [el("pre", { text: messagesJson })]; }
  if (!Array.isArray(messages)) return [el("pre", { text: messagesJson })];
  return messages.map((m) => {
    const content = typeof m.content === "string" ? m.content
      : Array.isArray(m.content) ? m.content.map((p) => p.text || "").join("") : "";
    const calls = m.tool_calls ? prettyJson(JSON.stringify(m.tool_calls)) : null;
    return el("div", { class: `message ${m.role || ""}` },
      el("span", { class: "role", text: m.role || "?" }), el("pre", { text: content || "" }),
      calls ? el("pre", { class: "tool-json", text: calls }) : null);
  });
}

function details(label, ...children) {
  const kept = children.filter((c) => c !== null);
  return kept.length ? el("details", {}, el("summary", { text: label }), ...kept) : null;
}

function llmStep(step, full) {
  const facts = [step.model, `${fmtNumber(step.n_prompt_tokens, 0)} → ${fmtNumber(step.n_response_tokens, 0)} tokens`,
    `latency ${fmtMs(step.latency_ms)}`, step.token_source, step.finish_reason].filter(Boolean).join(" · ");
  const request = full ? (full.messages ? messageList(full.messages) : [el("pre", { text: full.prompt || "" })]) : [];
  return [
    el("div", { class: "step-head" }, el("strong", { text: "LLM call " }), el("code", { text: step.call_id })),
    el("div", { class: "facts", text: facts }),
    step.error ? el("div", { class: "error-line", text: `error: ${step.error}` }) : null,
    el("pre", { class: "response", text: full ? (full.text || "") : (step.text_excerpt || "") }),
    full && full.tool_calls ? el("pre", { class: "tool-json", text: prettyJson(full.tool_calls) }) : null,
    details("Request messages", ...request),
    full && full.truncated ? el("div", { class: "muted", text: "long text cut for display" }) : null,
  ];
}

function toolStep(step, full) {
  const facts = [`duration ${fmtMs(step.duration_ms)}`,
    step.state_changed === null ? null : (step.state_changed ? "changed state" : "no state change")]
    .filter(Boolean).join(" · ");
  return [
    el("div", { class: "step-head" }, el("strong", { text: "Tool " }), el("code", { text: step.name })),
    el("div", { class: "facts", text: facts }),
    el("pre", { class: "tool-json", text: prettyJson(full ? full.arguments : step.arguments_excerpt) || "" }),
    step.error ? el("div", { class: "error-line", text: `error: ${step.error}` }) : null,
    el("pre", { class: "result", text: prettyJson(full ? full.result : step.result_excerpt) || "(no result yet)" }),
  ];
}

function stepBody(step, calls, tools) {
  switch (step.kind) {
    case "llm.call": return llmStep(step, calls.get(step.call_id));
    case "tool.call": return toolStep(step, tools.get(step.call_id));
    case "reward": return [
      el("div", { class: "step-head" }, el("strong", { text: "Reward " }), el("code", { text: step.name }),
        ` = ${fmtNumber(step.value, 3)}`),
      step.source ? el("div", { class: "facts", text: `from ${step.source}` }) : null];
    case "rollout.started": return [el("div", { class: "step-head" }, el("strong", { text: "Started" })),
      el("div", { class: "facts", text: `group ${step.group_id} · policy ${step.policy_version || "–"}` })];
    default: return [el("div", { class: "step-head" }, el("strong", { text: "Finished " }), statusText(step)),
      el("div", { class: "facts", text: step.reason || "" })];
  }
}

function statusText(step) {
  return el("span", { class: `badge ${step.status}`, text: step.status });
}

function timeline(detail) {
  const calls = new Map(detail.calls.map((c) => [c.call_id, c]));
  const tools = new Map(detail.tools.map((t) => [t.call_id, t]));
  return detail.trajectory.steps.map((step) => el("li", { class: `step ${step.kind.replace(".", "-")}` },
    el("span", { class: "when", text: `#${step.seq} · ${fmtTime(step.ts).slice(11)}` }),
    ...stepBody(step, calls, tools)));
}

// A dataset sample is marked by why it began; without a dataset each call is its own block.
function blockMarker(block, source) {
  if (source !== "dataset") {
    return el("div", { class: "sample-start call", "data-reason": block.start_reason },
      el("strong", { text: `Call ${block.call_ids[0]}` }), " · prompt (context) + response (sampled)");
  }
  const first = block.start_reason === "first";
  return el("div", { class: `sample-start ${first ? "first" : "mismatch"}`, "data-reason": block.start_reason },
    el("strong", { text: `Sample ${block.index}` }),
    first ? " · first call of its agent span" : ` · new sample: prefix mismatch (${block.start_reason})`,
    ` · calls ${block.call_ids.join(", ")}`);
}

function tokenBlock(block, source) {
  const marker = blockMarker(block, source);
  const masked = source === "dataset" ? "trained" : "sampled";
  const text = el("div", { class: "token-text" });
  const fragment = document.createDocumentFragment();
  block.ids.forEach((id, i) => {
    const span = document.createElement("span");
    const piece = block.pieces ? block.pieces[i] : null;
    span.className = `tok ${block.mask[i] ? masked : "context"}${piece && SPECIAL.test(piece) ? " special" : ""}`;
    span.textContent = piece === null ? `${id} ` : piece;
    span.title = `id ${id} · position ${i}`;
    fragment.append(span);
  });
  text.append(fragment);
  return el("section", { class: "token-block" }, marker, text,
    block.truncated ? el("div", { class: "muted", text: "… cut: the viewer draws at most its token cap" }) : null);
}

async function start() {
  const id = new URLSearchParams(window.location.search).get("id");
  if (!id) throw new Error("no rollout id in the address: open a rollout from the list");
  const detail = await api(`/v1/viewer/rollouts/${encodeURIComponent(id)}`);
  document.title = `${id} · trajlake viewer`;
  document.getElementById("title").textContent = `Rollout ${id}`;
  document.getElementById("summary").replaceChildren(...summaryList(detail.trajectory.summary));
  document.getElementById("timeline").replaceChildren(...timeline(detail));
  const tokens = detail.tokens;
  document.getElementById("token-note").textContent =
    `${tokens.note} · ${fmtNumber(tokens.n_tokens, 0)} tokens, ${fmtNumber(tokens.n_masked, 0)} with mask 1`;
  document.getElementById("tokens").replaceChildren(...tokens.blocks.map((b) => tokenBlock(b, tokens.source)));
  document.body.dataset.ready = "rollout";
}

document.addEventListener("DOMContentLoaded", () => boot(start));
