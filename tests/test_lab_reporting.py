"""gwdet_lab.reporting: one table definition gives markdown and CSV; durations."""
import csv
import math

import pytest

from gwdet_lab.reporting import Column, Table, format_duration, format_value


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


def test_a_row_with_an_unknown_key_is_refused():
    with pytest.raises(KeyError, match="typo"):
        Table([Column("run")]).add({"run": "a", "typo": 1})


def test_format_duration_and_value():
    assert [format_duration(s) for s in (7, 65, 3725, 59.6)] == ["7s", "1m05s", "1h02m05s", "1m00s"]
    assert format_duration(None) == format_duration(math.inf) == format_duration(math.nan) == "?"
    assert format_value(None) == "–" and format_value("x", "{:.2f}") == "x"
    assert format_value(0.25, "{:g}") == "0.25" and format_value(3, lambda v: f"<{v}>") == "<3>"
    assert format_value("cmd", lambda v: f"`{v}`") == "`cmd`"
