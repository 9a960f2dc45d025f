"""Hermes tool-call parsing, whole and streamed."""

from __future__ import annotations

import json
import random

import pytest

from schemas.tool_parsers import HermesStream, parse_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _functions(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_one_call_and_no_content():
    content, calls = parse_tool_calls(CALL)
    assert content == ""
    assert _functions(calls) == [("get_weather", {"city": "Paris"})]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")


def test_content_outside_the_tags_stays_content():
    text = "Let me check." + CALL + " and " + CALL.replace("Paris", "Rome") + " done"
    content, calls = parse_tool_calls(text)
    assert content == "Let me check. and  done"
    assert _functions(calls) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert calls[0]["id"] != calls[1]["id"]


def test_an_unclosed_last_block_counts():
    content, calls = parse_tool_calls('ok <tool_call>{"name": "f", "arguments": {}}')
    assert (content, _functions(calls)) == ("ok ", [("f", {})])


def test_arguments_as_a_string_are_kept_and_parameters_is_an_alias():
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"a": 1}'
    _, calls = parse_tool_calls('<tool_call>{"name": "g", "parameters": {"b": "é"}}</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"b": "é"}'


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json}</tool_call>",
        "<tool_call>[1, 2]</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": 3}</tool_call>',
        '<tool_call>{"name": ""}</tool_call>',
        CALL + '<tool_call>{"name": "f", "arguments": {</tool_call>',
    ],
)
def test_any_malformed_block_leaves_everything_as_content(text):
    assert parse_tool_calls(text) == (text, [])


def test_text_without_tags_is_all_content():
    assert parse_tool_calls("just <tool words") == ("just <tool words", [])


@pytest.mark.parametrize(
    "text",
    [
        CALL,
        "before " + CALL + " after",
        "no call at all <tool_ but almost",
        "<tool_call>{broken</tool_call> tail",
        'x <tool_call>{"name": "f"}',
        "ends with a partial tag <tool_ca",
        "  \n leading and trailing space \n " + CALL + "\n",
        "  <tool_call>{broken</tool_call> \n",
        CALL + "\n" + CALL + "\n",
        " \n ",
    ],
)
def test_streamed_content_equals_the_whole_text_parse(text):
    expected_content, expected_calls = parse_tool_calls(text)
    for seed in range(5):
        rng = random.Random(seed)
        stream, streamed, i = HermesStream(), "", 0
        while i < len(text):
            step = rng.randint(1, 4)
            streamed += stream.push(text[i : i + step])
            i += step
        rest, calls = stream.finish()
        assert streamed + rest == expected_content.strip()
        assert _functions(calls) == _functions(expected_calls)


def test_stream_holds_back_whitespace_and_a_possible_tag_and_stops_at_a_real_one():
    stream = HermesStream()
    assert stream.push("\n hi") == "hi"
    assert stream.push(" <tool") == ""
    assert stream.push("box") == " <toolbox"
    assert stream.push(" \n<tool_call>{") == ""
    assert stream.push('"name": "f"}</tool_call> more ') == ""
    rest, calls = stream.finish()
    assert rest == " \n more" and _functions(calls) == [("f", {})]
