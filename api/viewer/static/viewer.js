// Shared by the viewer pages: the API key (sessionStorage, this tab only), JSON fetches, DOM helpers.
// Text from the lake is only ever set with textContent, never parsed as HTML.
"use strict";

const KEY_SLOT = "trajlake.viewer.key";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  return node;
}

function fmtNumber(value, digits) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString(undefined, { maximumFractionDigits: digits === undefined ? 2 : digits });
}

function fmtMs(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`;
}

function fmtTime(iso) {
  if (!iso) return "–";
  return new Date(iso).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.error ? `${body.error.message}${body.error.hint ? " — " + body.error.hint : ""}` : "";
    super(detail || `request failed (HTTP ${status})`);
    this.status = status;
  }
}

// Calls the JSON API with the tab's key; on 401 forgets the key and asks again; retries 429 (busy) with backoff.
async function api(path, params) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
  }
  const key = sessionStorage.getItem(KEY_SLOT);
  let response;
  // 429: the tenant's query slots are taken (a page fires several calls at once); wait and ask again.
  for (let attempt = 0; ; attempt++) {
    response = await fetch(url, { headers: { Authorization: `Bearer ${key}` }, credentials: "omit" });
    if (response.status !== 429 || attempt >= 6) break;
    await new Promise((resolve) => setTimeout(resolve, 250 * 2 ** attempt));
  }
  const body = await response.json().catch(() => null);
  if (response.status === 401) {
    sessionStorage.removeItem(KEY_SLOT);
    askForKey("That key was not accepted. Enter an API key of your tenant.");
    throw new ApiError(401, body);
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}

// Shows the key form (page content stays hidden) and reloads the page once a key is entered.
function askForKey(message) {
  const dialog = document.getElementById("key-dialog");
  document.getElementById("key-message").textContent = message;
  dialog.hidden = false;
  document.getElementById("main").hidden = true;
  document.getElementById("key-input").focus();
}

function showError(error) {
  if (error instanceof ApiError && error.status === 401) return;
  const box = document.getElementById("error");
  box.textContent = error.message;
  box.hidden = false;
}

// Wires the header (key form, sign-out) and runs start() once a key is known.
function boot(start) {
  document.getElementById("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = document.getElementById("key-input").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY_SLOT, key);
    window.location.reload();
  });
  document.getElementById("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_SLOT);
    window.location.reload();
  });
  if (!sessionStorage.getItem(KEY_SLOT)) {
    askForKey("Enter an API key: the viewer shows that key's tenant only. It is kept in this tab until you close it.");
    return;
  }
  start().catch(showError);
}
