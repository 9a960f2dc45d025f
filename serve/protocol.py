"""Requests the reference upstream accepts, and its OpenAI-style errors.

Types are strict (a string is not a number). Parameters this server cannot
honour (``n > 1``, penalties, ``logit_bias``, ``echo``, ``best_of``, JSON
response formats, forced tool choice) are refused with a 400 that names the
parameter; unknown extra fields are ignored, as vLLM does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20


class ServeError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None,
        code: str | None = None, kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str | dict[str, Any]


class ToolCallIn(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionSpec(_Strict):
    name: Annotated[str, Field(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Options shared by chat and completions."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    seed: int | None = None
    stop: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_STOP_STRINGS)] | None = None
    """vLLM extra: token ids that end the generation (kept in the output ids, like EOS)."""
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def refuse_unsupported(self) -> None:
        """Raise a 400 naming the first parameter this server cannot honour."""
        if self.n != 1:
            raise ServeError(400, "only n=1 is supported; send one request per sample", param="n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise ServeError(400, f"{name} is not supported by this server; leave it at 0", param=name)
        if self.logit_bias:
            raise ServeError(400, "logit_bias is not supported by this server", param="logit_bias")
        if self.stream_options is not None and not self.stream:
            raise ServeError(400, "stream_options is only allowed with stream=true", param="stream_options")


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    response_format: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tool_choice not in (None, "auto", "none"):
            raise ServeError(400, "tool_choice must be 'auto' or 'none' here", param="tool_choice")
        if self.top_logprobs and not self.logprobs:
            raise ServeError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        if self.response_format not in (None, {"type": "text"}):
            raise ServeError(400, "only response_format {'type': 'text'} is supported", param="response_format")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def parses_tool_calls(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    add_special_tokens: bool = True
    """As vLLM: a text prompt gets the tokenizer's special tokens (e.g. BOS)."""
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise ServeError(400, "echo is not supported by this server", param="echo")
        if self.best_of not in (None, 1):
            raise ServeError(400, "only best_of=1 is supported", param="best_of")
        if self.suffix:
            raise ServeError(400, "suffix is not supported by this server", param="suffix")

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def single_prompt(self) -> str | list[int]:
        """The one prompt (text or token ids); a batch of several is refused."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ServeError(400, "send one prompt per request (batches are not supported)", param="prompt")
            prompt = prompt[0]
        if len(prompt) == 0:
            raise ServeError(400, "prompt is empty", param="prompt")
        return prompt


def parse_request(raw: bytes, model: type[_Sampling]) -> tuple[Any, dict]:
    """Parse and validate a JSON body; return (validated request, the raw JSON object)."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ServeError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise ServeError(400, "request body must be a JSON object", code="invalid_json")
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        param, message = _describe(exc)
        raise ServeError(400, message, param=param) from exc
    request.refuse_unsupported()
    return request, body


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part)


def _describe(exc: ValidationError) -> tuple[str | None, str]:
    """(dotted parameter, message) of the first problem; union branches are summarised."""
    errors = exc.errors()
    loc = errors[0]["loc"]
    depth = next((i for i, part in enumerate(loc) if _is_union_tag(part)), len(loc))
    param = ".".join(str(part) for part in loc[:depth]) or None
    if depth == len(loc):
        return param, f"{param}: {errors[0]['msg']}" if param else errors[0]["msg"]
    branches = [e["loc"][depth] for e in errors if e["loc"][:depth] == loc[:depth] and len(e["loc"]) > depth]
    return param, f"{param}: expected one of {', '.join(dict.fromkeys(map(str, branches)))}"
