"""The documentation: the site builds from docs/ with MkDocs in strict mode (a broken link or a page missing from the
navigation fails), every page is in it, and README's relative links all lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly_with_every_page(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pages = {p.relative_to(REPO / "docs").with_suffix("").as_posix() for p in (REPO / "docs").rglob("*.md")}
    built = {p.relative_to(site).parent.as_posix() for p in site.rglob("index.html")}
    assert {p for p in pages if p != "index"} <= built, sorted(pages - built - {"index"})
    changelog = (site / "changelog" / "index.html").read_text()
    assert "Upgrading" in changelog  # CHANGELOG.md itself, included


def test_readme_links_lead_somewhere_and_it_stays_short():
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert links
    missing = [t for t in links if not t.startswith("http") and not (REPO / t).exists()]
    assert missing == []
    assert len(readme.splitlines()) <= 160


def test_the_formats_page_has_a_section_for_every_value_format():
    """docs/reference/formats.md is checked against the code: a ``## <name>`` heading (or ``## a and b``) per format of
    ``config.formats.FORMATS``, and no heading for a format the code does not have."""
    from tidewater.config.formats import FORMATS

    page = (REPO / "docs" / "reference" / "formats.md").read_text()
    named = {n for h in re.findall(r"^## (.+)$", page, re.M) for n in h.split(" and ")}
    assert named == set(FORMATS), (sorted(set(FORMATS) - named), sorted(named - set(FORMATS)))
