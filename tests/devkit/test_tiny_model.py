"""The tiny default model builder: deterministic, idempotent, a working chat template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from schemas.tokenizer_identity import chat_template_hash, tokenizer_identity
from devkit.tiny_model import MARKER_FILE, build_tiny_model, default_model_dir

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tokenizer(built: Path):
    return AutoTokenizer.from_pretrained(built)


def test_default_dir_follows_trajlake_home(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAJLAKE_HOME", str(tmp_path))
    assert default_model_dir() == tmp_path / "tiny-model"
    monkeypatch.delenv("TRAJLAKE_HOME")
    assert default_model_dir() == Path.home() / ".cache" / "trajlake" / "tiny-model"


def test_builds_a_small_llama_with_the_requested_vocab(built: Path, tokenizer):
    config = AutoConfig.from_pretrained(built)
    assert config.model_type == "llama"
    assert config.vocab_size == len(tokenizer) == 2048
    assert config.num_hidden_layers == 2
    marker = json.loads((built / MARKER_FILE).read_text())
    assert marker["seed"] == 0 and marker["vocab_size"] == 2048


def test_same_parameters_reuse_the_folder(built: Path):
    weights = built / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build_tiny_model(built) == built
    assert weights.stat().st_mtime_ns == before


def test_a_damaged_folder_is_rebuilt_bit_identical_and_another_seed_differs(built: Path, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    (copy / MARKER_FILE).write_text("{not json")
    (copy / "model.safetensors").write_bytes(b"garbage")
    assert build_tiny_model(copy) == copy  # same seed, fresh build: the very same bytes
    assert (copy / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()
    assert (copy / "tokenizer.json").read_bytes() == (built / "tokenizer.json").read_bytes()
    reseeded = build_tiny_model(copy, seed=1)  # other parameters: rebuilt in place
    assert json.loads((reseeded / MARKER_FILE).read_text())["seed"] == 1
    assert (reseeded / "model.safetensors").read_bytes() != (built / "model.safetensors").read_bytes()
    assert tokenizer_identity(reseeded) == tokenizer_identity(built)  # the seed only touches weights
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".copy-")]  # no staging left behind


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"vocab_size": 100}, ValueError, "vocab_size=100 is too small"),
        ({"vocab_size": "2048"}, TypeError, "vocab_size must be an int"),
        ({"layers": 0}, ValueError, "layers=0 must be positive"),
        ({"seed": -1}, ValueError, "seed=-1 must be >= 0"),
        ({"seed": 1.5}, TypeError, "seed must be an int"),
        ({"hidden": True}, TypeError, "hidden must be an int"),
        ({"hidden": 250, "heads": 4}, ValueError, "multiple of heads"),
    ],
)
def test_bad_parameters_are_refused_before_any_work(tmp_path, options, error, match):
    with pytest.raises(error, match=match):
        build_tiny_model(tmp_path / "m", **options)
    assert not (tmp_path / "m").exists()


def test_a_folder_it_did_not_make_is_never_replaced(tmp_path):
    (tmp_path / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="not a tiny-model folder"):
        build_tiny_model(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "precious"


def test_chat_template_renders_tools_and_tool_turns(tokenizer):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"id": "c2", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "rain"}]},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")


def test_chat_template_without_tools_uses_the_given_system_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_prompt_ids_round_trip_and_markers_are_single_tokens(tokenizer):
    messages = [{"role": "user", "content": "naïve café ☕ <tool_call>"}]
    ids = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(ids) == text
    for marker in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        assert len(tokenizer.encode(marker)) == 1
    call = tokenizer.encode('<tool_call>\n{"name": "f"}\n</tool_call>')
    assert tokenizer.decode(call, skip_special_tokens=True) == '<tool_call>\n{"name": "f"}\n</tool_call>'
    assert tokenizer.decode(tokenizer.encode("<|im_end|>"), skip_special_tokens=True) == ""


def test_saved_tokenizer_round_trips_with_the_same_identity(built: Path, tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "copy")
    again = AutoTokenizer.from_pretrained(tmp_path / "copy")
    assert tokenizer_identity(again) == tokenizer_identity(tokenizer) == tokenizer_identity(built)
    assert chat_template_hash(again.chat_template) == chat_template_hash(tokenizer.chat_template)
    assert again.eos_token == "<|im_end|>"
