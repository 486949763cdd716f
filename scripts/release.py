"""`make release VERSION=X.Y.Z`: cut a release of this checkout.

1. Refuses unless the work tree is clean, VERSION is a release version (PEP 440, no .dev) above the current one
   (``tidewater.__version__``), and CHANGELOG.md's "Unreleased" section has entries.
2. Sets ``tidewater.__version__`` (the one place the version is kept) to VERSION.
3. Renames CHANGELOG.md's "## Unreleased" to "## VERSION (date)" and opens a new, empty "## Unreleased" above it.
4. Builds the sdist and the wheel into dist/ (``python -m build``; skipped with ``--no-build``).
5. Commits "Release VERSION" and tags it ``vVERSION`` (annotated).
6. Sets the version to the next development release (``--next``, default: the next minor's ``.dev0``) and commits.

Nothing is pushed or uploaded: publishing the tag and dist/ is a person's decision.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

from packaging.version import InvalidVersion, Version

VERSION_FILE = Path("include") / "tidewater" / "__init__.py"
VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.M)


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def current_version(root: Path) -> str:
    found = VERSION_LINE.search((root / VERSION_FILE).read_text())
    if not found:
        raise SystemExit(f"{VERSION_FILE}: no __version__ line")
    return found.group(1)


def set_version(root: Path, version: str) -> None:
    path = root / VERSION_FILE
    path.write_text(VERSION_LINE.sub(f'__version__ = "{version}"', path.read_text(), count=1))


def cut_changelog(root: Path, version: str, day: str) -> str:
    """CHANGELOG.md's text with "## Unreleased" made "## VERSION (day)", under a new empty "## Unreleased"; refuses
    an empty section."""
    text = (root / "CHANGELOG.md").read_text()
    start = text.find("\n## Unreleased\n")
    if start < 0:
        raise SystemExit("CHANGELOG.md has no '## Unreleased' section")
    nxt = text.find("\n## ", start + 1)
    body = text[start + len("\n## Unreleased\n") : nxt if nxt >= 0 else len(text)]
    if not re.search(r"^- ", body, re.M):
        raise SystemExit("CHANGELOG.md: the Unreleased section has no entry; say what changed for users first")
    return text[:start] + f"\n## Unreleased\n\n## {version} ({day})\n" + text[start + len("\n## Unreleased\n") :]


def next_dev(version: Version) -> str:
    return f"{version.major}.{version.minor + 1}.0.dev0"


def release(root: Path, version: str, next_version: str | None, build: bool, day: str) -> None:
    try:
        new = Version(version)
    except InvalidVersion:
        raise SystemExit(f"VERSION={version!r} is not a version (PEP 440), e.g. 0.3.0") from None
    if new.is_devrelease:
        raise SystemExit(f"VERSION={version}: a release version, without .dev")
    old = Version(current_version(root))
    if new <= old:  # 0.3.0 is above 0.3.0.dev0 (PEP 440)
        raise SystemExit(f"VERSION={version} is not above the current {old}")
    if _git(root, "status", "--porcelain"):
        raise SystemExit("the work tree has changes: commit or stash them first")
    if version in _git(root, "tag", "--list", f"v{version}").split():
        raise SystemExit(f"the tag v{version} exists already")
    changelog = cut_changelog(root, version, day)
    set_version(root, version)
    (root / "CHANGELOG.md").write_text(changelog)
    if build:
        subprocess.run([sys.executable, "-m", "build", "--outdir", str(root / "dist"), str(root)], check=True)
    _git(root, "commit", "-q", "-am", f"Release {version}")
    _git(root, "tag", "-a", f"v{version}", "-m", f"Release {version}")
    following = next_version or next_dev(new)
    set_version(root, following)
    _git(root, "commit", "-q", "-am", f"Start {following}")
    print(
        f"tagged v{version}; main is now {following}. Nothing was pushed: `git push origin main v{version}`, and "
        f"upload dist/*{version}* where you publish."
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version", help="the release's version, e.g. 0.3.0")
    ap.add_argument("--next", default=None, help="the development version after it (default: next minor .dev0)")
    ap.add_argument("--no-build", action="store_true", help="do not build dist/ (tests)")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--date", default=date.today().isoformat(), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    release(Path(args.root), args.version, args.next, not args.no_build, args.date)
    return 0


if __name__ == "__main__":
    sys.exit(main())
