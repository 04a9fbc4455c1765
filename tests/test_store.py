"""optbench.store.store: one file per run, never touched by another run (synthetic records)."""

from __future__ import annotations

import gzip
import json
import os

import pytest
from synthetic_results import commit, record, samples

from optbench.measure.timing import Measurement, Timing
from optbench.store.records import Record
from optbench.store.store import (
    LEGACY_RUN,
    REPO_ROOT,
    CannotWrite,
    ResultStore,
    asv_results_dir,
    records_text,
    require_writable,
    write_records_file,
)

SHA = commit(3)


def step(ms: float, status: str = "ok") -> dict:
    return {
        **record(
            "bench_step.StepTiny",
            {"variant": "eager"},
            status=status,
            times={"step": (None, samples(ms, 1))},
        ),
        "date": "2026-01-01T00:00:00+00:00",
    }


def test_a_later_run_never_changes_an_earlier_runs_records(tmp_path):
    store = ResultStore(tmp_path)
    store.save("cpu", SHA, [step(50.0)], run_id="first")
    before = store.path("cpu", SHA, "first").read_bytes()
    store.save("cpu", SHA, [step(1.0, status="crashed")], run_id="second")  # an interrupted rerun
    store.drop("cpu", SHA, [step(1.0)["key"]], run_id="second")
    assert store.path("cpu", SHA, "first").read_bytes() == before
    # the second run holds nothing now
    assert [r.run_id for r in store.runs("cpu", SHA)] == ["first"]


def test_a_saved_run_loads_back_with_every_sample_and_quartile(tmp_path):
    """What the runner writes (a Measurement's clocks, each with its raw samples and their
    quartiles) reads back from disk unchanged, through a fresh store: after the first write, after a
    later write of the same run rewrote the file, and after a merge copied the run into another
    results tree."""
    clocks = {
        "device": Timing(samples(2.0, 1, n=25), "cuda-graph"),
        "device_warm": Timing(samples(1.5, 2, n=25), "cuda-graph"),
        "wall": Timing(samples(2.5, 3, n=25), "perf-counter"),
    }
    saved = {
        **record("bench_kernels.RMSNorm", {"shape": "8x8", "impl": "triton"}),
        "metrics": {"fwd": Measurement(**clocks).to_dict()},
        "date": "2026-01-01T00:00:00+00:00",
    }

    def assert_kept(root) -> None:
        loaded = ResultStore(root).load("cpu", SHA)[saved["key"]]
        assert loaded == saved
        for clock, timing in clocks.items():
            view = Record.of(loaded).timing("fwd", clock)
            assert view.samples_ms == timing.samples_ms, clock
            assert (view.q25_ms, view.median_ms, view.q75_ms) == (
                timing.q25_ms,
                timing.median_ms,
                timing.q75_ms,
            )
            # the statistics follow from the stored samples
            assert Timing.from_dict(loaded["metrics"]["fwd"][clock]) == timing

    store = ResultStore(tmp_path / "a")
    store.save("cpu", SHA, [saved], run_id="r1")
    assert_kept(tmp_path / "a")
    store.save("cpu", SHA, [step(50.0)], run_id="r1")  # reads r1's file back and rewrites it
    assert_kept(tmp_path / "a")
    (run,) = ResultStore(tmp_path / "a").runs("cpu", SHA)
    assert ResultStore(tmp_path / "b").add_run(run) == ["r1"]
    assert_kept(tmp_path / "b")


def test_an_old_layout_file_reads_as_one_run_per_process(tmp_path):
    store = ResultStore(tmp_path)
    path = store.legacy_path("cpu", SHA)
    path.parent.mkdir(parents=True)
    a, b = step(50.0), {**step(60.0), "key": "other", "date": "2026-01-02T00:00:00+00:00"}
    write_records_file(path, "\n".join(json.dumps(r) for r in (a, b)) + "\n")
    runs = store.runs("cpu", SHA)
    assert [r.run_id for r in runs] == [
        f"{LEGACY_RUN}20260101T000000",
        f"{LEGACY_RUN}20260102T000000",
    ]
    assert store.commits("cpu") == [SHA]


def test_asvs_tree_holds_only_what_asv_can_load():
    """asv reads every folder under its results_dir that holds a .json file as a machine's, and
    warns for each one without a machine.json (profiles, anchors, pytest-benchmark: issue 20). Its
    results_dir is asv's tree alone, and the results tree holds no asv file outside it."""
    conf = json.loads((REPO_ROOT / "asv.conf.json").read_text())
    asv = asv_results_dir()
    assert (REPO_ROOT / conf["results_dir"]).resolve() == asv.resolve()
    for folder, _, files in os.walk(asv):
        if folder != str(asv) and any(f.endswith(".json") for f in files):
            assert "machine.json" in files, folder
    results = REPO_ROOT / "results"
    assert [
        p for p in [*results.glob("*.json"), *results.glob("*/*.json")] if p.parent != asv
    ] == []
    # the H100's history is there
    assert {p.parent.name for p in asv.glob("*/machine.json")} >= {"h100-sxm"}


@pytest.mark.parametrize("form", ["compressed", "plain"])
def test_a_cut_short_run_file_keeps_its_whole_records_and_names_the_file(tmp_path, capsys, form):
    """A run file whose end was cut (a full disk, a killed copy): its whole lines are read, the cut
    one is skipped with a warning naming the file, and compare goes on (no traceback). Mutation: a
    compressed file that reads as nothing, or cut short in silence, fails."""
    from optbench.gate import compare

    store = ResultStore(tmp_path)
    store.save("m", commit(1), [step(10.0)], run_id="r1")
    store.save("m", commit(2), [step(10.0)], run_id="r2")
    path = store.path("m", commit(2), "r2")
    if form == "plain":
        plain = path.with_name("r2.jsonl")
        plain.write_bytes(gzip.decompress(path.read_bytes()))
        path.unlink()
        path = plain
        path.write_text(path.read_text() + '{"key": "bench_step.Step100M|variant=fused-ce", "m')
    else:
        path.write_bytes(path.read_bytes()[:-4])  # the end of gzip's trailer
    assert [r.run_id for r in ResultStore(tmp_path).runs("m", commit(2))] == ["r2"]
    assert len(ResultStore(tmp_path).runs("m", commit(2))[0].results()) == 1
    assert str(path) in capsys.readouterr().err
    # runs without a GPU UUID are compared across GPUs, reported, never gated: nothing comparable
    assert compare.main([commit(1), commit(2), "--results", str(tmp_path)]) == 2
    assert "CROSS-GPU" in capsys.readouterr().out


def test_runs_are_written_compressed_and_a_plain_file_stays_plain(tmp_path):
    """A new run's file is gzip-compressed JSON lines, the same bytes for the same records; a plain
    file of an older store reads the same, and a later write of its run rewrites it in its own
    form: one file per run either way."""
    store = ResultStore(tmp_path)
    store.save("m", SHA, [step(10.0)], run_id="new")
    path = store.path("m", SHA, "new")
    assert path.name == "new.jsonl.gz"
    records = store.runs("m", SHA)[0].records
    assert gzip.decompress(path.read_bytes()).decode() == records_text(records.values())
    before = path.read_bytes()
    store.save("m", SHA, [step(10.0)], run_id="new")
    assert path.read_bytes() == before

    old = path.with_name("old.jsonl")
    old.write_text(records_text(records.values()))
    store = ResultStore(tmp_path)
    assert [r.records for r in store.runs("m", SHA)] == [records, records]
    store.save("m", SHA, [{**step(20.0), "key": "other"}], run_id="old")
    assert store.path("m", SHA, "old") == old
    assert sorted(p.name for p in path.parent.iterdir()) == ["new.jsonl.gz", "old.jsonl"]
    assert "other" in ResultStore(tmp_path).runs("m", SHA)[1].records


@pytest.mark.parametrize(
    "design",
    [
        {"lockstep": {"step": {"cpu": 3, "paired": True}}},
        {"checked_in": "20261126T000000Z-aaaaaa"},  # run without its check in the process
    ],
)
def test_records_of_abs_own_designs_are_kept_but_not_the_commits_figure(tmp_path, design):
    """Mutation: a run ab timed in lockstep (one CPU, in turns), or one whose process reused an
    earlier run's check (its memory differs), must not become a commit's figure, nor the
    stored-history comparison's: it is kept, and read only by ab's pairing."""
    from optbench.gate.compare import run_medians

    store, c = ResultStore(tmp_path), commit(1)
    key = "bench_step.Step100M|variant=eager"
    plain = record(
        "bench_step.Step100M", {"variant": "eager"}, times={"step": (None, samples(70.0, 1))}
    )
    paired = {**plain, **design}
    paired["metrics"] = {"step": {"wall": {**plain["metrics"]["step"]["wall"], "median_ms": 54.0}}}
    store.save("h100-sxm", c, [plain], run_id="20261126T000000Z-aaaaaa")
    store.save("h100-sxm", c, [paired], run_id="20261126T000100Z-bbbbbb")
    assert len(store.runs("h100-sxm", c)) == 2
    assert store.load("h100-sxm", c)[key]["metrics"]["step"]["wall"]["median_ms"] != 54.0
    assert [run_medians(r) != {} for r in store.runs("h100-sxm", c)] == [True, False]
    assert Record.of(paired).ab_design and not Record.of(plain).ab_design


def test_a_damaged_compressed_file_keeps_what_precedes_the_damage(tmp_path, capsys):
    """A byte flipped halfway through a compressed run file: the records before it are read, with a
    warning naming the file; a file of two gzip members reads both. Mutation: reading nothing on a
    decompression error, or the first member only, fails."""
    store = ResultStore(tmp_path)
    many = [{**step(10.0 + i), "key": f"bench_step.StepTiny|variant=v{i}"} for i in range(400)]
    store.save("m", SHA, many, run_id="r1")
    path = store.path("m", SHA, "r1")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    kept = ResultStore(tmp_path).runs("m", SHA)[0].results()
    assert 50 < len(kept) < 400 and "damaged" in capsys.readouterr().err

    text = records_text(many)
    half = text.index("\n", len(text) // 2) + 1
    path.write_bytes(gzip.compress(text[:half].encode()) + gzip.compress(text[half:].encode()))
    assert len(ResultStore(tmp_path).runs("m", SHA)[0].results()) == 400


def test_a_write_the_store_cannot_make_is_one_line_naming_the_file_and_leaves_all_as_it_was(
    tmp_path,
):
    """A file where the machine folder goes: saving a run raises CannotWrite (an OSError) whose
    message, one line, names the file it could not write; nothing else is written, and
    ``require_writable`` says the same of the folder, leaving nothing behind, where a missing
    folder under a writable one passes and is not made."""
    (tmp_path / "m").write_text("")
    store = ResultStore(tmp_path)
    with pytest.raises(CannotWrite) as raised:
        store.save("m", SHA, [step(50.0)], run_id="r1")
    message = str(raised.value)
    assert message.startswith(f"cannot write {store.path('m', SHA, 'r1')} (")
    assert "\n" not in message and isinstance(raised.value, OSError)
    with pytest.raises(CannotWrite) as raised:
        require_writable(tmp_path / "m" / "optbench")
    assert str(raised.value).startswith(f"cannot write {tmp_path / 'm' / 'optbench'} (")
    require_writable(tmp_path / "new" / "optbench")
    assert [p.name for p in tmp_path.iterdir()] == ["m"] and not (tmp_path / "m").read_text()
