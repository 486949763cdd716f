"""The build's one step beyond pyproject.toml: the Tidewater apps for Airflow's UI (TypeScript in ui/, one bundle in
tidewater/runtime/ui_static/) are built by the build itself when they are not there yet, so `python -m build` works
from a clean clone with Node.js's npm on the PATH and nothing else set up. The sdist carries the built bundle
(MANIFEST.in), so a wheel built from it needs no npm. A build that can make neither says so and stops: a wheel
without the view would install a UI plugin that cannot load."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
BUNDLE = ROOT / "include" / "tidewater" / "runtime" / "ui_static" / "tidewater-ui.js"
UI = ROOT / "ui"


def ensure_ui_bundle() -> None:
    """Build the UI bundle with npm unless it is there (`make ui-bundle` does the same, with its own staleness check)."""
    if BUNDLE.is_file():
        return
    npm = shutil.which("npm")
    if npm is None or not (UI / "package-lock.json").is_file():
        raise SystemExit(f"{BUNDLE.relative_to(ROOT)} is missing and cannot be built here: building it needs npm "
                         "(Node.js 18+) and the ui/ sources (a checkout or this project's sdist)")
    subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=UI, check=True)
    subprocess.run([npm, "run", "--silent", "build"], cwd=UI, check=True)
    if not BUNDLE.is_file():
        raise SystemExit(f"npm run build in ui/ did not write {BUNDLE.relative_to(ROOT)}")


class BuildPy(build_py):
    def run(self) -> None:
        ensure_ui_bundle()
        super().run()


class Sdist(sdist):
    def run(self) -> None:
        ensure_ui_bundle()
        super().run()


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
