"""Tables as markdown and CSV from one definition: the one table writer of the lab.

A :class:`Table` is a list of :class:`Column` s and rows given as mappings from column key to value.
:meth:`Table.markdown` formats each value with its column's format (``None`` shows as an en dash,
NaN as ``nan``); :meth:`Table.write_csv` writes the unformatted values (``None`` as an empty cell;
a column's ``csv`` function for values such as a tuple),
so the CSV keeps full precision and the markdown stays readable. The lab (norm study, analyses,
benchmark) writes every report table with it.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

MISSING = "–"

Formatter = Callable[[Any], str]


def format_value(value: Any, fmt: str | Formatter = "{}") -> str:
    """One markdown cell: ``None`` -> ``"–"``; a function ``fmt`` gets any other value; else a
    string as it is, NaN as ``"nan"``, anything else through the ``str.format`` pattern ``fmt``
    (such as ``"{:.2f}"``)."""
    if value is None:
        return MISSING
    if callable(fmt):
        return fmt(value)
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return fmt.format(value)


def markdown_row(cells: Sequence[str]) -> str:
    """``| a | b |``; a ``|`` inside a cell is escaped so it cannot split the row."""
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"


@dataclass(frozen=True)
class Column:
    """``key``: the CSV header and the row key; ``header``: the markdown header (default ``key``);
    ``fmt``: how :func:`format_value` shows a value in markdown; ``align_right``: right-align the
    column in markdown (``---:``), as for numbers; ``csv``: a function that turns a value into its
    CSV cell, for a value that is no plain number or string (default: the value as it is)."""

    key: str
    header: str = ""
    fmt: str | Formatter = "{}"
    align_right: bool = False
    csv: Formatter | None = None

    def csv_value(self, value: Any) -> Any:
        """The CSV cell of ``value``: empty for ``None``, else through ``csv`` when given."""
        if value is None:
            return ""
        return self.csv(value) if self.csv is not None else value

    @property
    def title(self) -> str:
        return self.header or self.key

    @property
    def rule(self) -> str:
        """The column's cell of the markdown line below the header."""
        return "---:" if self.align_right else "---"


@dataclass
class Table:
    """Columns plus rows (mappings from column key to value; a missing key is ``None``)."""

    columns: Sequence[Column]
    rows: list[Mapping[str, Any]] = field(default_factory=list)

    def add(self, row: Mapping[str, Any]) -> None:
        unknown = set(row) - {column.key for column in self.columns}
        if unknown:
            raise KeyError(f"Row has keys no column names: {sorted(unknown)}")
        self.rows.append(dict(row))

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.add(row)

    def markdown(self) -> str:
        """A GitHub-flavoured markdown table, without a trailing newline."""
        lines = [markdown_row([c.title for c in self.columns]), markdown_row([c.rule for c in self.columns])]
        for row in self.rows:
            lines.append(markdown_row([format_value(row.get(c.key), c.fmt) for c in self.columns]))
        return "\n".join(lines)

    def write_csv(self, path: str | Path) -> Path:
        """The unformatted values (through a column's ``csv`` where it has one), one line per row,
        headed by the column keys."""
        path = Path(path)
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow([c.key for c in self.columns])
            for row in self.rows:
                writer.writerow([c.csv_value(row.get(c.key)) for c in self.columns])
        return path
