"""The links between optbench's HTML pages and asv's site resolve to files of the HTML root."""

from __future__ import annotations

import re
from pathlib import Path

from synthetic_results import report_store

from optbench.reporting import site


def test_every_page_links_inside_the_html_root(tmp_path, monkeypatch):
    html = tmp_path / "html"

    def asv_publish(results: Path, out: Path) -> None:  # what asv publish leaves: its index
        (out / "asv").mkdir(parents=True)
        (out / "asv" / "index.html").write_text("<html></html>")

    monkeypatch.setattr(site, "asv_publish", asv_publish)
    site.publish(report_store(tmp_path / "results").root, html)
    pages = [html / "index.html", *sorted((html / "optbench").glob("*.html"))]
    assert len(pages) > 2
    for page in pages:
        for href in re.findall(r'<a href="([^"#]+)"', page.read_text()):
            target = (page.parent / href).resolve()
            assert target.is_relative_to(html.resolve()) and target.is_file(), (page, href)
