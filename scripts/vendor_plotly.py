"""Ship plotly.js's cartesian bundle for the HTML report: the npm package `plotly.js-cartesian-dist-min` of the
plotly.js version the installed plotly.py pins (its figures are made for that version), unpacked into
specbench/assets/plotly with its licence (MIT). Run it after upgrading plotly; the page uses plotly.py's full
bundle wherever the shipped one is another version (specbench/report/html_page.py). Needs npm and its registry.

    python scripts/vendor_plotly.py
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from plotly.offline import get_plotlyjs_version

from specbench.report.html_page import CARTESIAN

PACKAGE = "plotly.js-cartesian-dist-min"


def main() -> None:
    version = get_plotlyjs_version()
    with tempfile.TemporaryDirectory() as work:
        subprocess.run(["npm", "pack", f"{PACKAGE}@{version}"], cwd=work, check=True, capture_output=True)
        with tarfile.open(next(Path(work).glob("*.tgz"))) as archive:
            archive.extractall(work, filter="data")
        CARTESIAN.parent.mkdir(parents=True, exist_ok=True)
        for name, destination in (("plotly-cartesian.min.js", CARTESIAN), ("LICENSE", CARTESIAN.parent / "LICENSE")):
            shutil.copyfile(Path(work) / "package" / name, destination)
    print(f"{PACKAGE} {version} -> {CARTESIAN} ({CARTESIAN.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
