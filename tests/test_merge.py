"""optbench merge: results trees of separate runs of one commit fold into one (synthetic data)."""

from __future__ import annotations

import json
import math
import tarfile

import pytest
from synthetic_results import commit, record, samples, save

from optbench.store import merge
from optbench.store.store import ResultStore, asv_results_dir, write_records_file

SHA = commit(7)
COLUMNS = ["result", "params", "version", "started_at", "duration", "samples"]


def asv_file(
    values: list[float | None], variants: tuple[str, ...] = ("eager", "best"), version: str = "1"
) -> dict:
    params = [[f"'{v}'" for v in variants]]
    return {
        "commit_hash": SHA,
        "result_columns": COLUMNS,
        "durations": {},
        "results": {
            "bench_step.Step100M.track_step_ms": [values, params, version, 0, 1.0, [None] * 2]
        },
    }


def write_asv_file(root, values: list[float | None], old_layout: bool = False):
    """asv's results of SHA on h100-sxm in the results root ``root``: in asv's tree, or
    (``old_layout``) where asv wrote them before it had one, beside optbench's records in the
    machine folder."""
    path = (
        (root if old_layout else asv_results_dir(root)) / "h100-sxm" / f"{SHA[:8]}-existing-py.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asv_file(values)))
    return path


def step(variant: str, ms: float, seed: int) -> dict:
    return record(
        "bench_step.Step100M", {"variant": variant}, times={"step": (None, samples(ms, seed))}
    )


def test_two_partial_runs_of_one_commit_merge(tmp_path):
    first, second, dest = (tmp_path / name / "results" for name in ("a", "b", "dest"))
    save(ResultStore(first), "h100-sxm", SHA, "2026-01-01T00:00:00+00:00", [step("eager", 80.0, 1)])
    save(ResultStore(second), "h100-sxm", SHA, "2026-01-01T01:00:00+00:00", [step("best", 20.0, 2)])
    for root, values in ((first, [80.0, None]), (second, [math.nan, 20.0])):
        write_asv_file(root, values)
    (second / "h100-sxm" / "profiles" / "p").mkdir(parents=True)
    (second / "h100-sxm" / "profiles" / "p" / "report.md").write_text("# a report")
    with tarfile.open(tmp_path / "b.tgz", "w:gz") as tar:  # what a device call hands back
        tar.add(second, arcname="results")

    assert merge.main([str(first), str(tmp_path / "b.tgz"), "--into", str(dest)]) == 0

    records = ResultStore(dest).load("h100-sxm", SHA)
    assert {r["params"]["variant"] for k, r in records.items() if not k.startswith("__")} == {
        "eager",
        "best",
    }
    merged = json.loads((dest / "asv" / "h100-sxm" / f"{SHA[:8]}-existing-py.json").read_text())
    assert merged["results"]["bench_step.Step100M.track_step_ms"][0] == [80.0, 20.0]
    assert (dest / "h100-sxm" / "profiles" / "p" / "report.md").read_text() == "# a report"


def test_a_tarball_of_the_old_layout_puts_asvs_files_into_asvs_tree(tmp_path):
    """A results tree from before asv had a tree of its own (asv's files in the machine folders,
    benchmarks.json at the root) merges them into ``asv/``, beside what is there: the machine
    folders keep none of asv's files."""
    old, dest = tmp_path / "old" / "results", tmp_path / "dest" / "results"
    save(ResultStore(old), "h100-sxm", SHA, "2026-01-01T01:00:00+00:00", [step("best", 20.0, 2)])
    write_asv_file(old, [None, 20.0], old_layout=True)
    (old / "h100-sxm" / "machine.json").write_text('{"machine": "h100-sxm", "version": 1}')
    (old / "benchmarks.json").write_text('{"version": 2}')
    (old / "h100-sxm" / "profiles" / "p").mkdir(parents=True)
    # not asv's: stays where it is
    (old / "h100-sxm" / "profiles" / "p" / "report.json").write_text("{}")
    with tarfile.open(tmp_path / "old.tgz", "w:gz") as tar:
        tar.add(old, arcname="results")
    # what the checkout holds: 'eager' measured by an earlier run
    write_asv_file(dest, [80.0, None])

    assert merge.main([str(tmp_path / "old.tgz"), "--into", str(dest)]) == 0

    asv = asv_results_dir(dest)
    merged = json.loads((asv / "h100-sxm" / f"{SHA[:8]}-existing-py.json").read_text())
    assert merged["results"]["bench_step.Step100M.track_step_ms"][0] == [80.0, 20.0]
    assert json.loads((asv / "h100-sxm" / "machine.json").read_text())["machine"] == "h100-sxm"
    assert json.loads((asv / "benchmarks.json").read_text()) == {"version": 2}
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*.json")) == [
        "asv/benchmarks.json",
        f"asv/h100-sxm/{SHA[:8]}-existing-py.json",
        "asv/h100-sxm/machine.json",
        "h100-sxm/profiles/p/report.json",
    ]
    assert {
        r["params"]["variant"]
        for k, r in ResultStore(dest).load("h100-sxm", SHA).items()
        if not k.startswith("__")
    } == {"best"}
    before = {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    merge.merge_tree(old, dest)  # merging it again changes nothing
    assert {p: p.read_bytes() for p in dest.rglob("*") if p.is_file()} == before


def test_a_later_measurement_wins_and_null_never_erases():
    old, new = asv_file([80.0, 30.0]), asv_file([None, 25.0])
    assert merge.merge_asv_results(old, new)["results"]["bench_step.Step100M.track_step_ms"][0] == [
        80.0,
        25.0,
    ]


def test_values_follow_their_combination_when_the_grid_grows():
    """A run of a narrower grid (an earlier suite's asv params) merged under a wider one: each value
    stays with its variant, also where asv wrote a column of nothing measured as null or cut its
    trailing nulls; a changed benchmark version drops the earlier values."""
    old = asv_file([80.0, 30.0], ("eager", "best"))
    new = asv_file([None, 25.0, None], ("fp32", "best", "eager"))
    row = merge.merge_asv_results(old, new)["results"]["bench_step.Step100M.track_step_ms"]
    assert row[0] == [None, 25.0, 80.0] and row[1] == [["'fp32'", "'best'", "'eager'"]]
    nothing = asv_file([None, 25.0, None], ("fp32", "best", "eager"))
    nothing["results"]["bench_step.Step100M.track_step_ms"][0] = None  # asv's all-null column
    row = merge.merge_asv_results(old, nothing)["results"]["bench_step.Step100M.track_step_ms"]
    assert row[0] == [None, 30.0, 80.0]
    short = asv_file([None, 25.0], ("fp32", "best", "eager"))  # trailing nulls dropped
    row = merge.merge_asv_results(old, short)["results"]["bench_step.Step100M.track_step_ms"]
    assert row[0] == [None, 25.0, 80.0]
    changed = asv_file([None, 25.0, None], ("fp32", "best", "eager"), version="2")
    row = merge.merge_asv_results(old, changed)["results"]["bench_step.Step100M.track_step_ms"]
    assert row[0] == [None, 25.0, None]


def test_a_selected_run_keeps_the_cases_an_earlier_run_of_the_commit_measured(tmp_path):
    """asv rewrites a commit's whole grid, null where a --select left a case out: its writer
    (optbench.asv.asv_atomic) keeps what an earlier run of the commit measured there."""
    from optbench.asv import asv_atomic

    # a first --select run measured 'eager'
    path = write_asv_file(tmp_path / "results", [80.0, None])
    # asv's rewrite by a second one, selecting 'best'
    asv_atomic._write_json(path, asv_file([None, 20.0]))
    assert json.loads(path.read_text())["results"]["bench_step.Step100M.track_step_ms"][0] == [
        80.0,
        20.0,
    ]


def _all_records(store: ResultStore) -> list[str]:
    """Every stored record of every run, as sorted JSON text (what a merge must never lose)."""
    return sorted(
        json.dumps(rec, sort_keys=True)
        for machine in store.machines()
        for c in store.commits(machine)
        for run in store.runs(machine, c)
        for rec in run.records.values()
    )


def test_a_merge_loses_no_stored_sample(tmp_path):
    """Two runs that measured the same case (and an old-layout file) merge into every one of their
    records."""
    first, second, dest = (tmp_path / name / "results" for name in ("a", "b", "dest"))
    save(ResultStore(first), "h100-sxm", SHA, "2026-01-01T00:00:00+00:00", [step("eager", 80.0, 1)])
    save(
        ResultStore(second), "h100-sxm", SHA, "2026-01-01T01:00:00+00:00", [step("eager", 85.0, 2)]
    )
    legacy = ResultStore(dest).legacy_path("h100-sxm", SHA)
    legacy.parent.mkdir(parents=True)
    write_records_file(
        legacy, json.dumps({**step("eager", 79.0, 3), "date": "2025-12-31T00:00:00+00:00"}) + "\n"
    )
    before = (
        _all_records(ResultStore(first))
        + _all_records(ResultStore(second))
        + _all_records(ResultStore(dest))
    )

    assert merge.main([str(first), str(second), "--into", str(dest)]) == 0
    # merging again adds nothing
    assert merge.main([str(first), str(second), "--into", str(dest)]) == 0

    after = _all_records(ResultStore(dest))
    assert sorted(before) == after
    runs = ResultStore(dest).runs("h100-sxm", SHA)
    medians = [
        r.results()["bench_step.Step100M|variant=eager"]["metrics"]["step"]["wall"]["median_ms"]
        for r in runs
    ]
    assert medians == pytest.approx([79.0, 80.0, 85.0], rel=0.02)


def test_two_snapshots_of_one_run_join_and_a_differing_record_is_kept_apart(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    placeholder = {
        **step("best", 1.0, 0),
        "status": "crashed",
        "reason": "the process died while measuring "
        "this case; later cases of its grid were not measured in that run",
    }
    save(
        ResultStore(dest),
        "h100-sxm",
        SHA,
        "2026-01-01T00:00:00+00:00",
        [step("eager", 80.0, 1), placeholder],
        run_id="r1",
    )
    save(
        ResultStore(src),
        "h100-sxm",
        SHA,
        "2026-01-01T00:00:00+00:00",
        [step("eager", 99.0, 9), step("best", 20.0, 2), step("fp32", 200.0, 3)],
        run_id="r1",
    )
    merge.merge_tree(src, dest)
    runs = {r.run_id: r.results() for r in ResultStore(dest).runs("h100-sxm", SHA)}
    assert set(runs["r1"]) == {
        f"bench_step.Step100M|variant={v}" for v in ("eager", "best", "fp32")
    }
    # the placeholder gave way
    assert runs["r1"]["bench_step.Step100M|variant=best"]["status"] == "ok"
    apart = [r for k, r in runs.items() if k.startswith("r1~")]
    # 99 ms kept beside 80 ms
    assert len(apart) == 1 and list(apart[0]) == ["bench_step.Step100M|variant=eager"]


def test_an_older_snapshots_placeholder_does_not_shadow_the_finished_record(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    placeholder = {
        **step("best", 1.0, 0),
        "status": "crashed",
        "reason": "the process died while measuring "
        "this case; later cases of its grid were not measured in that run",
    }
    save(
        ResultStore(dest),
        "h100-sxm",
        SHA,
        "2026-01-01T00:00:00+00:00",
        [step("best", 20.0, 2)],
        run_id="r1",
    )
    save(ResultStore(src), "h100-sxm", SHA, "2026-01-01T00:00:00+00:00", [placeholder], run_id="r1")
    assert merge.merge_tree(src, dest) == []
    assert [r.run_id for r in ResultStore(dest).runs("h100-sxm", SHA)] == ["r1"]
    assert (
        ResultStore(dest).load("h100-sxm", SHA)["bench_step.Step100M|variant=best"]["status"]
        == "ok"
    )


def test_a_merge_into_a_folder_git_ignores_says_how_to_commit_it(tmp_path, capsys):
    """A machine with no committed results is ignored (.gitignore): its merged runs would never land
    unless committed on purpose, so merge names the folder; a tracked machine's merge says
    nothing."""
    import subprocess

    from optbench.store import merge

    repo = tmp_path / "repo"
    (repo / "results" / "known").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("/results/*/\n!/results/known/\n")
    src = tmp_path / "src"
    for machine in ("known", "newgpu"):
        run = src / machine / "optbench" / ("a" * 40)
        run.mkdir(parents=True)
        (run / "r1.jsonl").write_text('{"key": "__machine__", "info": {}}\n')
    assert merge.main([str(src), "--into", str(repo / "results")]) == 0
    err = capsys.readouterr().err
    assert "results/newgpu is ignored by git" in err and "git add -f results/newgpu" in err
    assert "results/known" not in err


def shard_tree(root, run_id: str, gpu_uuid: str, records: list[dict], values: list[float | None]):
    """The artifact of one shard's CI job: its run (records on its GPU) and asv's results of SHA,
    with asv's benchmarks.json, in the results root ``root``."""
    save(
        ResultStore(root),
        "h100-sxm",
        SHA,
        "2026-01-01T00:00:00+00:00",
        records,
        run_id=run_id,
        gpu_uuid=gpu_uuid,
    )
    write_asv_file(root, values)
    (root / "asv" / "benchmarks.json").write_text(json.dumps({"version": 2}))
    return root


def test_the_shards_of_one_commit_from_several_runners_merge_without_replacing_a_record(tmp_path):
    """Two shards of one commit, started in the same second on two runners: every record of both is
    kept, each run with its GPU, asv's results hold both shards' cases, in either order, and merging
    again adds nothing."""
    one = shard_tree(
        tmp_path / "shard1",
        "20260101T000000Z-aaaaaa",
        "GPU-1",
        [step("eager", 80.0, 1), step("fused-ce", 70.0, 3)],
        [80.0, None],
    )
    two = shard_tree(
        tmp_path / "shard2",
        "20260101T000000Z-bbbbbb",
        "GPU-2",
        [step("best", 20.0, 2)],
        [None, 20.0],
    )
    before = sorted(_all_records(ResultStore(one)) + _all_records(ResultStore(two)))
    for order, dest in (((one, two), tmp_path / "dest12"), ((two, one), tmp_path / "dest21")):
        assert merge.main([*map(str, order), "--into", str(dest)]) == 0
        assert merge.main([*map(str, order), "--into", str(dest)]) == 0
        assert _all_records(ResultStore(dest)) == before
        runs = {r.run_id: r for r in ResultStore(dest).runs("h100-sxm", SHA)}
        assert {i: r.info["gpu_uuid"] for i, r in runs.items()} == {
            "20260101T000000Z-aaaaaa": "GPU-1",
            "20260101T000000Z-bbbbbb": "GPU-2",
        }
        asv = json.loads((dest / "asv" / "h100-sxm" / f"{SHA[:8]}-existing-py.json").read_text())
        assert asv["results"]["bench_step.Step100M.track_step_ms"][0] == [80.0, 20.0]


def passwd_like(tmp_path):
    """A text file, as /etc/passwd: no folder, no tar."""
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/bin/false\n")
    return path


def unrelated_files(tmp_path):
    """A folder of 15 files that are no results."""
    folder = tmp_path / "unrelated"
    folder.mkdir()
    for n in range(15):
        (folder / f"file{n}.txt").write_text(f"{n}\n")
    return folder


def tar_of_unrelated_files(tmp_path):
    with tarfile.open(tmp_path / "unrelated.tgz", "w:gz") as tar:
        tar.add(unrelated_files(tmp_path), arcname="results")
    return tmp_path / "unrelated.tgz"


def records_beside_a_stray_file(tmp_path):
    """A results tree but for one file at its root that has no place in one."""
    root = tmp_path / "stray" / "results"
    save(ResultStore(root), "h100-sxm", SHA, "2026-01-01T02:00:00+00:00", [step("fp32", 99.0, 4)])
    (root / "notes.txt").write_text("not a result")
    return root


def asv_results_that_are_not_asvs(tmp_path):
    """asv's results file of a machine in its place, holding JSON that is no asv results."""
    root = tmp_path / "fake" / "results"
    write_asv_file(root, [1.0, None]).write_text('{"hello": "world"}')
    return root


def asv_results_that_are_no_json(tmp_path):
    root = tmp_path / "nojson" / "results"
    write_asv_file(root, [1.0, None], old_layout=True).write_text("<html>not json</html>")
    return root


def an_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


NOT_TREES = [
    passwd_like,
    unrelated_files,
    tar_of_unrelated_files,
    records_beside_a_stray_file,
    asv_results_that_are_not_asvs,
    asv_results_that_are_no_json,
    an_empty_folder,
]


def _files(root) -> dict:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("plant", NOT_TREES, ids=lambda plant: plant.__name__)
def test_what_is_no_results_tree_is_refused_in_one_line_and_nothing_is_merged(
    tmp_path, plant, capsys
):
    """A source that is neither an optbench or asv results tree nor a tar of one, named after a
    good one: one line on stderr naming it, exit 2, and nothing merged from either."""
    from optbench import cli

    good, dest = tmp_path / "good" / "results", tmp_path / "dest" / "results"
    save(ResultStore(good), "h100-sxm", SHA, "2026-01-01T00:00:00+00:00", [step("eager", 80.0, 1)])
    write_asv_file(good, [80.0, None])
    write_asv_file(dest, [None, 20.0])
    before = _files(dest)
    bad = plant(tmp_path)
    assert cli.main(["merge", str(good), str(bad), "--into", str(dest)]) == 2
    out = capsys.readouterr()
    assert not out.out and len(out.err.splitlines()) == 1, out
    assert out.err.startswith(f"optbench merge: {bad} is not an optbench or asv results tree")
    assert out.err.rstrip().endswith("; nothing merged")
    assert _files(dest) == before


def test_a_combination_a_run_left_out_is_null_not_what_asv_loaded(tmp_path):
    """Two shards of one commit (``run --gpus``), each asv's results loaded before either wrote:
    asv, through optbench's writer, leaves out what its regex did not select as null (asv itself
    would keep the value it loaded), so neither shard writes a stale value over the other's."""
    import math

    from asv.results import Results
    from asv.runner import BenchmarkResult

    from optbench.asv import asv_atomic

    def shard(selected: int, value: float) -> dict:
        results = Results({"machine": "h100-sxm"}, {}, SHA, 0, "3.11", "existing-py", {})
        benchmark = {
            "name": "bench_step.Step100M.track_step_ms",
            "params": [["'eager'", "'best'"]],
            "version": "1",
        }
        add = asv_atomic._measured_only(Results.add_result)
        loaded = BenchmarkResult([80.0, 30.0], [None] * 2, [None] * 2, 0, "", None)
        add(results, benchmark, loaded)  # what asv read from the file before the run
        measured = [math.nan, math.nan]
        measured[selected] = value
        now = BenchmarkResult(measured, [None] * 2, [None] * 2, 0, "", None)
        add(results, benchmark, now, selected_idx=[selected])
        return results.get_result_value(benchmark["name"], benchmark["params"])

    path = write_asv_file(tmp_path / "results", [80.0, 30.0])
    first, second = shard(0, 70.0), shard(1, 20.0)
    # null (asv's own add_result: the loaded 30 and 80)
    assert math.isnan(first[1]) and math.isnan(second[0])
    for values in (second, first):  # the second shard writes first; asv saves a NaN as null
        asv_atomic._write_json(path, asv_file([None if math.isnan(v) else v for v in values]))
    assert json.loads(path.read_text())["results"]["bench_step.Step100M.track_step_ms"][0] == [
        70.0,
        20.0,
    ]
