"""optbench merge: results trees of separate runs of one commit fold into one (synthetic data)."""

from __future__ import annotations

import json
import math
import tarfile

from synthetic_results import commit, record, samples, save

from optbench import merge
from optbench.store import ResultStore

SHA = commit(7)
COLUMNS = ["result", "params", "version", "started_at", "duration", "samples"]


def asv_file(values: list[float | None]) -> dict:
    params = [["'eager'", "'best'"]]
    return {"commit_hash": SHA, "result_columns": COLUMNS, "durations": {},
            "results": {"bench_step.Step100M.track_step_ms": [values, params, "1", 0, 1.0, [None, None]]}}


def step(variant: str, ms: float, seed: int) -> dict:
    return record("bench_step.Step100M", {"variant": variant}, times={"step": (None, samples(ms, seed))})


def test_two_partial_runs_of_one_commit_merge(tmp_path):
    first, second, dest = (tmp_path / name / "results" for name in ("a", "b", "dest"))
    save(ResultStore(first), "h100-sxm", SHA, "2026-01-01T00:00:00+00:00", [step("eager", 80.0, 1)])
    save(ResultStore(second), "h100-sxm", SHA, "2026-01-01T01:00:00+00:00", [step("best", 20.0, 2)])
    for root, values in ((first, [80.0, None]), (second, [math.nan, 20.0])):
        (root / "h100-sxm" / f"{SHA[:8]}-existing-py.json").write_text(json.dumps(asv_file(values)))
    (second / "h100-sxm" / "profiles" / "p").mkdir(parents=True)
    (second / "h100-sxm" / "profiles" / "p" / "report.md").write_text("# a report")
    with tarfile.open(tmp_path / "b.tgz", "w:gz") as tar:  # what a device call hands back
        tar.add(second, arcname="results")

    assert merge.main([str(first), str(tmp_path / "b.tgz"), "--into", str(dest)]) == 0

    records = ResultStore(dest).load("h100-sxm", SHA)
    assert {r["params"]["variant"] for k, r in records.items() if not k.startswith("__")} == {"eager", "best"}
    merged = json.loads((dest / "h100-sxm" / f"{SHA[:8]}-existing-py.json").read_text())
    assert merged["results"]["bench_step.Step100M.track_step_ms"][0] == [80.0, 20.0]
    assert (dest / "h100-sxm" / "profiles" / "p" / "report.md").read_text() == "# a report"


def test_a_later_measurement_wins_and_null_never_erases():
    old, new = asv_file([80.0, 30.0]), asv_file([None, 25.0])
    assert merge.merge_asv_results(old, new)["results"]["bench_step.Step100M.track_step_ms"][0] == [80.0, 25.0]


def test_a_selected_run_keeps_the_cases_an_earlier_run_of_the_commit_measured(tmp_path, monkeypatch):
    from optbench import cli

    monkeypatch.setattr(cli, "ROOT", tmp_path)
    path = tmp_path / "results" / "h100-sxm" / f"{SHA[:8]}-existing-py.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(asv_file([80.0, None])))  # a first --select run measured 'eager'
    earlier = cli._asv_results("h100-sxm", SHA)
    path.write_text(json.dumps(asv_file([None, 20.0])))  # asv's rewrite by a second one, selecting 'best'
    cli._keep_earlier_cases(earlier, "h100-sxm", SHA)
    assert json.loads(path.read_text())["results"]["bench_step.Step100M.track_step_ms"][0] == [80.0, 20.0]
