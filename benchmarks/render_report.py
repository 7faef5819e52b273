"""Render a `kiln bench` HTML report to PNG with headless Chromium, to look at what users see.

python benchmarks/render_report.py reports/bench/latest/report.html report.png
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def render(html: Path, png: Path, width: int = 1600, height: int = 2400) -> None:
    browser = find_browser()
    if browser is None:
        raise RuntimeError(f"no headless browser found (looked for {', '.join(BROWSERS)}); apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--screenshot={png.resolve()}",
                html.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    if not png.exists():
        raise RuntimeError(f"{browser} wrote no screenshot")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("html", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--height", type=int, default=2400, help="900: a laptop's first screen")
    options = parser.parse_args()
    render(options.html, options.png, options.width, options.height)
    print(f"wrote {options.png}")
