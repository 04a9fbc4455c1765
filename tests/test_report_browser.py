"""Headless Chromium opens every generated page (from a synthetic store): no script or resource
errors, no console messages, every image decoded. Chromium is Debian's package; it is installed when
missing and root."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from synthetic_results import report_store

from optbench.reporting import site as pages

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=5000",
    "--dump-dom",
]


@pytest.fixture(scope="module")
def chromium() -> str:
    """Path of chromium, else skip: tests never install anything (.ci/run installs Debian's
    chromium)."""
    return shutil.which("chromium") or pytest.skip(
        "chromium is not installed (.ci/run installs it)"
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[str]:
    """URL of optbench/ in a published synthetic store, served on a free loopback port."""
    root = tmp_path_factory.mktemp("site")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pages, "asv_publish", lambda results, html: None)
        pages.publish(report_store(root / "results").root, root / "html")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(root / "html"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/optbench/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "index.html", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.parametrize("page", ["index", *pages.PAGES])
def test_page_loads_cleanly(chromium: str, site: str, page: str, tmp_path: Path):
    done = subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={tmp_path}", f"{site}{page}.html"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    body = re.search(r"<body([^>]*)>", done.stdout)
    assert body, f"no DOM from chromium (exit {done.returncode}): {done.stderr[-2000:]}"
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body[1]))
    assert attrs.get("errors") == "0", attrs
    assert attrs.get("images-ok") == "1", attrs
    assert page == "index" or int(attrs["images"]) > 0, attrs
    assert re.findall(r":CONSOLE[^\]]*\] (.*)", done.stderr) == []
