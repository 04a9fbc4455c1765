"""optbench history's own decisions, without worktrees or runs (both stubbed)."""

from __future__ import annotations

from optbench.reporting import history, site


def test_no_html_publishes_nothing(monkeypatch):
    """``--no-html`` among the run arguments: each commit's run gets it and nothing is published at
    the end; without it the site is published once."""
    runs, published = [], []
    monkeypatch.setattr(history, "commits_in", lambda rev_range: ["a" * 40, "b" * 40])
    monkeypatch.setattr(history, "run_commit", lambda commit, run_args: runs.append(run_args) or 0)
    monkeypatch.setattr(site, "publish", lambda *args: published.append(args))
    assert history.main(["A..B", "--suite", "quick", "--no-html"]) == 0
    assert runs == [["--suite", "quick", "--no-html"]] * 2 and published == []
    assert history.main(["A..B", "--suite", "quick"]) == 0
    assert published == [()]
