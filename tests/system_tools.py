"""System programs some tests drive (headless Chromium and its WebDriver, Prometheus' `promtool`),
from Debian packages, not from PyPI.

`.ci/run` installs them in the background while the suite starts (they are not needed by most
tests, and apt takes a minute that would otherwise be added to the run) and names, in
`DANUBE_SYSTEM_TOOLS_DONE`, the file it writes when apt has finished. `require_tool` waits for
that file, then finds the program; missing, it fails the test under CI (where `.ci/run`
installed it, and a skip would pass a run that checked nothing) and skips it elsewhere with the
command that installs it.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

# Debian package of each program the suite uses.
PACKAGES = {"chromium": "chromium", "chromedriver": "chromium-driver", "promtool": "prometheus"}
INSTALL_WAIT_S = 900.0


def require_tool(program: str) -> str:
    """The path of `program`, once `.ci/run`'s background install (if any) has finished."""
    done = os.environ.get("DANUBE_SYSTEM_TOOLS_DONE")
    if done:
        deadline = time.monotonic() + INSTALL_WAIT_S
        while not Path(done).exists() and time.monotonic() < deadline:
            time.sleep(0.5)
    path = shutil.which(program)
    if path:
        return path
    message = (f"{program} is not installed (apt-get install {PACKAGES.get(program, program)}"
               + (f"; .ci/run's install log: {Path(done).with_suffix('.log')}" if done else "") + ")")
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
