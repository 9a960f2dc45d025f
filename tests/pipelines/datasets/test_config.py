"""Build config validation: wrong types, missing parts, oversized and malformed values."""

from __future__ import annotations

from datetime import datetime

import pytest
from pydantic import ValidationError

from pipelines.datasets.config import BuildConfig, RewardRule, Selection
from pipelines.datasets.registry import check_name, parse_ref


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("latest", RewardRule(kind="latest")),
        ("latest:pass", RewardRule(kind="latest", name="pass")),
        ("sum", RewardRule(kind="sum")),
        ("mean", RewardRule(kind="mean")),
        ("weighted:pass=1,style=0.25", RewardRule(kind="weighted", weights={"pass": 1.0, "style": 0.25})),
    ],
)
def test_reward_rules_parse(text, expected):
    assert RewardRule.parse(text) == expected
    assert RewardRule.parse(expected.describe()) == expected


@pytest.mark.parametrize("text", ["", "best", "sum:x", "weighted:", "weighted:a", "weighted:a=x", "weighted:=1",
                                  "weighted:a=1,b"])
def test_malformed_reward_rules_are_refused(text):
    with pytest.raises(ValueError, match="reward"):
        RewardRule.parse(text)


def test_selection_refuses_naive_times_strings_for_lists_and_unknown_fields():
    with pytest.raises(ValidationError, match="UTC offset"):
        Selection(since=datetime(2026, 1, 1))
    with pytest.raises(ValidationError):
        Selection(tasks="abc")
    with pytest.raises(ValidationError):
        Selection(statuses=("done",))
    with pytest.raises(ValidationError):
        Selection(task="t1")


@pytest.mark.parametrize("where", ["1=1; DROP TABLE x", "status = 'x' -- c", "x" * 2001])
def test_where_must_be_one_bounded_predicate(where):
    with pytest.raises(ValidationError):
        Selection(where=where)


def test_build_config_refuses_wrong_types():
    with pytest.raises(ValidationError):
        BuildConfig(advantage="ppo")
    with pytest.raises(ValidationError):
        BuildConfig(batch_tokens=0)
    with pytest.raises(ValidationError):
        BuildConfig(group_by="tenant")
    with pytest.raises(ValidationError):
        BuildConfig(std_epsilon="small")


def test_identity_excludes_only_chunking():
    a, b = BuildConfig(batch_tokens=10), BuildConfig(batch_tokens=20)
    assert a.identity() == b.identity()
    assert a.identity() != BuildConfig(advantage="mean").identity()


@pytest.mark.parametrize("name", ["", "a/b", "../x", "x" * 129, "-lead", "sp ace"])
def test_bad_dataset_names(name):
    with pytest.raises(ValueError, match="dataset name"):
        check_name(name)


def test_dataset_refs():
    assert parse_ref("nightly") == ("nightly", None)
    assert parse_ref("nightly@12") == ("nightly", 12)
    with pytest.raises(ValueError):
        parse_ref("nightly@x")
