"""Hermes-style tool calls in generated text -> OpenAI ``tool_calls``: the parser the gateway's token sessions use.

One implementation for both (``schemas.tool_parsers``): what serve-model
answers on its chat route and what the gateway parses from a stitched call's
raw completion cannot drift apart.
"""

from schemas.tool_parsers import HermesStream as ToolCallStream
from schemas.tool_parsers import parse_tool_calls

__all__ = ["ToolCallStream", "parse_tool_calls"]
