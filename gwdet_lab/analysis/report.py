"""Markdown tables and the output folder of an analysis (``<out>/<subcommand>/``)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from gwdet.errors import listed
from gwdet_lab.tables import Column, Table

TABLE_FILE = "table.md"
# The first line of every table.md this tool writes: a folder whose table.md lacks it is not replaced.
TABLE_MARK = "<!-- written by tools/analyze.py: running the subcommand again replaces this table and its figures -->"


def percent_label(fraction: float) -> str:
    """How a fraction of the spectrum is named in tables and file names: ``0.9`` as ``90%``."""
    return f"{round(100 * fraction)}%"


def format_number(value: float | int | str, digits: int = 4) -> str:
    """Integers as they are, floats with ``digits`` significant digits, inf/nan spelled out."""
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}g}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[float | int | str]]) -> str:
    """A GitHub-flavoured markdown table (without a trailing newline) of positional rows, numbers
    shown by :func:`format_number`: :class:`gwdet_lab.tables.Table` with one column per header."""
    columns = [Column(str(index), header, format_number) for index, header in enumerate(headers)]
    return Table(columns, [{str(index): value for index, value in enumerate(row)} for row in rows]).markdown()


def display_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (for portable reports)."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# What table.md holds while a subcommand writes its figures: a run stopped there leaves a folder that
# says so, which the same command may write into again (foreign_table_problem finds the mark).
UNFINISHED = "# Unfinished: the analysis stopped before it wrote its table; the figures here may be of another run"


def output_folder(out: str | Path, subcommand: str) -> Path:
    """``<out>/<subcommand>``, created if needed, its ``table.md`` replaced by one that says the
    analysis is unfinished (:data:`UNFINISHED`) until :func:`write_markdown` writes the table."""
    folder = Path(out) / subcommand
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TABLE_FILE).write_text(f"{TABLE_MARK}\n{UNFINISHED} (run the subcommand again).\n")
    return folder


def foreign_table_problem(out: str | Path, subcommand: str) -> str | None:
    """Why the subcommand must not write into ``<out>/<subcommand>``: a ``table.md`` there that
    this tool did not write (its first line is not :data:`TABLE_MARK`), or files without the tool's
    ``table.md``; ``None`` otherwise."""
    table = Path(out) / subcommand / TABLE_FILE
    if not table.is_file():
        files = sorted(path.name for path in table.parent.iterdir()) if table.parent.is_dir() else []
        if not files:
            return None
        return (f"--out {out}: {table.parent} holds {listed(files, 5)} but no "
                f"{TABLE_FILE} of tools/analyze.py, so none of it was written by the tool, and {subcommand} would replace "
                "files of the same names there. Give another --out, or move those files away.")
    with open(table, encoding="utf-8", errors="replace") as f:
        if f.readline().rstrip("\n") == TABLE_MARK:
            return None
    return (f"--out {out}: {table} was not written by tools/analyze.py (its first line is not the tool's mark), and "
            f"{subcommand} would replace it and the figures beside it. Give another --out, or move that file away.")


def write_markdown(folder: Path, title: str, sections: Sequence[tuple[str, str]]) -> Path:
    """``folder/table.md``: :data:`TABLE_MARK`, a ``# title``, then one ``## heading`` + body per section."""
    parts = [TABLE_MARK, f"# {title}", ""]
    for heading, body in sections:
        parts += [f"## {heading}", "", body, ""]
    path = folder / TABLE_FILE
    path.write_text("\n".join(parts))
    return path
