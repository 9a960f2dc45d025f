"""The rollout page's token view: a dataset's merged samples, else the calls' own tokens.

The view comes from the newest dataset version the tenant may see
(``visibility``) that contains the rollout (``dataset_lineage`` says which
do): one block per merged sample, its ``loss_mask`` and why it began
(``first`` or the mismatch class). When no such version exists, each LLM
call is one block: its prompt tokens as context and its response tokens as
sampled (mask 1). Token text needs a local tokenizer folder
(``TokenDecoder``); without one the page shows ids.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from api.viewer.models import TokenBlock, TokenView
from api.visibility import VisibleVersion, visible_versions
from api.workers import RemoteSandbox
from schemas.tables import DATASET_LINEAGE_TABLE, LLM_CALLS_VIEW, dataset_table
from store.lake import Lake
from store.prompts import full_prompts, stored_calls

log = logging.getLogger(__name__)

MAX_TOKENS_SHOWN = 60_000
"""Tokens one rollout page draws at most (browsers stay responsive below ~100k spans)."""

_SAMPLE_COLUMNS = ["sample_index", "start_reason", "call_ids", "input_ids", "loss_mask"]
_CALL_TOKENS = (f"SELECT call_id, prompt_token_ids, response_token_ids, extends_call_id, extends_tokens "
                f"FROM {LLM_CALLS_VIEW} "
                "WHERE rollout_id = ? ORDER BY seq, requested_at, call_id")


class TokenDecoder:
    """Decodes token ids to text pieces with a local Hugging Face tokenizer folder, loaded on first use.

    >>> TokenDecoder(Path("./tiny-model")).pieces([1, 2, 3])  # doctest: +SKIP
    ['<|im_start|>', '<|im_end|>', '\\x00']
    """

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._failed: str | None = None
        self._cache: dict[int, str] = {}

    def pieces(self, ids: list[int]) -> list[str] | None:
        """The text of each id (None without a usable tokenizer; ids out of its vocabulary read ``<id>``)."""
        tokenizer = self._load()
        if tokenizer is None:
            return None
        missing = [i for i in set(ids) if i not in self._cache]
        for i in missing:
            self._cache[i] = tokenizer.decode([i]) if 0 <= i < len(tokenizer) else f"<{i}>"
        return [self._cache[i] for i in ids]

    @property
    def problem(self) -> str | None:
        """Why ids are not decoded (no folder configured, or it failed to load)."""
        if self.folder is None:
            return "no tokenizer configured (set TRAJLAKE_VIEWER_TOKENIZER to a local tokenizer folder)"
        return self._failed

    def _load(self) -> Any:
        if self.folder is None or self._failed:
            return None
        with self._lock:
            if self._tokenizer is None and self._failed is None:
                try:
                    from transformers import AutoTokenizer

                    self._tokenizer = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
                except (OSError, ValueError) as e:
                    self._failed = (f"tokenizer folder {str(self.folder)!r} could not be loaded ({e}); "
                                    "point TRAJLAKE_VIEWER_TOKENIZER at a folder with tokenizer.json")
                    log.warning("viewer_tokenizer_failed folder=%s error=%r", self.folder, str(e)[:200])
            return self._tokenizer


def token_view(lake: Lake, box: RemoteSandbox, rollout_id: str, decoder: TokenDecoder) -> TokenView:
    """The token blocks of one of ``box.tenant``'s rollouts (from a dataset when one contains it)."""
    found = _newest_version_with(lake, box.tenant, rollout_id)
    if found is not None:
        rows = _sample_rows(lake, found, box.tenant, rollout_id)
        if rows:
            blocks = [(r["start_reason"], r["call_ids"], r["input_ids"], r["loss_mask"]) for r in rows]
            note = (f"merged samples of dataset {found.dataset} version {found.version}: "
                    "trained tokens (loss mask 1) and context")
            return _view("dataset", blocks, decoder, note, found)
    calls = box.execute(_CALL_TOKENS, [rollout_id]).to_pylist()
    prompts, _ = full_prompts(stored_calls(calls))  # prefix references resolved; an unresolved prompt is not shown
    blocks = []
    for c in calls:
        prompt = prompts[c["call_id"]].tolist() if c["call_id"] in prompts else []
        response = c["response_token_ids"] or []
        if prompt or response:
            blocks.append(("call", [c["call_id"]], [*prompt, *response], [0] * len(prompt) + [1] * len(response)))
    if not blocks:
        return _view("none", [], decoder, "no dataset contains this rollout and its calls carry no token ids", None)
    return _view("calls", blocks, decoder, "no dataset contains this rollout yet: each call's prompt (context) "
                 "and response tokens (sampled by the engine)", None)


def _newest_version_with(lake: Lake, tenant: str, rollout_id: str) -> VisibleVersion | None:
    """The newest (by creation time) dataset version built for ``tenant`` alone that holds the rollout."""
    versions = [v for vs in visible_versions(lake, tenant).values() for v in vs]
    if not versions or not lake.exists(DATASET_LINEAGE_TABLE):
        return None
    used = lake.read(
        DATASET_LINEAGE_TABLE, columns=["dataset", "version"],
        filter=pc.field("rollout_id") == pa.scalar(rollout_id, pa.string()))
    holding = set(zip(used["dataset"].to_pylist(), used["version"].to_pylist()))
    found = [v for v in versions if (v.dataset, v.version) in holding and v.read_version is not None]
    return max(found, key=lambda v: (v.row["created_at"], v.version), default=None)


def _sample_rows(lake: Lake, version: VisibleVersion, tenant: str, rollout_id: str) -> list[dict[str, Any]]:
    wanted = (pc.field("rollout_id") == pa.scalar(rollout_id, pa.string())) & (
        pc.field("tenant") == pa.scalar(tenant, pa.string()))
    rows = lake.read(dataset_table(version.dataset), version=version.read_version, columns=_SAMPLE_COLUMNS, filter=wanted)
    return sorted(rows.to_pylist(), key=lambda r: r["sample_index"])


def _view(source: str, blocks: list[tuple[str, list[str], list[int], list[int]]], decoder: TokenDecoder,
          note: str, version: VisibleVersion | None) -> TokenView:
    """Cut the blocks at ``MAX_TOKENS_SHOWN`` in total and decode what is shown."""
    budget, shown = MAX_TOKENS_SHOWN, []
    for index, (reason, call_ids, ids, mask) in enumerate(blocks):
        keep = min(len(ids), budget)
        budget -= keep
        shown.append(TokenBlock(index=index, start_reason=reason, call_ids=call_ids, ids=ids[:keep],
                                mask=[int(m) for m in mask[:keep]], pieces=decoder.pieces(ids[:keep]),
                                truncated=keep < len(ids)))
    problem = decoder.problem
    return TokenView(
        source=source, dataset=version.dataset if version else None, version=version.version if version else None,
        blocks=shown, n_tokens=sum(len(b[2]) for b in blocks), n_masked=sum(int(sum(b[3])) for b in blocks),
        note=note + (f"; token ids shown: {problem}" if problem and blocks else ""),
    )
