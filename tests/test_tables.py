"""gwdet_lab.tables: one table definition gives markdown and CSV, for results.md and every lab report."""
import csv
import math

import pytest

from gwdet_lab.tables import Column, Table, format_value
from gwdet_lab.reporting import format_duration


def test_markdown_formats_and_csv_keeps_full_precision(tmp_path):
    table = Table([Column("run"), Column("ap", "box AP", "{:.2f}"), Column("time", "wall", format_duration)])
    table.add({"run": "gn|x", "ap": 41.23456, "time": 3725})
    table.add({"run": "bn", "ap": math.nan})
    assert table.markdown().splitlines() == [
        "| run | box AP | wall |",
        "| --- | --- | --- |",
        "| gn\\|x | 41.23 | 1h02m05s |",
        "| bn | nan | – |",
    ]
    with open(table.write_csv(tmp_path / "t.csv")) as f:
        rows = list(csv.reader(f))
    assert rows == [["run", "ap", "time"], ["gn|x", "41.23456", "3725"], ["bn", "nan", ""]]


def test_right_aligned_columns_mark_only_their_own_rule_cell():
    table = Table([Column("shape"), Column("ms", fmt="{:.1f}", align_right=True), Column("met")])
    table.add({"shape": "(2, 8)", "ms": 1.25, "met": "yes"})
    assert table.markdown().splitlines()[1] == "| --- | ---: | --- |"


def test_a_row_with_an_unknown_key_is_refused():
    with pytest.raises(KeyError, match="typo"):
        Table([Column("run")]).add({"run": "a", "typo": 1})


def test_format_value():
    assert format_value(None) == "–" and format_value("x", "{:.2f}") == "x"
    assert format_value(0.25, "{:g}") == "0.25" and format_value(3, lambda v: f"<{v}>") == "<3>"
    assert format_value("cmd", lambda v: f"`{v}`") == "`cmd`"


def test_a_column_of_labelled_values_has_its_own_csv_cell(tmp_path):
    # a per-seed column could only hold one string for both files, so its markdown could not name the seeds
    pairs = ((0, 24.49), (2, 25.41))
    table = Table([Column("per_seed", "per seed", lambda v: ", ".join(f"s{s}: {a}" for s, a in v),
                          csv=lambda v: ", ".join(str(a) for _, a in v))])
    table.add({"per_seed": pairs})
    table.add({})
    assert table.markdown().splitlines()[2:] == ["| s0: 24.49, s2: 25.41 |", "| – |"]
    with open(table.write_csv(tmp_path / "t.csv"), newline="") as f:
        assert list(csv.reader(f)) == [["per_seed"], ["24.49, 25.41"], [""]]
