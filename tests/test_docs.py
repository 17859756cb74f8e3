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
