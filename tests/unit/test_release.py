"""`make release` (scripts/release.py) in a clone of this checkout: version, CHANGELOG, tag and the next development
version; and what it refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "release.py"


def _clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=300)
    for key, value in (("user.email", "release@test"), ("user.name", "release test")):
        subprocess.run(["git", "config", key, value], cwd=clone, check=True)
    return clone


def _release(clone, *args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--no-build", "--root", str(clone), "--date", "2026-12-01"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _git(clone, *args):
    return subprocess.run(["git", *args], cwd=clone, check=True, capture_output=True, text=True).stdout


def test_a_release_sets_the_version_cuts_the_changelog_tags_and_starts_the_next(tmp_path):
    clone = _clone(tmp_path)
    done = _release(clone, "0.3.0")
    assert done.returncode == 0, done.stderr
    assert _git(clone, "tag", "--list").split() == ["v0.3.0"]
    tagged = _git(clone, "show", "v0.3.0:include/tidewater/__init__.py")
    assert '__version__ = "0.3.0"' in tagged
    changelog = _git(clone, "show", "v0.3.0:CHANGELOG.md")
    assert "\n## Unreleased\n\n## 0.3.0 (2026-12-01)\n" in changelog
    assert '__version__ = "0.4.0.dev0"' in (clone / "include" / "tidewater" / "__init__.py").read_text()
    assert _git(clone, "log", "--format=%s", "-2").splitlines() == ["Start 0.4.0.dev0", "Release 0.3.0"]
    assert _git(clone, "status", "--porcelain") == ""


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["0.2.0"], "is not above the current"),
        (["0.3.0.dev1"], "a release version, without .dev"),
        (["three"], "is not a version"),
    ],
)
def test_a_release_refuses_a_version_that_is_not_a_new_release(tmp_path, args, words):
    clone = _clone(tmp_path)
    done = _release(clone, *args)
    assert done.returncode != 0 and words in done.stderr, done.stderr
    assert _git(clone, "tag", "--list") == ""


def test_a_release_refuses_a_dirty_tree_and_an_empty_unreleased_section(tmp_path):
    clone = _clone(tmp_path)
    (clone / "README.md").write_text("changed\n")
    done = _release(clone, "0.3.0")
    assert done.returncode != 0 and "the work tree has changes" in done.stderr
    _git(clone, "checkout", "README.md")
    assert _release(clone, "0.3.0").returncode == 0
    again = _release(clone, "0.4.0")  # nothing under Unreleased since 0.3.0
    assert again.returncode != 0 and "the Unreleased section has no entry" in again.stderr
