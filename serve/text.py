"""Token ids to text: incremental detokenization with stop strings, and per-token strings/bytes.

The text released while streaming is always a prefix of the final text, so
the streamed deltas concatenate to exactly the non-streamed text:
- trailing U+FFFD (an unfinished multi-byte character) is held back until the
  next token completes it or the generation ends;
- with stop strings, the last ``len(longest stop) - 1`` characters are held
  back, because they may be the start of a stop string;
- on a stop string the text ends just before it (the token ids keep the token
  that completed it, as in vLLM).
"""

from __future__ import annotations

from functools import lru_cache

REPLACEMENT = "\ufffd"


class IncrementalText:
    """The text of a growing list of generated ids, released as safe deltas."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(s for s in stop if s)
        self._holdback = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self._text = ""
        self._released = 0
        self.stop_string: str | None = None
        """The stop string that ended the text, once one has."""

    @property
    def text(self) -> str:
        """All text so far (cut before a stop string once one matched)."""
        return self._text

    @property
    def released(self) -> int:
        """How many characters of ``text`` have been released."""
        return self._released

    def push(self, token_id: int) -> str:
        """Add one token; return the text that can be released now (maybe empty)."""
        if self.stop_string is not None:
            raise RuntimeError("text already ended at a stop string")
        self._ids.append(token_id)
        full = self._tokenizer.decode(self._ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        self._text = full
        if self._stop and self._find_stop(full):
            return self.finish()
        stable = len(full.rstrip(REPLACEMENT)) - self._holdback
        return self._release(stable)

    def finish(self) -> str:
        """The generation ended: release everything still held back."""
        return self._release(len(self._text))

    def _find_stop(self, full: str) -> bool:
        start = max(0, self._released - len(max(self._stop, key=len)))
        hits = [(i, s) for s in self._stop if (i := full.find(s, start)) >= 0]
        if not hits:
            return False
        index, self.stop_string = min(hits)
        self._text = full[:index]
        return True

    def _release(self, upto: int) -> str:
        if upto <= self._released:
            return ""
        delta = self._text[self._released : upto]
        self._released = upto
        return delta


class TokenStrings:
    """Per-token display string and exact bytes, as the OpenAI logprobs format wants them."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}

    def string(self, token_id: int) -> str:
        """The token decoded on its own (special tokens shown as written)."""
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def bytes(self, token_id: int) -> list[int]:
        """The token's exact bytes (a byte-level BPE token may hold half a character)."""
        if token_id in self._added:
            return list(self._added[token_id].encode("utf-8"))
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        decoder = _byte_decoder()
        if piece is not None and all(ch in decoder for ch in piece):
            return [decoder[ch] for ch in piece]
        return list(self.string(token_id).encode("utf-8"))


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-printable-character map used by byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}
