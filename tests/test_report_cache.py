"""A publish makes again only what changed (optbench.reporting.cache): a warm publish writes what a
cold one writes, byte for byte; a store whose records did not change is published without reading
one, and asv's site is republished only where its inputs changed; a record added redraws only the
charts whose inputs it changes. Synthetic stores in tmp_path (test data, not measurements)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_results import _kernels, commit, record, report_store, samples, save

from optbench.reporting import charts, data, site
from optbench.reporting.cache import ReportCache
from optbench.store.store import REPO_ROOT, ResultStore

PNG = b"\x89PNG\r\n\x1a\n"


def _tree(root: Path) -> dict[str, bytes]:
    """The published files under ``root`` (not the report's cache), by path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.relative_to(root).parts[0] != ".cache"
    }


@pytest.fixture
def asv_calls(monkeypatch) -> list[Path]:
    """asv's publish replaced by one that writes an index and records its results root; the
    branches asv reads held still (other work may move this repository's main meanwhile)."""
    calls: list[Path] = []
    monkeypatch.setattr(site, "_branch_heads", lambda conf: "main's head\n")

    def publish(results: Path, html: Path) -> None:
        calls.append(results)
        (html / "asv").mkdir()
        (html / "asv" / "index.html").write_text("asv's site")

    monkeypatch.setattr(site, "asv_publish", publish)
    return calls


@pytest.fixture
def drawn(monkeypatch) -> list[str]:
    """The chart functions drawn (a cache miss), in order."""
    found: list[str] = []
    png = charts.Chart.png
    monkeypatch.setattr(charts.Chart, "png", lambda c: found.append(c.draw.__name__) or png(c))
    return found


def test_a_warm_publish_writes_what_a_cold_one_writes(tmp_path, asv_calls, drawn):
    """Unchanged records: the pages as before, nothing drawn. One kernel record more, at a new
    commit: only the chart it changes is drawn (its benchmark's history; the compare page's two
    newest commits share no change worth a chart), and the pages are byte for byte those of a
    publish into a new folder (mutations: a site key or a chart key that misses an input)."""
    store = report_store(tmp_path / "results")
    warm = tmp_path / "warm"
    site.publish(store.root, warm)
    first, count = _tree(warm), len(drawn)
    assert count > 10
    site.publish(store.root, warm)
    assert _tree(warm) == first and len(drawn) == count
    added = [
        r for r in _kernels(4) if r["key"] == "bench_kernels.RMSNorm|shape=16384x768|impl=triton"
    ]
    save(ResultStore(store.root), "h100-sxm", commit(4), "2025-01-04T12:00:00+00:00", added)
    site.publish(store.root, warm)
    again = drawn[count:]
    assert again == ["history_grid"]  # RMSNorm's: the one benchmark with a new commit
    cold = tmp_path / "cold"
    site.publish(store.root, cold)
    assert _tree(warm) == _tree(cold) != first


def test_an_unchanged_store_is_published_without_reading_a_record(tmp_path, asv_calls, monkeypatch):
    """The second publish of the same records reads none and leaves asv's site; asv publishes again
    once its results change, and once its branch moves (mutations: asv always skipped, never
    skipped, blind to the branch)."""
    store = report_store(tmp_path / "results")
    html = tmp_path / "html"
    site.publish(store.root, html)
    before = _tree(html)

    def unread(*args, **kwargs):
        raise AssertionError("a record was read")

    with monkeypatch.context() as mp:
        mp.setattr(ResultStore, "runs", unread)
        site.publish(store.root, html)
    assert _tree(html) == before and len(asv_calls) == 1
    machine = store.root / "asv" / "h100-sxm"
    machine.mkdir(parents=True)
    (machine / "machine.json").write_text("{}")
    site.publish(store.root, html)
    assert len(asv_calls) == 2
    monkeypatch.setattr(site, "_branch_heads", lambda conf: "main's next head\n")
    site.publish(store.root, html)  # asv places commits by the branches it names
    assert len(asv_calls) == 3


def test_an_unchanged_store_is_published_without_torch_or_matplotlibs_drawing(tmp_path, asv_calls):
    """What keeps the report of an unchanged store well within issue 44's 5 s on a 2-core CPU: its
    process imports neither torch (2 s of a 2-core CPU) nor matplotlib's figures (mutation: torch
    imported by a module the publish imports)."""
    store = report_store(tmp_path / "results")
    html = tmp_path / "html"
    site.publish(store.root, html)
    script = (
        "import sys\n"
        "from optbench.reporting import site\n"
        f"site.publish({str(store.root)!r}, {str(html)!r})\n"
        "print(sorted({'torch', 'matplotlib.figure'} & set(sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    said, imported = done.stdout.splitlines()
    assert "records unchanged" in said and imported == "[]"


def test_the_code_digest_is_the_same_after_matplotlib_use():
    """A process that imported optbench.profiling.charts (``matplotlib.use("Agg")``, which switches
    matplotlib's backend fallback off) keys the report's cache as a fresh one does (mutation: the
    fallback in the digest; a publish after the profiler's charts then drew every chart again)."""
    script = (
        "import matplotlib\n"
        "from optbench.reporting.cache import code_digest\n"
        "fresh = code_digest()\n"
        "code_digest.cache_clear()\n"
        "matplotlib.use('Agg')\n"
        "print(fresh == code_digest())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_the_cache_keeps_only_what_the_last_publish_used(tmp_path, asv_calls):
    store = report_store(tmp_path / "results")
    html = tmp_path / "html"
    site.publish(store.root, html)
    entries = list((html / site.CACHE).glob("*/*"))
    assert any(p.read_bytes().startswith(PNG) for p in entries)
    site.publish(tmp_path / "empty", html)  # no records: no chart
    entries = list((html / site.CACHE).glob("*/*"))
    assert entries and not any(p.read_bytes().startswith(PNG) for p in entries)


def _series_store(root: Path, step_at: int | None) -> ResultStore:
    """10 commits of one GPU's 100M best step, 20% slower from commit ``step_at`` on (None:
    flat)."""
    store = ResultStore(root)
    for n in range(1, 11):
        ms = 50.0 * (1.2 if step_at is not None and n >= step_at else 1.0)
        rec = record(
            "bench_step.Step100M",
            {"variant": "best"},
            times={"step": (None, samples(ms, n))},
            info={"primary_clock": "wall"},
        )
        save(store, "h100-sxm", commit(n), f"2025-01-{n:02d}T12:00:00+00:00", [rec])
    return store


def test_a_kept_change_point_search_is_that_of_its_series(tmp_path):
    """One cache, two stores: each store's change points are its own; the search of a series seen
    before is not made again (mutation: a key without the series)."""
    cache = ReportCache(tmp_path / "cache")
    stepped = _series_store(tmp_path / "stepped", 6)
    (series,) = data.time_histories(stepped, "h100-sxm", cache=cache)
    assert [(p.before, p.after) for p in series.change_points] == [(commit(5), commit(6))]
    made = cache.made
    (flat,) = data.time_histories(_series_store(tmp_path / "flat", None), "h100-sxm", cache=cache)
    assert flat.change_points == () and cache.made == made + 1
    assert data.time_histories(stepped, "h100-sxm", cache=cache) == [series]
    assert cache.made == made + 1
