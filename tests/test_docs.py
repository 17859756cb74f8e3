"""The documentation's relative links resolve to files inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    ROOT / "config/README.md",
    ROOT / "containers/README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_stay_inside_the_repository(doc):
    targets = [t for t in LINK.findall(doc.read_text()) if "://" not in t]
    outside = [t for t in targets if ROOT not in (doc.parent / t).resolve().parents]
    missing = [t for t in targets if not (doc.parent / t).exists()]
    assert not outside and not missing, {"outside": outside, "missing": missing}


def test_readme_starts_with_its_title():
    assert ROOT.joinpath("README.md").read_text().startswith("# reasonrl\n")


# A pilot's record cites what a reader can rerun: repository paths. A path of the machine the
# pilot ran on, or a script the repository does not hold, is only allowed in a section marked
# historical under its heading.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|root|home)/[\w./{},-]+")
HISTORICAL = "> **Historical.**"
EXPERIMENT_SCRIPT = re.compile(r"\bexperiments/[\w.-]+\.py\b")
SCRIPT_RUN = re.compile(r"(?:\bpython3?\s+|(?<![\w/])\./)([\w./-]+\.(?:py|sh))\b")


def record_sections() -> list[tuple[str, str]]:
    text = (ROOT / "docs/experiment-design.md").read_text()
    sections = re.split(r"(?m)^(?=## )", text)
    return [(section.splitlines()[0], section) for section in sections if section.startswith("## ")]


def outside_the_repository(body: str) -> list[str]:
    """The machine paths a section cites, and the scripts its commands run that the
    repository does not hold."""
    scripts = [name for name in SCRIPT_RUN.findall(body) if not (ROOT / name).exists()]
    return MACHINE_PATH.findall(body) + scripts


def test_only_sections_marked_historical_cite_what_the_repository_does_not_hold():
    unmarked = [
        (heading, outside_the_repository(body)[:3])
        for heading, body in record_sections()
        if outside_the_repository(body) and HISTORICAL not in body.split("\n###", 1)[0]
    ]
    assert not unmarked, unmarked


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_experiment_script_the_docs_cite_is_in_the_repository(doc):
    missing = sorted(
        {p for p in EXPERIMENT_SCRIPT.findall(doc.read_text()) if not (ROOT / p).exists()}
    )
    assert not missing, missing
