"""Incremental detokenization with stop strings, and per-token strings/bytes (tiny tokenizer)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from serve.text import IncrementalText, TokenStrings, _byte_decoder


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _byte_level_ids(tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte: multi-byte characters end up split across tokens."""
    encoder = {b: ch for ch, b in _byte_decoder().items()}
    return [tokenizer.convert_tokens_to_ids(encoder[b]) for b in text.encode("utf-8")]


def _stream(tokenizer, ids: list[int], stop: tuple[str, ...] = ()) -> tuple[list[str], IncrementalText]:
    text = IncrementalText(tokenizer, stop)
    deltas = []
    for token in ids:
        deltas.append(text.push(token))
        if text.stop_string is not None:
            return deltas, text
    deltas.append(text.finish())
    return deltas, text


def test_deltas_concatenate_to_the_decoded_text(tokenizer):
    ids = tokenizer.encode("def naïve(x):\n    return '☕' * x  # café", add_special_tokens=False)
    deltas, text = _stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text.text
    assert text.stop_string is None


def test_a_character_split_across_tokens_is_released_whole(tokenizer):
    ids = _byte_level_ids(tokenizer, "é☕")
    deltas, _ = _stream(tokenizer, ids)
    assert deltas[:2] == ["", "é"] and deltas[2:4] == ["", ""]
    assert "".join(deltas) == "é☕"
    strings = TokenStrings(tokenizer)
    assert b"".join(bytes(strings.bytes(i)) for i in ids) == "é☕".encode("utf-8")


def test_an_unfinished_character_at_the_end_is_released_on_finish(tokenizer):
    ids = _byte_level_ids(tokenizer, "a☕")[:-1]
    deltas, text = _stream(tokenizer, ids)
    assert deltas[-1].endswith("\ufffd") and "".join(deltas) == tokenizer.decode(ids)


def test_a_stop_string_cuts_the_text_before_it(tokenizer):
    ids = tokenizer.encode("alpha beta gamma delta", add_special_tokens=False)
    deltas, text = _stream(tokenizer, ids, stop=("zzz", "gamma"))
    assert text.stop_string == "gamma"
    assert "".join(deltas) == text.text == "alpha beta "
    with pytest.raises(RuntimeError, match="stop string"):
        text.push(ids[0])


def test_text_that_may_start_a_stop_string_is_held_back(tokenizer):
    text = IncrementalText(tokenizer, ("END",))
    ids = tokenizer.encode("hello E", add_special_tokens=False)
    released = "".join(text.push(t) for t in ids)
    assert released == "hello"  # " E" could be the start of "END": len("END") - 1 chars wait
    assert released + text.finish() == "hello E"


def test_special_tokens_are_not_text_but_are_named_in_logprobs(tokenizer):
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    deltas, text = _stream(tokenizer, [*tokenizer.encode("ok", add_special_tokens=False), end])
    assert "".join(deltas) == "ok"
    strings = TokenStrings(tokenizer)
    assert strings.string(end) == "<|im_end|>"
    assert bytes(strings.bytes(end)) == b"<|im_end|>"


def test_token_bytes_concatenate_to_the_utf8_text(tokenizer):
    sample = "naïve ☕ café <tool_call> done"
    ids = tokenizer.encode(sample, add_special_tokens=False)
    strings = TokenStrings(tokenizer)
    assert b"".join(bytes(strings.bytes(i)) for i in ids) == sample.encode("utf-8")
