"""End to end in headless Chromium: the viewer pages over a real lake, served by uvicorn on a real port.

The lake is built by the real pipeline: synthetic agent rollouts of two
tenants (``devkit.workload``) through the ingester's row mapping into Delta
tables, then ``build_dataset`` for acme alone (merged samples with prefix
mismatches). The viewer decodes tokens with the tiny model's local
tokenizer. Screenshots land in ``tests/artifacts/`` (gitignored).

Needs Debian's ``chromium`` (``/usr/bin/chromium``) and ``playwright`` (the
dev extra; its own browser downloads are never used). Skipped when the
browser is absent outside CI; in CI (``CI`` set) a missing browser fails.
"""

from __future__ import annotations

import os
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


from tests.store.lake_builder import event, write_events

from ingest.gateway.auth import KeyRing  # noqa: E402
from devkit.workload import WorkloadConfig, generate_events  # noqa: E402
from pipelines import BuildConfig, build_dataset, read_dataset  # noqa: E402
from api import create_query_app  # noqa: E402
from schemas.events import EVENT_ADAPTER  # noqa: E402
from store.lake import Lake  # noqa: E402
from trajlake.commands.query_api import QueryApiSettings  # noqa: E402
from devkit.tiny_model import build_tiny_model, default_model_dir  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).parents[1] / "artifacts"
KEYS = {"key-acme": "acme", "key-beta": "beta"}
WORKLOAD = WorkloadConfig(
    tasks=8, rollouts_per_task=6, seed=5, min_calls=3, max_calls=8, max_context_tokens=1200, vocab_size=2048,
    drift_rate=0.2, summarisation_rate=0.15, failure_rate=0.3, tenants=("acme", "beta"),
    harness_versions=("1.4.0", "1.5.0"), rollout_spacing_ms=20 * 60 * 1000,
)
"""Rollouts 20 minutes apart over ~16 hours (hourly chart buckets); vocabulary = the tiny tokenizer's."""
HOSTILE_ROLLOUT = "hostile"
HOSTILE_TEXT = '<img src=x onerror="window.__ran=1"><script>window.__ran=2</script>'


def _browser_or_skip() -> Any:
    """Playwright's sync API; skip when Debian's chromium is missing outside CI, fail when it is missing in CI."""
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is missing (apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"the viewer's browser test must run in CI: {missing}")
        pytest.skip(missing)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: pip install -e '.[dev]' (its browser downloads are not needed)")
    return sync_playwright


def _hostile_rollout() -> list[Any]:
    """An acme rollout whose texts are HTML that would run script if a page parsed it (no harness: not charted)."""
    k = {"rollout_id": HOSTILE_ROLLOUT, "tenant": "acme", "task_id": "t-hostile"}
    return [
        event("llm.request", {"call_id": "c1", "messages": [{"role": "user", "content": HOSTILE_TEXT}]}, seq=0, **k),
        event("llm.response", {"call_id": "c1", "text": HOSTILE_TEXT}, seq=1, **k),
        event("tool.call", {"call_id": "t1", "name": "bash", "arguments": {"cmd": HOSTILE_TEXT}}, seq=2, **k),
        event("tool.result", {"call_id": "t1", "name": "bash", "result": HOSTILE_TEXT}, seq=3, **k),
    ]


class Facts:
    """What the pages must show, computed from the generated events and the dataset (not through the API)."""

    def __init__(self, lake: Lake, events: list[Any]) -> None:
        self.status = {e.rollout_id: e.payload.status for e in events if e.type == "rollout.finished"}
        self.tenant = {e.rollout_id: e.tenant for e in events}
        self.version = {e.rollout_id: e.harness.version for e in events if e.harness}
        self.calls = Counter(e.rollout_id for e in {(e.rollout_id, e.payload.call_id): e for e in events
                                                     if e.type == "llm.request"}.values())
        self.samples = read_dataset(lake, "viewer").sort_by("sample_index").to_pylist()
        responses = {(e.rollout_id, e.payload.call_id): e.payload.response_token_ids or []
                     for e in events if e.type == "llm.response"}
        self.sampled = Counter()
        for (rollout, _), ids in responses.items():
            self.sampled[rollout] += len(ids)

    def of(self, tenant: str) -> set[str]:
        return {r for r, t in self.tenant.items() if t == tenant}

    def most_merged(self) -> str:
        """The dataset rollout with the most samples (mismatches included)."""
        return Counter(s["rollout_id"] for s in self.samples).most_common(1)[0][0]


@pytest.fixture(scope="module")
def viewer_site(tmp_path_factory) -> Iterator[tuple[str, Facts, Path]]:
    """(base URL, facts, tokenizer folder): the query API with the viewer on a free loopback port."""
    import uvicorn

    lake = Lake(str(tmp_path_factory.mktemp("viewer") / "lake"))
    events = [EVENT_ADAPTER.validate_python(e) for e in generate_events(WORKLOAD)]
    write_events(lake, events)
    build_dataset(lake, "viewer", BuildConfig(selection={"tenants": ["acme"]}))
    hostile = _hostile_rollout()
    write_events(lake, hostile)
    events += hostile
    tokenizer = build_tiny_model(default_model_dir())
    settings = QueryApiSettings(lake=lake.root, viewer_tokenizer=tokenizer, snapshot_ttl_s=0.0)
    app = create_query_app(settings, keys=KeyRing(KEYS))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        threading.Event().wait(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", Facts(lake, events), tokenizer
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


@pytest.fixture(scope="module")
def page(viewer_site) -> Iterator[Any]:
    sync_playwright = _browser_or_skip()
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        context.set_default_timeout(20_000)
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.on("console", lambda m: errors.append(m.text)
               if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
        yield tab
        context.close()
        browser.close()
    assert not errors, f"the pages logged errors: {errors}"


def _sign_in(page: Any, base: str, key: str) -> None:
    """Forget the tab's key and enter ``key`` in the list page's key form."""
    page.goto(f"{base}/viewer")
    page.evaluate("sessionStorage.clear()")
    page.reload()
    page.fill("#key-input", key)
    page.click("#key-form button")


def _rows(page: Any) -> list[str]:
    return page.locator("#rollouts tbody tr").evaluate_all("rows => rows.map(r => r.dataset.rollout)")


def test_wrong_key_is_refused_and_asked_again(viewer_site, page) -> None:
    base, _, _ = viewer_site
    _sign_in(page, base, "not-a-key")
    page.wait_for_selector("#key-dialog:not([hidden])")
    assert "not accepted" in page.text_content("#key-message")
    assert page.evaluate("sessionStorage.getItem('trajlake.viewer.key')") is None
    assert _rows(page) == []


def test_list_filter_and_rollout_page(viewer_site, page) -> None:
    base, facts, tokenizer = viewer_site
    _sign_in(page, base, "key-acme")
    page.wait_for_selector("body[data-ready=rollouts]")
    assert set(_rows(page)) == facts.of("acme")  # the key's tenant, all of it, nothing of beta's

    page.select_option("select[name=harness]", "synthetic-agent@1.5.0")
    page.select_option("select[name=status]", "succeeded")
    page.click("#filters button")
    page.wait_for_url("**status=succeeded**")
    page.wait_for_selector("body[data-ready=rollouts]")
    wanted = {r for r in facts.of("acme") if facts.version.get(r) == "1.5.0" and facts.status.get(r) == "succeeded"}
    assert wanted and set(_rows(page)) == wanted
    page.screenshot(path=str(ARTIFACTS / "viewer-list.png"))

    rollout = facts.most_merged()
    page.goto(f"{base}/viewer")
    page.click(f"#rollouts tr[data-rollout='{rollout}'] a")
    page.wait_for_selector("body[data-ready=rollout]")
    assert page.locator(".step.llm-call").count() == facts.calls[rollout]
    assert page.locator(".step.rollout-finished .badge").text_content() == facts.status[rollout]

    samples = [s for s in facts.samples if s["rollout_id"] == rollout]
    reasons = page.locator(".sample-start").evaluate_all("m => m.map(x => x.dataset.reason)")
    assert reasons == [s["start_reason"] for s in samples] and "first" in reasons and len(set(reasons)) > 1
    assert page.locator("#tokens .tok.trained").count() == sum(sum(s["loss_mask"]) for s in samples)
    assert page.locator("#tokens .tok").count() == sum(len(s["input_ids"]) for s in samples)

    from transformers import AutoTokenizer

    first = samples[0]["input_ids"][:40]
    first_block = page.locator(".token-block").first.locator(".tok")
    pieces = first_block.evaluate_all("t => t.slice(0, 40).map(x => x.textContent)")
    assert pieces == [AutoTokenizer.from_pretrained(str(tokenizer)).decode([i]) for i in first]
    page.screenshot(path=str(ARTIFACTS / "viewer-rollout.png"), clip={"x": 0, "y": 0, "width": 1440, "height": 900})


def test_success_chart_has_a_band_per_harness_version(viewer_site, page) -> None:
    base, facts, _ = viewer_site
    _sign_in(page, base, "key-acme")
    page.wait_for_selector("body[data-ready=rollouts]")
    page.click("nav a[href='/viewer/success']")
    page.wait_for_selector("body[data-ready=success]")
    bands = page.locator("#chart svg polygon.band").evaluate_all("b => b.map(x => x.dataset.harness)")
    versions = {facts.version[r] for r in facts.of("acme") if r in facts.status}
    assert set(bands) == {f"synthetic-agent@{v}" for v in versions}  # one band per run of consecutive hours
    assert "hour" in page.text_content("#chart-note")
    ended = sum(1 for r in facts.of("acme") if r in facts.status)
    counts = page.locator("#chart-table tbody tr td:nth-child(3)").all_text_contents()
    assert sum(int(c) for c in counts) == ended
    page.screenshot(path=str(ARTIFACTS / "viewer-success.png"), full_page=True)


def test_another_key_sees_only_its_tenant(viewer_site, page) -> None:
    base, facts, _ = viewer_site
    _sign_in(page, base, "key-beta")
    page.wait_for_selector("body[data-ready=rollouts]")
    assert set(_rows(page)) == facts.of("beta")

    beta_rollout = max(facts.of("beta"), key=lambda r: facts.sampled[r])  # no dataset holds beta's rollouts
    page.click(f"#rollouts tr[data-rollout='{beta_rollout}'] a")
    page.wait_for_selector("body[data-ready=rollout]")
    assert "no dataset contains this rollout" in page.text_content("#token-note")
    assert page.locator("#tokens .tok.sampled").count() == facts.sampled[beta_rollout] > 0
    assert page.locator("#tokens .tok.trained").count() == 0
    assert set(page.locator(".sample-start").evaluate_all("m => m.map(x => x.dataset.reason)")) == {"call"}
    page.screenshot(path=str(ARTIFACTS / "viewer-rollout-no-dataset.png"))
    acme_rollout = facts.most_merged()
    page.goto(f"{base}/viewer/rollout?id={acme_rollout}")
    page.wait_for_selector("#error:not([hidden])")
    assert "no rollout" in page.text_content("#error")
    assert page.locator("#tokens .tok").count() == 0


def test_lake_text_is_shown_as_text_and_never_run(viewer_site, page) -> None:
    base, _, _ = viewer_site
    _sign_in(page, base, "key-acme")
    page.wait_for_selector("body[data-ready=rollouts]")
    page.goto(f"{base}/viewer/rollout?id={HOSTILE_ROLLOUT}")
    page.wait_for_selector("body[data-ready=rollout]")
    assert page.text_content(".step.llm-call pre.response") == HOSTILE_TEXT
    assert page.text_content(".step.tool-call pre.result") == HOSTILE_TEXT
    assert page.locator("#main img, #main script").count() == 0
    assert page.evaluate("window.__ran") is None
