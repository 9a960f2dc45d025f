"""Tokenizer identity and chat-template hash: stable, content-based, strict about input."""

from __future__ import annotations

import json
import re

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from schemas.tokenizer_identity import chat_template_hash, tokenizer_identity


def _tokenizer(vocab: dict[str, int]) -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


VOCAB = {"a": 0, "b": 1, "ab": 2}


def test_identity_names_kind_and_size_then_a_digest():
    assert re.fullmatch(r"bpe-3@[0-9a-f]{12}", tokenizer_identity(_tokenizer(VOCAB)))


def test_identity_is_the_same_for_object_text_bytes_file_and_folder(tmp_path):
    tok = _tokenizer(VOCAB)
    tok.save(str(tmp_path / "tokenizer.json"))
    expected = tokenizer_identity(tok)
    assert tokenizer_identity(tok.to_str()) == expected
    assert tokenizer_identity(tok.to_str().encode()) == expected
    assert tokenizer_identity(tmp_path / "tokenizer.json") == expected
    assert tokenizer_identity(str(tmp_path)) == expected


def test_identity_ignores_runtime_settings_and_key_order():
    tok = _tokenizer(VOCAB)
    spec = json.loads(tok.to_str())
    spec["truncation"] = {"max_length": 8, "strategy": "LongestFirst", "stride": 0, "direction": "Right"}
    reordered = json.dumps(dict(reversed(list(spec.items()))))
    assert tokenizer_identity(reordered) == tokenizer_identity(tok)


def test_identity_changes_with_vocab_added_tokens_or_pre_tokenizer():
    base = tokenizer_identity(_tokenizer(VOCAB))
    assert tokenizer_identity(_tokenizer({"a": 0, "b": 2, "ab": 1})) != base
    with_added = _tokenizer(VOCAB)
    with_added.add_special_tokens(["<|im_end|>"])
    assert tokenizer_identity(with_added).startswith("bpe-4@")
    assert tokenizer_identity(with_added) != base
    prefixed = _tokenizer(VOCAB)
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    assert tokenizer_identity(prefixed) != base


@pytest.mark.parametrize(
    ("source", "error", "match"),
    [
        (42, TypeError, "cannot identify a int"),
        (None, TypeError, "cannot identify a NoneType"),
        ("{not json", ValueError, "not valid JSON"),
        (b"[1, 2]", ValueError, "no 'model' object"),
        ('{"model": "BPE"}', ValueError, "no 'model' object"),
        (b"\xff\xfe", ValueError, "not UTF-8"),
    ],
)
def test_identity_rejects_what_is_not_a_tokenizer(source, error, match):
    with pytest.raises(error, match=match):
        tokenizer_identity(source)


def test_identity_of_a_folder_without_tokenizer_json_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        tokenizer_identity(tmp_path)


def test_chat_template_hash_is_stable_and_exact():
    template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert chat_template_hash(template) == chat_template_hash(str(template))
    assert re.fullmatch(r"[0-9a-f]{12}", chat_template_hash(template))
    assert chat_template_hash(template + " ") != chat_template_hash(template)
    assert chat_template_hash("{{ messages }}") == "f24189f08c85"  # sha256 of the UTF-8 text, pinned


@pytest.mark.parametrize("bad", [None, b"{{ x }}", 3, {"default": "{{ x }}"}])
def test_chat_template_hash_rejects_non_strings(bad):
    with pytest.raises(TypeError, match="must be a str"):
        chat_template_hash(bad)
