"""optbench.store: one file per run, never touched by another run (synthetic records)."""

from __future__ import annotations

from synthetic_results import commit, record, samples

from optbench.store import LEGACY_RUN, ResultStore

SHA = commit(3)


def step(ms: float, status: str = "ok") -> dict:
    return {**record("bench_step.StepTiny", {"variant": "eager"}, status=status,
                     times={"step": (None, samples(ms, 1))}), "date": "2026-01-01T00:00:00+00:00"}


def test_a_later_run_never_changes_an_earlier_runs_records(tmp_path):
    store = ResultStore(tmp_path)
    store.save("cpu", SHA, [step(50.0)], run_id="first")
    before = store.path("cpu", SHA, "first").read_bytes()
    store.save("cpu", SHA, [step(1.0, status="crashed")], run_id="second")  # an interrupted rerun
    store.drop("cpu", SHA, [step(1.0)["key"]], run_id="second")
    assert store.path("cpu", SHA, "first").read_bytes() == before
    assert [r.run_id for r in store.runs("cpu", SHA)] == ["first"]  # the second run holds nothing now


def test_an_old_layout_file_reads_as_one_run_per_process(tmp_path):
    store = ResultStore(tmp_path)
    path = store.legacy_path("cpu", SHA)
    path.parent.mkdir(parents=True)
    a, b = step(50.0), {**step(60.0), "key": "other", "date": "2026-01-02T00:00:00+00:00"}
    path.write_text("\n".join(__import__("json").dumps(r) for r in (a, b)) + "\n")
    runs = store.runs("cpu", SHA)
    assert [r.run_id for r in runs] == [f"{LEGACY_RUN}20260101T000000", f"{LEGACY_RUN}20260102T000000"]
    assert store.commits("cpu") == [SHA]
