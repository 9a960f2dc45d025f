"""A shape's rendered tail with the new messages' text left as slots: filled per call instead of rendered.

Once a shape's window has been checked (``stitch``), what follows the answer
(the bridge, the new turns, the generation prompt) is rendered once more with
each text field of the new messages replaced by a sentinel. When every
sentinel comes out verbatim (the template neither escapes, trims nor splits
that text: the sentinels hold quotes, a backslash, ``<&>`` and edge
whitespace) and filling the real text back in gives exactly what the template
rendered for the call, the shape keeps the text between the sentinels, and
the shape's next calls join it with their new messages' text: no Jinja render
on the hot path (two window renders were ~0.6 of the planner's 0.96 ms per call,
bench/session_latency).

The assumption: a template treats a new message's text as opaque (outputs it,
or not), and looks into it only through the string literals of its source
(``'</think>' in content``, ``content.startswith('<tool_response>')``, a
method's or a filter's argument). A text that holds one of those literals
takes the render path, so does any text a template could branch on that the
sentinels cannot stand for (a list of parts rather than a string). A template
that measures, slices or reads the characters of a text (``|length``, ``[:n]``,
``|truncate``, ``.isdigit()``, ``|upper``) gets no skeleton at all. Shapes are
shared by rollouts, so a skeleton is kept only when its tail renders the same
with the earlier window messages' text masked (it neither shows nor branches on
it), and a call whose earlier window messages hold a tested literal renders. A
new message must match the skeleton's keys exactly (``""`` is not absent).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from jinja2 import Environment, TemplateSyntaxError, nodes
from jinja2.ext import loopcontrols

log = logging.getLogger(__name__)

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use code points: no template writes them
_JOIN = "\x00"
"""Joins the texts ``Literals.guard_any`` searches at once."""
_EDGE = " \t\n'\"\\<&>"
"""Around each sentinel: what an escaping (``tojson``, ``escape``) or trimming template would change."""
_SENTINEL = re.compile(re.escape(_EDGE + _OPEN) + r"(\d+)" + re.escape(_CLOSE + _EDGE[::-1]))
_UNGUARDED_FILTERS = frozenset({"join", "default", "d", "tojson", "indent", "format"})
"""Filters whose string arguments join or format output rather than test a text."""
_MEASURING_FILTERS = frozenset({"length", "count", "wordcount", "truncate", "wordwrap", "center", "batch", "slice",
                                "first", "last", "list", "reverse", "sort", "unique", "max", "min", "upper", "lower",
                                "title", "capitalize", "int", "float"})
"""Filters whose output depends on a text's length or characters, not only on the text as a whole."""
_CHARACTER_METHODS = frozenset({"upper", "lower", "title", "capitalize", "swapcase", "casefold", "isdigit", "isnumeric",
                                "isdecimal", "isalpha", "isalnum", "isspace", "isupper", "islower", "istitle",
                                "isascii", "isidentifier", "isprintable", "zfill", "expandtabs", "splitlines"})
"""String methods that read a text's characters without a literal to guard (``content.isdigit()``)."""
_LISTS = frozenset({"messages", "tools"})
"""The template's own lists: measuring or slicing them (``messages|length``, ``messages[::-1]``) is fine."""
_OPAQUE_FIELDS = frozenset({"role", "type"})
"""Fields never slotted: a literal compared with them (``message.role == 'user'``) does not guard the text."""

Slot = tuple[int, str]
"""(index among the new messages, field name)."""


def _sentinel(n: int) -> str:
    return f"{_EDGE}{_OPEN}{n}{_CLOSE}{_EDGE[::-1]}"


@dataclass(frozen=True, slots=True)
class Skeleton:
    """The tail of one shape: ``parts[0] + text(slots[0]) + parts[1] + ... + parts[-1]``."""

    parts: tuple[str, ...]
    slots: tuple[Slot, ...]
    signatures: tuple[tuple[tuple[str, str], ...], ...]
    """Each new message's keys in order, each with what it holds (``signature``): a call whose new messages
    differ in any key, even one holding ``""`` instead of being absent (``is defined`` tells them apart), renders."""


class Literals:
    """The string literals a chat template tests text against; a text holding one is rendered, never filled."""

    def __init__(self, template: str | None) -> None:
        self.usable = False
        self._pattern: re.Pattern[str] | None = None
        if not isinstance(template, str):
            return  # several named templates: which one renders depends on the call
        try:
            ast = Environment(extensions=[loopcontrols]).parse(template)
        except TemplateSyntaxError as exc:  # a tag of the engine's own environment: no slots, the render path
            log.debug("event=session_skeleton_unparsed error=%r", exc)
            return
        if _measures_text(ast):
            return  # a text's length or a slice of it decides what comes out: the sentinels cannot stand for it
        needles = sorted(_needles(ast), key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, needles))) if needles else None
        self._joinable = not any(_JOIN in needle for needle in needles)
        """No literal holds the joining character: a match in texts joined by it lies within one text."""
        self.usable = True

    def guard(self, text: str) -> bool:
        """True when the template could look into ``text`` (it holds a tested literal)."""
        return self._pattern is not None and self._pattern.search(text) is not None

    def guard_any(self, values: list[Any]) -> bool:
        """True when a string anywhere inside ``values`` (messages, their tool calls and arguments) holds a tested
        literal: the strings are gathered without recursion and searched once, joined."""
        if self._pattern is None:
            return False
        texts: list[str] = []
        stack = list(values)
        while stack:
            value = stack.pop()
            if isinstance(value, str):
                texts.append(value)
            elif isinstance(value, dict):
                stack.extend(value.values())
            elif isinstance(value, (list, tuple)):
                stack.extend(value)
        if self._joinable:
            return self._pattern.search(_JOIN.join(texts)) is not None
        return any(self._pattern.search(text) is not None for text in texts)


def _needles(ast: nodes.Template) -> set[str]:
    found: set[str] = set()
    for compare in ast.find_all(nodes.Compare):
        operands = [compare.expr, *(op.expr for op in compare.ops)]
        if any(_names_field(x) in _OPAQUE_FIELDS for x in operands):
            continue  # message.role == 'user', part.type == 'text'
        found.update(_strings(compare))
    for call in ast.find_all((nodes.Call, nodes.Filter, nodes.Test)):
        if isinstance(call, nodes.Filter) and call.name in _UNGUARDED_FILTERS:
            continue
        for arg in [*call.args, *(kw.value for kw in call.kwargs)]:
            found.update(_strings(arg))
    for assign in ast.find_all(nodes.Assign):  # {% set needle = '</think>' %} ... needle in content
        found.update(_strings(assign.node))
    return {s for s in found if s}


def _measures_text(ast: nodes.Template) -> bool:
    """True when the template measures, slices or reads the characters of anything but the message and tool lists
    (``content|length > 1000``, ``content[:200]``, ``content|truncate(50)``, ``content.isdigit()``): a sentinel's
    length and characters are not the text's, so a filled skeleton could differ from a render for a text other
    than the one of the call that built it."""
    for node in ast.find_all(nodes.Filter):
        if node.name in _MEASURING_FILTERS and not _is_list(node.node):
            return True
    for node in ast.find_all(nodes.Getitem):
        if isinstance(node.arg, nodes.Slice) and not _is_list(node.node):
            return True
    for node in ast.find_all(nodes.Call):
        if isinstance(node.node, nodes.Getattr) and node.node.attr in _CHARACTER_METHODS:
            return True
    return False


def _is_list(node: nodes.Node | None) -> bool:
    return isinstance(node, nodes.Name) and node.name in _LISTS


def _names_field(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.Getattr):
        return node.attr
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return str(node.arg.value)
    return None


def _strings(node: nodes.Node) -> set[str]:
    consts = [node] if isinstance(node, nodes.Const) else list(node.find_all(nodes.Const))
    return {c.value for c in consts if isinstance(c.value, str)}


def signature(message: dict[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """A new message's keys in order, each with ``"text"`` (a non-empty string other than the role: a slot) or the
    repr of what it holds (the role's value, ``None``, ``""``, ``[]``); None when a value is anything else (tool
    calls, parts, objects: the template may read into them)."""
    out = []
    for name, value in message.items():
        if name in _OPAQUE_FIELDS or value in (None, "", []):
            out.append((name, repr(value)))
        elif isinstance(value, str):
            out.append((name, "text"))
        else:
            return None
    return tuple(out)


def _slots(sig: tuple[tuple[str, str], ...]) -> list[str]:
    return [name for name, held in sig if held == "text"]


def with_sentinels(new: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], tuple] | None:
    """The new messages with each text field replaced by a numbered sentinel, and their signatures."""
    out, signatures, n = [], [], 0
    for message in new:
        sig = signature(message)
        if sig is None:
            return None
        copy = dict(message)
        for name in _slots(sig):
            copy[name] = _sentinel(n)
            n += 1
        out.append(copy)
        signatures.append(sig)
    return out, tuple(signatures)


def masked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every non-empty string field but the role (top level) replaced by a marker: a tail that
    renders the same with and without them does not depend on those messages' text."""
    return [{name: f"{_CLOSE}masked {n}.{name}{_OPEN}" if name not in _OPAQUE_FIELDS and isinstance(value, str)
             and value else value for name, value in message.items()} for n, message in enumerate(messages)]


def build(rendered: str, signatures: tuple) -> Skeleton | None:
    """The skeleton of a tail rendered with sentinels; None when a sentinel did not come out verbatim."""
    numbered = [(i, name) for i, sig in enumerate(signatures) for name in _slots(sig)]
    matches = list(_SENTINEL.finditer(rendered))
    if len(matches) != rendered.count(_OPEN) or rendered.count(_OPEN) != rendered.count(_CLOSE):
        return None  # a sentinel was cut, escaped or rewritten
    parts, slots, at = [], [], 0
    for match in matches:
        n = int(match.group(1))
        if n >= len(numbered):
            return None
        parts.append(rendered[at: match.start()])
        slots.append(numbered[n])
        at = match.end()
    parts.append(rendered[at:])
    return Skeleton(tuple(parts), tuple(slots), signatures)


def fill(skeleton: Skeleton, new: list[dict[str, Any]], literals: Literals, *,
         before: list[dict[str, Any]]) -> str | None:
    """The tail of a call of the skeleton's shape; None when its text must be rendered. ``before``: the window's
    messages up to the answer; a text of theirs holding a tested literal renders too (``'x' in messages[0].content``
    may choose how the new turns look)."""
    if len(new) != len(skeleton.signatures):
        return None
    for message, sig in zip(new, skeleton.signatures, strict=True):
        if signature(message) != sig:
            return None
        if any(literals.guard(message[name]) for name in _slots(sig)):
            return None
    if literals.guard_any(before):
        return None
    out = [skeleton.parts[0]]
    for (i, name), part in zip(skeleton.slots, skeleton.parts[1:], strict=True):
        out.append(new[i][name])
        out.append(part)
    return "".join(out)
