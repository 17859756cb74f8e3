"""Result tables: pandas DataFrames written as CSV (`to_csv`) and as Markdown pipe tables.

Cells keep their Python values (object dtype): a column holding a None keeps its ints as ints,
so a CSV cell reads as the value does ("4", not "4.0"), the same bytes as `io.write_csv`. The
Markdown is GitHub's pipe table with one space around each cell and no padding to a column
width (tabulate's `to_markdown` pads), so a row reads the same whatever the other rows hold.
"""

from __future__ import annotations

import os

import pandas as pd

from reasonrl.io import atomic_path, write_text


def frame(rows: list[dict]) -> pd.DataFrame:
    """Rows (dicts, columns in first-seen order) as a DataFrame of the values themselves."""
    return pd.DataFrame(rows, dtype=object)


def markdown(table: pd.DataFrame) -> str:
    """The table as a Markdown pipe table; each cell is str() of its value."""
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + " --- |" * table.shape[1]]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def write_csv(table: pd.DataFrame, path: str | os.PathLike) -> None:
    """The table as CSV (the csv module's dialect: CRLF line ends), written atomically."""
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False, lineterminator="\r\n")


def write_table(table: pd.DataFrame, csv_path: str | os.PathLike, md_path: str | os.PathLike):
    """The same table as CSV and as Markdown."""
    write_csv(table, csv_path)
    write_text(md_path, markdown(table))
