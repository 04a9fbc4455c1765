"""optbench.reporting.suite_runs: how long whole suite runs took, on the headline page, newest
first, runs of few cases left out, a run from before the compile warm-up read too."""

from __future__ import annotations

from synthetic_results import commit, report_store

from optbench.reporting import headline, suite_runs
from optbench.store.store import ResultStore


def _run(
    store: ResultStore,
    run_id: str,
    cases: int,
    caches: str,
    phases: dict,
    ok: int,
    machine: str = "h200",
    at: str = "c" * 40,
    at_once: int = 1,
) -> None:
    """A stored run of ``cases`` cases, ``ok`` of them ok, the rest skipped, with its breakdown."""
    info = {
        "compile_cache": caches,
        "gpu_uuid": "GPU-2b744a59-1ae9",
        "gpu_name": "NVIDIA H100",
        "runs_at_once": at_once,
    }
    records = [
        {"key": "__machine__", "info": info},
        {"key": "__breakdown__", "wall_seconds": 278.321, "cases": cases, "phases": phases},
        *(
            {"key": f"bench_x.X|case={i}", "status": "ok" if i < ok else "skipped"}
            for i in range(cases)
        ),
    ]
    store.save(machine, at, records, run_id=run_id)


def test_the_newest_suite_runs_read_as_rows(tmp_path):
    store = ResultStore(tmp_path / "results")
    warmed = {"prewarm": 34.1, "compile": 14.0, "timing": 137.9}
    _run(store, "20261129T190318Z-843328", 68, "prewarmed", warmed, ok=68)
    _run(store, "20261129T161452Z-95bf99", 68, "restored nvidia-h200-x", {"compile": 9.0}, ok=65)
    _run(store, "20261129T170000Z-select", 3, "cold", {}, ok=3)  # a narrow --select
    rows = [suite_runs.suite_row(r) for r in suite_runs.suite_runs(store, "h200")]
    assert rows == [
        [
            "843328",
            "cccccccc",
            "68 / 0 / 0",
            "prewarmed",
            "1",
            "278.3",
            "34.1",
            "14.0",
            "137.9",
            "2b744a59",
        ],
        [
            "95bf99",
            "cccccccc",
            "65 / 3 / 0",
            "restored",
            "1",
            "278.3",
            "–",
            "9.0",
            "0.0",
            "2b744a59",
        ],
    ]
    assert len(suite_runs.suite_runs(store, "h200", newest=1)) == 1
    # a shard of `run --gpus 4` over the full suite: 17 cases, each of its siblings as many
    _run(store, "20261129T200000Z-shard1", 17, "cold", {}, ok=17, at_once=4)
    shard = suite_runs.suite_row(suite_runs.suite_runs(store, "h200")[0])
    assert shard[:5] == ["shard1", "cccccccc", "17 / 0 / 0", "cold", "4"]


def test_the_headline_shows_suite_runs_where_there_are_some(tmp_path):
    store = report_store(tmp_path / "results")
    assert suite_runs.CAPTION not in headline.headline_table(store)
    run = "20261129T190318Z-843328"
    _run(store, run, 68, "prewarmed", {"prewarm": 34.1}, ok=68, machine="h100-sxm", at=commit(3))
    text = headline.headline_table(store)
    assert suite_runs.CAPTION in text and "| 843328 " in text
