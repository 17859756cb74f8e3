"""Result tables through pandas: the CSV reads as io.write_csv writes it, the Markdown is an
unpadded pipe table."""

from __future__ import annotations

from reasonrl.io import write_csv as write_rows
from reasonrl.stats.tables import frame, markdown, write_csv

ROWS = [
    {"method": "SFT", "n": 4, "pass@1": 0.1, "best": True, "ci": [0.0, 0.2], "note": "a,b"},
    {"method": "M-DPO", "n": None, "pass@1": 1e-7, "best": False, "ci": None, "note": 'say "x"'},
    {"method": "RAFT", "pass@1": 2.5},
]


def test_csv_has_the_bytes_of_the_row_writer(tmp_path):
    write_rows(tmp_path / "rows.csv", ROWS)
    write_csv(frame(ROWS), tmp_path / "frame.csv")
    assert (tmp_path / "frame.csv").read_bytes() == (tmp_path / "rows.csv").read_bytes()
    assert b"SFT,4,0.1," in (tmp_path / "frame.csv").read_bytes()  # an int stays an int


def test_markdown_is_an_unpadded_pipe_table():
    text = markdown(frame(ROWS[:2])[["method", "n", "best"]])
    assert text == (
        "| method | n | best |\n| --- | --- | --- |\n| SFT | 4 | True |\n| M-DPO | None | False |\n"
    )
