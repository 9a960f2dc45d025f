"""bench.results (the results.json format and the regression check) and bench.report (README's table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report
from bench.results import FORMAT, Ratio, Recorder, load, regressions


def result(bench: str, **values: float) -> dict:
    return {"bench": bench, "ratios": [{"key": k, "label": k, "value": v, "better": "lower" if k.startswith("low")
                                        else "higher"} for k, v in values.items()]}


def test_ratio_is_the_median_of_its_rounds_and_judged_by_its_direction() -> None:
    assert Ratio("r", "r", [0.5, 0.9, 0.6], goal=0.7).value == 0.6
    assert Ratio("r", "r", [0.5, 0.9, 0.6], goal=0.7).meets is False
    assert Ratio("r", "r", [1.9, 2.5, 1.8], goal=2.0, better="lower").meets is True
    assert Ratio("r", "r", [1.0]).meets is None


def test_ratio_records_the_spread_of_its_rounds() -> None:
    assert Ratio("r", "r", [0.2, 0.5, 0.4, 0.3, 0.9]).iqr == pytest.approx(0.2)  # quartiles 0.3 and 0.5
    assert Ratio("r", "r", [0.7]).iqr == 0.0
    assert Ratio("r", "r", [0.2, 0.5, 0.4]).as_json()["iqr"] == pytest.approx(0.15)


def test_a_ratio_more_than_20_percent_worse_is_a_regression_either_direction() -> None:
    old = result("b", up=1.0, low=1.0)
    assert regressions(old, result("b", up=0.81, low=1.24)) == []
    found = regressions(old, result("b", up=0.79, low=1.26))
    assert len(found) == 2 and "up went from 1.00 to 0.79" in found[0] and "low went from 1.00 to 1.26" in found[1]
    assert regressions(old, result("b", other=0.1)) == []  # ratios on one side only are not compared


def test_recorder_writes_what_load_reads(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    Recorder("demo", "what it measures").write(ratios=[Ratio("x", "ours / theirs", [0.5, 0.7], goal=0.6)],
                                               summary="figures", peak_rss_mb={"ours": 12.5}, path=path)
    loaded = load(path)
    assert loaded is not None and loaded["format"] == FORMAT
    assert loaded["ratios"][0]["value"] == pytest.approx(0.6) and loaded["ratios"][0]["meets"] is True
    assert len(loaded["machine"]["load_average_start"]) == 3
    path.write_text(json.dumps({"speedup": 3.1}))  # a free-form file from before the format
    assert load(path) is None


def test_report_rewrites_only_the_table_between_the_markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "demo").mkdir()
    (tmp_path / "legacy").mkdir()
    Recorder("demo", "a demo bench").write(ratios=[Ratio("x", "ours / theirs", [0.5, 0.8, 0.7], goal=0.6)],
                                           summary="7 vs 10 things/s", path=tmp_path / "demo" / "results.json")
    Recorder("demo_soak", "a soak").write(ratios=[Ratio("g", "end / start", [1.05], goal=1.1, better="lower")],
                                          summary="flat", path=tmp_path / "demo" / "soak.json")
    (tmp_path / "legacy" / "results.json").write_text("{}")
    monkeypatch.setattr(report, "entry_points", lambda: {"demo": None, "legacy": None})
    monkeypatch.setattr(report, "results_path", lambda name: tmp_path / name / "results.json")
    readme = tmp_path / "README.md"
    old_legacy_row = "| `legacy` | kept | as | it | was |"
    readme.write_text(f"intro\n\n{report.BEGIN}\n| old | table |\n{old_legacy_row}\n{report.END}\n\noutro\n")

    assert report.main(["--readme", str(readme), "--check"]) == 1
    assert report.main(["--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n\n") and text.endswith(f"{report.END}\n\noutro\n")
    assert "| `demo` | a demo bench | **0.70x** ours / theirs, 0.50-0.80 over 3 | >= 0.60x: met | 7 vs 10 things/s |" in text
    assert "| `demo_soak` | a soak | **1.05x** end / start | <= 1.10x: met | flat |" in text  # a side file: its own row
    assert old_legacy_row in text and "| old | table |" not in text
    assert report.main(["--readme", str(readme), "--check"]) == 0


def test_report_without_markers_says_where_to_put_them(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("no table here\n")
    assert report.main(["--readme", str(readme)]) == 2
    assert report.BEGIN in capsys.readouterr().err


def test_a_paired_difference_is_rendered_signed_in_its_unit_and_not_checked_as_a_ratio() -> None:
    added = Ratio("p50_added", "p50, on - off per round", [0.12, -0.05, 0.4], goal=0.3, better="lower", unit="ms")
    row = added.as_json()
    assert row["value"] == pytest.approx(0.12) and row["meets"] is True and row["unit"] == "ms"
    assert report.ratio_cell(row) == "**+0.12 ms** p50, on - off per round, -0.05 to +0.40 over 3"
    assert report.goal_cell(row) == "<= +0.30 ms: met"
    older = {"bench": "b", "ratios": [{**row, "value": 0.01}]}
    assert regressions(older, {"bench": "b", "ratios": [row]}) == []  # 12x "worse" near zero says nothing
    assert report.ratio_cell({**row, "unit": "x", "value": 1.5, "runs": [1.5]}) == "**1.50x** p50, on - off per round"
