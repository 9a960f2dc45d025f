"""Prefix references for producers: send a prompt as "the ids of an earlier call + these new ids".

A producer that knows the rollout's previous call (its call_id, prompt ids and
sampled response ids) compares them with the next prompt, id by id, and
sends only what follows the shared prefix (``schemas/EVENTS.md``, prefix
references). Nothing is assumed: the shared length is measured, so a prompt
that diverges inside the previous answer (re-tokenized history, a template
that rewrites earlier turns) still references the part that matches, and one
that shares nothing goes out whole. The gateway (token sessions) and the SDK
(``prefix_references=True``) both use this.

>>> shared_prefix([1, 2, 3, 4, 9], PreviousCall("c1", [1, 2], [3, 4]))
Reference(extends_call_id='c1', extends_tokens=4, new_ids=[9])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PreviousCall:
    """What the next call of a rollout may extend: the call and its ids as they were recorded."""

    call_id: str
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]


@dataclass(frozen=True)
class Reference:
    """The payload fields of a prefix reference."""

    extends_call_id: str
    extends_tokens: int
    new_ids: list[int]


def shared_prefix(prompt_ids: Sequence[int], previous: PreviousCall) -> Reference | None:
    """The reference for ``prompt_ids`` against ``previous``; None when they share no leading id."""
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    before = np.concatenate([np.asarray(previous.prompt_ids, dtype=np.int64),
                             np.asarray(previous.response_ids, dtype=np.int64)])
    n = min(len(prompt), len(before))
    differ = np.flatnonzero(prompt[:n] != before[:n])
    shared = int(differ[0]) if len(differ) else n
    if shared == 0:
        return None
    return Reference(previous.call_id, shared, prompt[shared:].tolist())
