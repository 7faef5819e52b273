"""What a non-editable install (`pip install .`, the README's "without make") ships: every file
kiln reads at run time, not only its Python modules (the cpu target's C drivers were missing)."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_carries_every_file_of_the_package(tmp_path):
    pytest.importorskip("setuptools", reason="setuptools builds the wheel")
    # from a clean copy: an in-tree build reuses build/lib, which may hold files a fresh one would not
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "kiln", source / "kiln", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "-w",
            str(tmp_path),
            "--no-deps",
            "--no-build-isolation",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "kiln"
    needed = {
        str(path.relative_to(ROOT))
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert needed - shipped == set(), sorted(needed - shipped)
