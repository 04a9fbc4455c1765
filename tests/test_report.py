"""optbench.reporting (data, charts, site, headline) on a synthetic store in tmp_path (test data,
not measurements)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from synthetic_results import GPU, commit, record, report_store, samples, save

from models.variants import ABLATED, ABLATION, ADDED
from optbench.measure.hardware import lookup
from optbench.reporting import charts, convergence, dashboard, data, headline, hf_runs, memory, site
from optbench.store.records import NOT_MEASURED
from optbench.store.store import REPO_ROOT, ResultStore
from optbench.suite.catalog import ANCHOR_BENCHMARK

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return report_store(tmp_path_factory.mktemp("store") / "results")


@pytest.fixture
def asv_calls(monkeypatch) -> list[tuple[Path, Path]]:
    calls: list[tuple[Path, Path]] = []
    monkeypatch.setattr(site, "asv_publish", lambda results, html: calls.append((results, html)))
    return calls


@pytest.fixture(scope="module")
def published(store, tmp_path_factory) -> tuple[Path, list]:
    """optbench/ of the store published once (asv's publish replaced by a recorder), and the asv
    calls."""
    calls: list[tuple[Path, Path]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(site, "asv_publish", lambda results, html: calls.append((results, html)))
        return site.publish(store.root, tmp_path_factory.mktemp("html")).parent, calls


def images(page: Path) -> list[Path]:
    return [page.parent / src for src in re.findall(r'<img src="([^"]+)"', page.read_text())]


def test_publish_writes_index_and_chart_pages(store, published):
    out, calls = published
    [(results, stage)] = calls  # asv's site goes into the stage beside the trees, then in with them
    assert results == store.root and stage.parent == out.parent
    assert stage.name.startswith(site.STAGE_PREFIX) and not stage.exists()
    published = sorted(p.name for p in out.parent.iterdir() if not p.name.startswith("."))
    assert published == ["index.html", "optbench"]
    text = (out / "index.html").read_text()
    assert 'href="../asv/index.html"' in text
    for name in site.PAGES:
        page = out / f"{name}.html"
        assert f'href="{name}.html"' in text and page.exists()
        pngs = images(page)
        assert pngs, name
        for png in pngs:
            data = png.read_bytes()
            assert data.startswith(PNG) and len(data) > 1024, png


def test_each_machine_has_its_own_charts_and_emulated_is_labelled(published):
    out, _ = published
    speedup = (out / "speedup.html").read_text()
    assert "h100-sxm-emulating-t4 — t4 on NVIDIA H100 80GB HBM3 (emulated)</h2>" in speedup
    assert {p.name for p in images(out / "speedup.html")} == {
        "speedup-h100-sxm-0.png",
        "speedup-h100-sxm-emulating-t4-0.png",
        "speedup-cpu-host-0.png",
    }
    # the CPU machine has no device time, so no roofline; its steps are charted by wall clock
    roofline = (out / "roofline.html").read_text()
    assert roofline.index("cpu-host") < roofline.index("No kernel results")
    assert "roofline-cpu-host" not in roofline
    assert "Only one commit" in (out / "compare.html").read_text()  # the emulated machine


def test_runs_are_ordered_by_record_date(store):
    history = data.runs(store)
    assert list(history) == ["h100-sxm", "h100-sxm-emulating-t4", "cpu-host"]
    assert [r.commit for r in history["h100-sxm"]] == [commit(1), commit(2), commit(3)]


def test_mfu_uses_the_profile_peak(store):
    rec = data.steps(data.runs(store)["h100-sxm"][-1])["1B"]["best"]
    seconds = rec.timing("step", "wall").median_ms / 1e3
    assert data.mfu(rec, lookup("h100-sxm")) == pytest.approx(
        rec.flops["step"] / seconds / 989.4e12
    )
    assert data.tokens_per_s(rec) == pytest.approx(rec.info["tokens"] / seconds)
    assert data.mfu(rec, lookup("cpu")) is None


def test_compare_page_shows_the_regression(store, published, asv_calls, tmp_path):
    page = (published[0] / "compare.html").read_text()
    row = (
        r'<tr class="REGRESSION"><td>bench_kernels.RMSNorm</td>'
        r"<td>shape=16384x4096 impl=triton</td>"
    )
    assert re.search(row, page)
    out = site.publish(store.root, tmp_path / "html", (commit(1)[:8], commit(2)[:8])).parent
    page = (out / "compare.html").read_text()
    assert 'class="REGRESSION"' not in page and f"{commit(1)[:12]} → {commit(2)[:12]}" in page


def test_the_compare_page_leads_with_one_gpu_and_counts_cross_gpu_moves(tmp_path):
    """Mutation: commits measured on two GPUs listed row by row, a page of moves the gate never
    judges. They are counted in its sentence instead."""
    from synthetic_results import record, samples, save

    def kernel(ms: float) -> list[dict]:
        shape = {"shape": "16384x4096", "impl": "triton"}
        return [record("bench_kernels.RMSNorm", shape, times={"fwd": (samples(ms, 1), None)})]

    store = ResultStore(tmp_path / "results")
    save(store, "h100-sxm", commit(1), "2025-01-01T00:00:00+00:00", kernel(1.0))
    save(store, "h100-sxm", commit(2), "2025-01-02T00:00:00+00:00", kernel(1.69), gpu_uuid="GPU-2")
    page = "".join(map(str, site.compare_parts(store, None, data.runs(store)["h100-sxm"])))
    assert "<table" not in page and "1 difference beyond the threshold between runs" in page


def test_compare_page_counts_host_bound_moves_on_a_gpu_and_lists_none(tmp_path):
    """Mutation: a graphed step's eager forward (host-bound: ab decides it) moving 35% between two
    single runs on one GPU, listed as the page's first table, leads with what the gate never
    judges."""

    def step(ms: float) -> list[dict]:
        times = {"forward": (None, samples(ms, 1))}
        params = {"variant": "best-kernels"}
        info = {"primary_clock": "wall"}
        return [record("bench_step.Step100M", params, times=times, info=info)]

    store = ResultStore(tmp_path / "results")
    save(store, "h100-sxm", commit(1), "2025-01-01T00:00:00+00:00", step(11.0))
    save(store, "h100-sxm", commit(2), "2025-01-02T00:00:00+00:00", step(15.0))
    page = "".join(map(str, site.compare_parts(store, None, data.runs(store)["h100-sxm"])))
    assert "<table" not in page and "1 host-bound time moved beyond the threshold" in page


def test_headline_table(store):
    table = headline.headline_table(store)
    assert "h100-sxm — NVIDIA H100" in table and "emulated" not in table and "cpu-host" not in table
    newest = data.runs(store)["h100-sxm"][-1]
    step = data.steps(newest)["100M"]
    best = data.step_ms(step["eager"]) / data.step_ms(step["best"])
    assert "| optimization | 100M @ `fffffff3` | 1B @ `fffffff3` |" in table
    ms = data.step_ms(step["best"])
    assert re.search(
        rf"\| best vs eager \| {best:.2f}× \({ms:.1f} ms\) \| [\d.]+× \([\d.]+ ms\) \|", table
    )
    eager_ms, eager_iqr = data.step_ms(step["eager"]), data.step_iqr_ms(step["eager"])
    assert f"| eager (ms per step [IQR]) | {eager_ms:.1f} ms [{eager_iqr:.1f}] |" in table
    for row in ("| triton-norm vs eager |", "| RMSNorm | triton |", "| GradStats | foreach |"):
        assert row in table
    assert f"`{commit(3)[:12]}` (2025-01-03T12:30:00+00:00)" in table  # its latest run
    assert "StepTiny" not in table and "| tiny @" in headline.headline_table(store, "cpu-host")


def test_a_later_partial_run_does_not_hide_a_fuller_one(tmp_path):
    """Commit 1 measured every 1B variant, commit 2 (later) two of them: the 1B column stays at
    commit 1; commit 3 (later still) measured as many as commit 1: it takes over."""
    from synthetic_results import STEP_SIZES, _steps, save

    store = ResultStore(tmp_path / "results")
    sizes = {"1B": STEP_SIZES["1B"]}
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", _steps(1, True, sizes))
    partial = [r for r in _steps(2, True, sizes) if r["params"]["variant"] in ("eager", "best")]
    save(store, "h100-sxm", commit(2), "2025-01-02T12:00:00+00:00", partial)
    assert "| 1B @ `fffffff1` |" in headline.headline_table(store)
    save(store, "h100-sxm", commit(3), "2025-01-03T12:00:00+00:00", _steps(3, True, sizes))
    assert "| 1B @ `fffffff3` |" in headline.headline_table(store)


def test_a_size_measured_by_shards_that_shared_the_host_says_so(tmp_path):
    """Shards of ``run --gpus`` (``runs_at_once`` 4 in their machine record) share the host's CPUs,
    and its host-bound steps read slower than alone: the size's column says how many runs shared
    it; a run measured alone says nothing."""
    from synthetic_results import STEP_SIZES, _steps, save

    store = ResultStore(tmp_path / "results")
    sizes = {"1B": STEP_SIZES["1B"]}
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", _steps(1, True, sizes))
    assert "| 1B @ `fffffff1` |" in headline.headline_table(store)
    records = _steps(2, True, sizes)
    save(store, "h100-sxm", commit(2), "2025-01-02T12:00:00+00:00", records, runs_at_once=4)
    assert "| 1B @ `fffffff2`, 4 runs at once |" in headline.headline_table(store)


def test_a_step_that_ran_and_failed_shows_its_status_and_one_not_run_a_dash(tmp_path):
    """A variant that ran and did not end ok (wrong, oom) shows its status in its column, also
    where it ended ok at no size; one that did not run there a dash (skipped, interrupted, or left
    unmeasured after its grid lost the CUDA context), and no row where it ran nowhere (mutations:
    a failure shown as a dash; a skip, an interrupt or an unmeasured case shown as its status)."""
    from synthetic_results import STEP_SIZES, _steps, record, save

    store = ResultStore(tmp_path / "results")
    ok = [r for r in _steps(1, True, STEP_SIZES) if r["params"]["variant"] in ("eager", "best")]
    failed = [
        record("bench_step.Step100M", {"variant": "triton-norm"}),
        record("bench_step.Step1B", {"variant": "triton-norm"}, status="wrong"),
        record("bench_step.Step100M", {"variant": "fused-ce"}, status="oom"),
        record("bench_step.Step1B", {"variant": "fused-ce"}, status="interrupted"),
        record("bench_step.Step100M", {"variant": "best-kernels"}, status="skipped"),
        record("bench_step.Step1B", {"variant": "best-kernels"}, status="skipped"),
        record("bench_step.Step100M", {"variant": "compile-default"}, status="crashed"),
        record("bench_step.Step1B", {"variant": "compile-default"}, status="crashed"),
    ]
    failed[-1]["reason"] = f"{NOT_MEASURED}: the CUDA context was lost in an earlier case"
    failed[0] = next(r for r in _steps(1, True, STEP_SIZES) if r["key"] == failed[0]["key"])
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", ok + failed)
    rows = {
        line.split(" |")[0]: line.split("|")[2:4]
        for line in headline.headline_table(store).splitlines()
        if line.startswith("| ")
    }
    assert rows["| triton-norm vs eager"][1].strip() == "wrong"
    assert [cell.strip() for cell in rows["| fused-ce vs eager"]] == ["oom", "–"]
    assert "| best-kernels vs eager" not in rows
    assert [cell.strip() for cell in rows["| compile-default vs eager"]] == ["crashed", "–"]


def test_a_later_run_of_fewer_kernel_shapes_does_not_hide_a_fuller_one(tmp_path):
    """A quick run (every implementation, one shape per kernel) after a full one: the kernel rows
    stay at the full run, which measured more shapes."""
    from synthetic_results import _kernels, save

    store = ResultStore(tmp_path / "results")
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", _kernels(1))
    quick = [r for r in _kernels(2) if r["params"]["shape"] in ("16384x768", "skipped")]
    save(store, "h100-sxm", commit(2), "2025-01-02T12:00:00+00:00", quick)
    rms = [
        line
        for line in headline.headline_table(store).splitlines()
        if line.startswith("| RMSNorm |")
    ]
    assert rms and all(line.endswith("| `fffffff1` |") for line in rms)


def test_speedups_of_a_commit_in_shards_set_each_figure_beside_its_own_runs_reference(tmp_path):
    """Commit 2 ran in two shards on two GPUs: the first holds eager, best and the kernels' eager
    implementations; the second, later, on a GPU twice as slow, eager, triton-norm and the other
    kernel implementations but RMSNorm's triton (in the first); a third fused-ce alone. A speedup
    takes the reference of its own run: best's is the first shard's eager, not the later one;
    triton-norm's the second's; fused-ce has none (n/a), nor has any kernel but RMSNorm's triton.
    The step table stays at commit 1, whose run measured as many variants (4) but more pairs."""
    from synthetic_results import STEP_SIZES, _kernels, _steps, save, slower

    store = ResultStore(tmp_path / "results")
    sizes = {"100M": STEP_SIZES["100M"]}
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", _steps(1, True, sizes))
    steps2, kernels2 = _steps(2, True, sizes), _kernels(2)
    first = [r for r in steps2 if r["params"]["variant"] in ("eager", "best")]
    baseline = ("eager", "loop")  # GradStats' is a loop
    rmsnorm = ("bench_kernels.RMSNorm", "triton")
    beside = [
        r
        for r in kernels2
        if r["params"]["impl"] in baseline or (r["benchmark"], r["params"]["impl"]) == rmsnorm
    ]
    first += beside
    second = [r for r in steps2 if r["params"]["variant"] in ("eager", "triton-norm")]
    second = [*slower(second, 2.0), *(r for r in kernels2 if r not in beside)]
    save(store, "h100-sxm", commit(2), "2025-01-02T12:00:00+00:00", first, gpu_uuid="GPU-a")
    save(store, "h100-sxm", commit(2), "2025-01-02T12:00:01+00:00", second, gpu_uuid="GPU-b")
    third = [r for r in steps2 if r["params"]["variant"] == "fused-ce"]
    save(store, "h100-sxm", commit(2), "2025-01-02T12:00:02+00:00", third, gpu_uuid="GPU-c")
    run = data.runs(store)["h100-sxm"][-1]
    by_v = data.steps(run)["100M"]
    assert by_v["eager"].date == "2025-01-02T12:00:01+00:00"  # the latest eager
    eager_of_best = run.beside(by_v["best"], variant="eager")
    assert eager_of_best.date == "2025-01-02T12:00:00+00:00"
    speedups = data.step_speedups(run)["100M"]
    assert speedups["best"] == data.step_ms(eager_of_best) / data.step_ms(by_v["best"])
    eager_of_norm = run.beside(by_v["triton-norm"], variant="eager")
    norm = by_v["triton-norm"]
    assert speedups["triton-norm"] == data.step_ms(eager_of_norm) / data.step_ms(norm)
    assert eager_of_norm.date == "2025-01-02T12:00:01+00:00" and speedups["fused-ce"] is None
    assert list(data.kernel_speedups(run)) == ["RMSNorm"]  # the one kernel beside its eager
    assert list(data.kernel_speedups(run)["RMSNorm"]) == ["triton"]
    assert sorted(data.paired_steps(run)["100M"]) == ["best", "eager", "triton-norm"]
    assert "| 100M @ `fffffff1` |" in headline.headline_table(store)


def _distributed(
    variant: str, world: int, ms: float, efficiency: float | None, comm: list | None = None
) -> dict:
    tokens = 8192
    return record(
        "bench_distributed.DistributedStep1B",
        {"variant": variant, "world_size": str(world)},
        times={"step": (None, samples(ms, world))},
        info={
            "tokens": tokens,
            "tokens_per_s_per_gpu": tokens / (ms / 1e3),
            "scaling_efficiency": efficiency,
            "communication": comm,
            "slowest_rank": 1 if comm else 0,
        },
    )


def test_the_scaling_table_shows_each_variant_and_world_size_of_its_fullest_run(tmp_path):
    """Multi-GPU steps: per variant, the run with the most world sizes; ms per step, tokens/s per
    GPU and the efficiency the run recorded (n/a where it had no 1-GPU figure), a row per size."""
    store = ResultStore(tmp_path / "results")
    full = [_distributed("ddp", 1, 200.0, 1.0), _distributed("ddp", 2, 210.0, 0.95)]
    # the slowest rank (1) waited 4 of its 10 ms of collectives
    comm = [
        {"exposed_ms": 1.0, "communication_ms": 9.0},
        {"exposed_ms": 4.0, "communication_ms": 10.0},
    ]
    full += [_distributed("ddp", 4, 220.0, 0.9, comm), _distributed("fsdp2", 2, 300.0, None)]
    save(store, "h200", commit(1), "2025-01-01T12:00:00+00:00", full)
    later = [_distributed("ddp", 2, 400.0, 0.5)]  # fewer world sizes: does not hide commit 1's
    save(store, "h200", commit(2), "2025-01-02T12:00:00+00:00", later)
    table = headline.headline_table(store)
    rows = [line for line in table.splitlines() if line.startswith(("| ddp |", "| fsdp2 |"))]
    ms = [float(line.split("|")[3]) for line in rows]
    assert [line.split("|")[1:3] for line in rows] == [
        [" ddp ", " 1 "],
        [" ddp ", " 2 "],
        [" ddp ", " 4 "],
        [" fsdp2 ", " 2 "],
    ]
    assert ms == pytest.approx([200.0, 210.0, 220.0, 300.0], rel=0.02)
    assert "| 95.0% | n/a | `fffffff1` |" in rows[1] and "| n/a | n/a |" in rows[3]
    assert "| 90.0% | 4.0 / 10.0 |" in rows[2]


def test_the_headline_page_is_written_whole(store, tmp_path):
    page = tmp_path / "results.md"
    page.write_text("old figures\n")
    headline.write_headline(page, store)
    text = page.read_text()
    assert (
        text.startswith("# Headline figures\n")
        and "**h100-sxm" in text
        and "old figures" not in text
    )


def _tree(root: Path) -> dict[str, bytes]:
    """The published files under ``root`` (not the report's cache), by path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.relative_to(root).parts[0] == ".cache"
    }


def _forget(html: Path) -> None:
    """Drop the report's cache: the next publish makes every page again."""
    shutil.rmtree(html / site.CACHE)


def _fake_asv(results: Path, html: Path) -> None:
    (html / "asv").mkdir()
    (html / "asv" / "index.html").write_text(f"asv of {results}")


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_swap_in_puts_the_new_tree_whole_where_the_old_one_was(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(site, "_rename_exchange", lambda new, target: False)
    stage, target = tmp_path / f"{site.STAGE_PREFIX}x", tmp_path / "optbench"
    for tree, text in ((stage / "optbench", "new"), (target, "old")):
        (tree / "sub").mkdir(parents=True)
        (tree / "sub" / "page.html").write_text(text)
    (target / "gone.png").write_text("old")
    site.swap_in(stage / "optbench", target)
    assert _tree(target) == {"sub/page.html": b"new"}
    assert {p.name for p in stage.iterdir()} == {"optbench" if exchange else "optbench.old"}
    (tmp_path / "first").mkdir()
    site.swap_in(tmp_path / "first", tmp_path / "none")  # nothing there yet: a plain rename
    assert (tmp_path / "none").is_dir() and not (tmp_path / "first").exists()


def test_a_publish_that_fails_midway_leaves_the_previous_pages_byte_identical(
    store, tmp_path, monkeypatch
):
    """A publish that raises while it writes optbench's pages, or between swapping asv's tree in and
    optbench's, leaves what it had not swapped in byte for byte as the previous publish left it, and
    no stage behind; the next publish replaces every tree whole."""
    monkeypatch.setattr(site, "asv_publish", _fake_asv)
    html = tmp_path / "html"
    site.publish(store.root, html)
    before = _tree(html)
    assert "optbench/history.html" in before and "asv/index.html" in before

    def fail(*args, **kwargs):
        raise RuntimeError("killed midway")

    _forget(html)
    with monkeypatch.context() as mp:  # while the pages are written: after the first, at history
        written = site.write_page
        mp.setattr(
            site,
            "write_page",
            lambda out, name, *a: fail() if name == "history" else written(out, name, *a),
        )
        with pytest.raises(RuntimeError, match="killed midway"):
            site.publish(store.root, html)
    assert _tree(html) == before and not list(html.glob(f"{site.STAGE_PREFIX}*"))

    swapped = site.swap_in
    with monkeypatch.context() as mp:  # asv's tree is in, optbench's not yet
        mp.setattr(
            site,
            "swap_in",
            lambda new, target: fail() if target.name == "optbench" else swapped(new, target),
        )
        with pytest.raises(RuntimeError, match="killed midway"):
            site.publish(store.root, html)
    after = _tree(html)
    assert {k: v for k, v in after.items() if k.startswith("optbench/")} == {
        k: v for k, v in before.items() if k.startswith("optbench/")
    }
    assert after["asv/index.html"] == before["asv/index.html"]
    assert not list(html.glob(f"{site.STAGE_PREFIX}*"))
    (html / "optbench" / "stale.png").write_bytes(b"old")
    site.publish(store.root, html)
    assert not (html / "optbench" / "stale.png").exists() and set(_tree(html)) == set(before)


@pytest.mark.slow
def test_a_publish_killed_midway_leaves_the_previous_pages_whole(store, tmp_path):
    """SIGKILL to a real publish while it writes its pages (each page slowed down): the previous
    pages are as they were, byte for byte."""
    html = tmp_path / "html"
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from optbench.reporting import site
        site.asv_publish = lambda results, html: None
        written = site.write_page
        def slow(out, name, *args):
            written(out, name, *args)
            Path({str(tmp_path / "page")!r}).write_text(name)
            if sys.argv[1] == "slow":
                time.sleep(600)
        site.write_page = slow
        site.publish({str(store.root)!r}, {str(html)!r})
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-c", script, "fast"], env=env, check=True, timeout=300)
    before = _tree(html)
    (tmp_path / "page").unlink()
    _forget(html)
    proc = subprocess.Popen([sys.executable, "-c", script, "slow"], env=env)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "page").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "page").exists()
    finally:
        proc.kill()
        proc.wait()
    assert {k: v for k, v in _tree(html).items() if not k.startswith(site.STAGE_PREFIX)} == before


def test_asv_publish_skips_a_foreign_results_dir(tmp_path):
    said = site.asv_publish(tmp_path / "results", tmp_path / "html")
    assert said and said.startswith("skipped: asv reads asv.conf.json's results_dir")


def test_main_with_an_empty_store_still_writes_the_index(asv_calls, tmp_path):
    assert site.main(["--results", str(tmp_path / "none"), "--html", str(tmp_path / "html")]) == 0
    assert "No optbench results" in (tmp_path / "html" / "optbench" / "speedup.html").read_text()


def _step(benchmark: str, variant: str, ms: float, seed: int) -> dict:
    return record(
        benchmark,
        {"variant": variant},
        times={"step": (None, samples(ms, seed))},
        info={"tokens": 8192, "primary_clock": "wall"},
    )


def test_speedups_divide_by_each_variants_own_reference(tmp_path):
    """cuda-graph against graph-prereqs and triton-rope against fused-proj, measured in the same
    run; n/a (never a ratio to eager) where the reference was not measured (qknorm) or is unknown (a
    retired variant)."""
    times = {
        "eager": 100.0,
        "graph-prereqs": 80.0,
        "cuda-graph": 60.0,
        "fused-proj": 90.0,
        "triton-rope": 85.0,
        "triton-qknorm": 95.0,
        "retired-variant": 70.0,
        "best-kernels": 40.0,
    }
    store = ResultStore(tmp_path / "results")
    save(
        store,
        "h100-sxm",
        commit(1),
        "2025-01-01T12:00:00+00:00",
        [_step("bench_step.Step500M", v, ms, i) for i, (v, ms) in enumerate(times.items())],
    )
    run = data.runs(store)["h100-sxm"][-1]
    ms = {v: data.step_ms(rec) for v, rec in data.steps(run)["500M"].items()}
    speedups = data.step_speedups(run)["500M"]
    assert speedups["cuda-graph"] == pytest.approx(ms["graph-prereqs"] / ms["cuda-graph"])
    assert speedups["triton-rope"] == pytest.approx(ms["fused-proj"] / ms["triton-rope"])
    assert speedups["graph-prereqs"] == pytest.approx(ms["eager"] / ms["graph-prereqs"])
    assert speedups["best-kernels"] == pytest.approx(ms["eager"] / ms["best-kernels"])
    assert (
        speedups["triton-qknorm"] is None
        and speedups["retired-variant"] is None
        and "eager" not in speedups
    )
    table = headline.headline_table(store)
    assert (
        f"| cuda-graph vs graph-prereqs | {speedups['cuda-graph']:.2f}× ({ms['cuda-graph']:.1f} "
        "ms) |" in table
    )
    assert f"| triton-qknorm vs qknorm | n/a ({ms['triton-qknorm']:.1f} ms) |" in table
    assert "| retired-variant vs ? | n/a (" in table
    assert table.index("| eager (ms per step [IQR]) |") < table.index("| graph-prereqs vs eager |")
    history = data.runs(store)["h100-sxm"]
    assert set(data.named_speedups(run)["500M"]) >= {
        "cuda-graph vs graph-prereqs",
        "triton-qknorm vs qknorm",
    }
    assert site.speedup_parts(history)[0].png().startswith(PNG)  # the chart draws n/a as no bar


def _ablation_store(root, missing: str) -> ResultStore:
    """One run of the 100M ablation grid: eager 100 ms, best-kernels 40 ms, the i-th switch left out
    40 + 2i ms; ``missing`` not measured; plus a Step100M grid."""
    times = {
        "eager": 100.0,
        ABLATED: 40.0,
        **{v: 40.0 + 2 * i for i, v in enumerate(ABLATION, 1)},
        **dict.fromkeys(ADDED, 32.0),
    }
    records = [
        _step("bench_step.Ablation100M", v, ms, i)
        for i, (v, ms) in enumerate(times.items())
        if v != missing
    ]
    records += [
        _step("bench_step.Step100M", "eager", 100.0, 50),
        _step("bench_step.Step100M", ABLATED, 41.0, 51),
    ]
    store = ResultStore(root)
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", records)
    return store


def test_ablation_table(tmp_path):
    missing = f"{ABLATED}-without-triton-norm"
    store = _ablation_store(tmp_path / "results", missing)
    run = data.runs(store)["h100-sxm"][-1]
    # not a size 'Ablation100M'
    assert list(data.steps(run)) == ["100M"] and list(data.ablations(run)) == ["100M"]
    by_variant = data.ablations(run)["100M"]
    rows = {row[0]: row[1:] for row in data.ablation_rows(run, by_variant)}
    best = by_variant[ABLATED]
    assert rows[f"{ABLATED} (every switch)"] == [
        f"{data.step_ms(best):.1f} [{data.step_iqr_ms(best):.1f}]",
        "—",
    ]
    without = by_variant[f"{ABLATED}-without-fused-proj"]
    worth = data.step_ms(without) / data.step_ms(best)
    assert worth > 1
    assert rows["without fused-proj; also without triton-rope, which needs it"] == [
        f"{data.step_ms(without):.1f} [{data.step_iqr_ms(without):.1f}]",
        f"{worth:.2f}×",
    ]
    assert rows["without triton-norm"] == ["not measured", "n/a"]
    eager = data.step_ms(by_variant["eager"]) / data.step_ms(best)
    assert rows["eager (no switch)"][1] == f"{eager:.2f}×"
    fp8 = by_variant[ADDED[0]]  # 32 ms against best-kernels' 40: worth 1.25x, best over it
    assert rows["with fp8-tensorwise"] == [
        f"{data.step_ms(fp8):.1f} [{data.step_iqr_ms(fp8):.1f}]",
        f"{data.step_ms(best) / data.step_ms(fp8):.2f}×",
    ]
    assert len(rows) == len(ABLATION) + 2 + len(ADDED)
    table = headline.headline_table(store)
    assert f"Leave-one-out ablation of {ABLATED} at 100M @ `{commit(1)[:8]}`" in table
    assert (
        "| without fused-proj; also without triton-rope, which needs it | "
        f"{data.step_ms(without):.1f} [" in table
    )
    parts = site.speedup_parts(data.runs(store)["h100-sxm"])
    html = "".join(p for p in parts if isinstance(p, str))
    assert f"Leave-one-out ablation of {ABLATED}" in html
    assert "<td>without triton-norm</td><td>not measured</td>" in html


def test_ablation_needs_best_kernels_in_the_same_run(tmp_path):
    store = _ablation_store(tmp_path / "results", ABLATED)
    run = data.runs(store)["h100-sxm"][-1]
    rows = data.ablation_rows(run, data.ablations(run)["100M"])
    assert rows[0][1:] == ["not measured", "n/a"] and all(row[2] == "n/a" for row in rows[1:])


def test_an_emulated_run_reports_no_mfu_and_no_roofline_fraction(store, published):
    """An emulated T4 run's times are the H100's: MFU and time / floor against the T4's peaks are
    n/a."""
    emulated = data.runs(store)["h100-sxm-emulating-t4"]
    assert data.peak_profile(emulated[-1]) is None and data.peak_profile(
        data.runs(store)["h100-sxm"][-1]
    )
    assert data.floor_ratios(emulated[-1]) == {}
    parts = site.throughput_parts(emulated)
    assert len(parts) == 2 and "n/a: this run emulated t4" in parts[1] and "MFU" in parts[1]
    assert site.roofline_parts(emulated) == [site.emulated_note(emulated[-1], "roofline fraction")]
    out, _ = published
    for page in ("throughput", "roofline"):
        text = (out / f"{page}.html").read_text()
        section = text[text.index("h100-sxm-emulating-t4") : text.index("cpu-host")]
        assert "n/a: this run emulated t4 on NVIDIA H100" in section, page
    assert not any(
        "roofline-h100-sxm-emulating-t4" in p.name for p in images(out / "roofline.html")
    )


def _floor_run(
    tmp_path,
    cold_ratios: dict[str, float],
    fits_l2: bool | None = True,
    device_clock: bool = True,
    warm: bool = True,
) -> list:
    """An H100 run of RMSNorm 8192x768 fwd with cold-L2 device times at the given multiples of its
    HBM floor (warm: half of each, unless not ``warm``), per implementation; records from before
    cold-L2 timing (no ``info.device_clock``) unless ``device_clock``."""
    from synthetic_results import record, save, timing

    moved = 2.0 * 8192 * 768 * 2
    floor_ms = moved / 3350e9 * 1e3  # the h100-sxm profile's bandwidth
    records = []
    for impl, ratio in cold_ratios.items():
        rec = record(
            "bench_kernels.RMSNorm",
            {"shape": "8192x768", "impl": impl},
            times={"fwd": ([ratio * floor_ms] * 5, [0.1] * 5)},
            flops={"fwd": 1.0},
            bytes_={"fwd": moved},
            info={
                "dtype": "torch.bfloat16",
                **({"device_clock": "cold-l2"} if device_clock else {}),
                **({} if fits_l2 is None else {"fits_l2": fits_l2}),
            },
        )
        if warm:
            rec["metrics"]["fwd"]["device_warm"] = timing([ratio * floor_ms / 2] * 5)
        records.append(rec)
    store = ResultStore(tmp_path / "results")
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", records)
    return data.runs(store)["h100-sxm"]


def test_a_cold_time_at_or_under_its_floor_is_a_measurement_problem_not_a_bar(tmp_path):
    history = _floor_run(tmp_path, {"eager": 2.0, "triton": 0.8, "liger": 1.0})
    ratios = data.floor_ratios(history[-1])["RMSNorm fwd"]["8192x768"]
    assert ratios["eager"].cold == pytest.approx(2.0) and ratios["eager"].warm == pytest.approx(1.0)
    assert ratios["eager"].fits_l2 is True
    assert [r.suspect for r in ratios.values()] == [False, True, True]
    chart, text, table = site.roofline_parts(history)
    fig = chart.figure()
    assert "Measurement problems: 2 cold-L2 device times" in text
    assert (
        "<td>triton</td><td>0.80×</td><td>yes</td>" in table
        and "<td>liger</td><td>1.00×</td>" in table
    )
    assert "eager" not in table
    (ax,) = fig.axes
    bars = [p.get_height() for p in ax.patches if math.isfinite(p.get_height())]
    assert bars == [pytest.approx(2.0)]  # only the case above its floor is drawn as a bar
    crosses = [line for line in ax.lines if line.get_marker() == "x"]
    # the two problems, at 1x
    assert [y for line in crosses for y in line.get_ydata()] == [1.0, 1.0]
    assert "cold ≤ floor: measurement problem" in [
        t.get_text() for t in ax.get_legend().get_texts()
    ]
    warm = sorted(y for line in ax.lines if line.get_marker() == "_" for y in line.get_ydata())
    assert warm == pytest.approx([0.4, 0.5, 1.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8192x768\nfits L2"]


def test_kernel_records_from_before_cold_l2_timing_are_not_shown(tmp_path):
    history = _floor_run(tmp_path, {"eager": 3.0}, device_clock=False)
    assert data.kernels(history[-1]) == {} and data.floor_ratios(history[-1]) == {}


def test_a_roofline_without_problems_has_no_list_and_old_records_have_no_warm_figure(tmp_path):
    history = _floor_run(tmp_path, {"eager": 3.0}, fits_l2=None, warm=False)
    ratio = data.floor_ratios(history[-1])["RMSNorm fwd"]["8192x768"]["eager"]
    assert ratio.warm is None and ratio.fits_l2 is None and not ratio.suspect
    (chart,) = site.roofline_parts(history)
    assert [t.get_text() for t in chart.figure().axes[0].get_xticklabels()] == ["8192x768"]


def test_a_speedup_needs_its_reference_from_the_same_run(tmp_path):
    """A rerun of one variant (an ab round after a full run) gives no ratio against the reference
    of an earlier run of the commit: the pair comes from the run that measured both, its ms too.
    Where no run measured both, n/a."""
    from synthetic_results import record, samples, save

    def step(variant: str, ms: float) -> dict:
        return record(
            "bench_step.Step100M",
            {"variant": variant},
            times={"step": (None, samples(ms, 1))},
            info={"primary_clock": "wall"},
        )

    store = ResultStore(tmp_path / "results")
    save(
        store,
        "h100-sxm",
        commit(1),
        "2025-01-01T12:00:00+00:00",
        [step("eager", 100.0), step("fused-ce", 90.0)],
    )
    assert data.step_speedups(data.runs(store)["h100-sxm"][-1])["100M"][
        "fused-ce"
    ] == pytest.approx(1.11, 0.02)
    save(store, "h100-sxm", commit(1), "2025-01-02T12:00:00+00:00", [step("fused-ce", 50.0)])
    run = data.runs(store)["h100-sxm"][-1]
    latest = run.records["bench_step.Step100M|variant=fused-ce"]
    assert data.step_ms(latest) == pytest.approx(50, 0.02)
    rec, x = data.step_pairs(run)["100M"]["fused-ce"]
    assert x == pytest.approx(1.11, 0.02) and data.step_ms(rec) == pytest.approx(90, 0.02)
    save(store, "h100-sxm", commit(2), "2025-01-03T12:00:00+00:00", [step("eager", 100.0)])
    save(store, "h100-sxm", commit(2), "2025-01-04T12:00:00+00:00", [step("fused-ce", 50.0)])
    assert data.step_speedups(data.runs(store)["h100-sxm"][-1])["100M"]["fused-ce"] is None


# 1.3x slower at commit 3 (synthetic_results)
PLANTED = "bench_kernels.RMSNorm|shape=16384x4096|impl=triton"


def test_history_marks_the_planted_regression_with_the_gates_verdict(store):
    found = {(s.key, s.metric, s.clock): s for s in data.time_histories(store, "h100-sxm")}
    planted = found[PLANTED, "fwd", "device"]
    assert [p.commit for p in planted.commits] == [commit(1), commit(2), commit(3)]
    assert [p.verdict for p in planted.commits] == ["", "", "REGRESSION"]
    assert planted.commits[2].ratio == pytest.approx(1.3, rel=0.05)
    rec = data.runs(store)["h100-sxm"][-1].records[PLANTED]
    run = planted.commits[2].runs[-1]  # each run per commit, its median and quartiles as stored
    assert (run.median_ms, run.q25_ms, run.q75_ms) == (
        rec.timing("fwd", "device").median_ms,
        rec.timing("fwd", "device").q25_ms,
        rec.timing("fwd", "device").q75_ms,
    )
    flagged = {(s.key, s.metric, p.commit) for s in found.values() for p in s.flagged}
    assert flagged == {(PLANTED, "fwd", commit(3)), (PLANTED, "fwdbwd", commit(3))}
    # a step's primary clock is its wall time
    steps = found["bench_step.Step100M|variant=best", "step", "wall"]
    assert len(steps.commits) == 3 and not steps.flagged
    assert not data.time_histories(store, "h100-sxm-emulating-t4")  # one commit: no history


def test_history_chart_draws_each_run_and_bands_the_verdict(store):
    from matplotlib.colors import to_rgba

    series = [s for s in data.time_histories(store, "h100-sxm") if s.key == PLANTED]
    fig = charts.history_grid("t", series, [commit(1), commit(2), commit(3)])
    ax = next(
        ax for ax in fig.axes if ax.get_title() == "shape=16384x4096 impl=triton fwd (device)"
    )
    points = ax.containers[0].lines[0]  # the error bar's markers: each run's median
    assert list(points.get_xdata()) == pytest.approx([-0.15, 0.15, 0.85, 1.15, 1.85, 2.15])
    assert list(points.get_ydata()) == [r.median_ms for p in series[0].commits for r in p.runs]
    (band,) = ax.patches
    assert band.get_facecolor() == to_rgba("tab:red", 0.2) and band.get_x() == pytest.approx(1.6)
    assert [t.get_text() for t in ax.texts] == [f"{series[0].commits[2].ratio - 1:+.0%}"]


def test_history_page_lists_the_flagged_change_and_writes_its_charts(published):
    out, _ = published
    page = (out / "history.html").read_text()
    row = (
        f'<tr class="REGRESSION"><td>{commit(3)[:12]}</td><td>bench_kernels.RMSNorm</td>'
        "<td>shape=16384x4096 impl=triton fwd (device)</td>"
    )
    assert row in page
    section = page[: page.index("h100-sxm-emulating-t4")]
    pngs = [p for p in images(out / "history.html") if p.name.startswith("history-h100-sxm-")]
    # the metrics that changed, before the table of the gate's verdicts; then a chart per benchmark
    assert section.index(pngs[0].name) < section.index(row)
    assert len(pngs) == 1 + section.count("<h3>bench_")
    assert all(p.read_bytes().startswith(PNG) for p in pngs)


@pytest.mark.parametrize(
    ("size", "verdicts"),
    [
        ("1B", ["", "", "REGRESSION", "improvement"]),
        ("100M", ["", "", "", ""]),  # host-bound on a GPU: a trend, not the gate's (HOST_BOUND)
    ],
)
def test_history_of_several_runs_per_commit(tmp_path, size, verdicts):
    """Four commits of three runs each (1% run-to-run jitter); 'best' 20% slower at commit 3 only:
    at 1B (device-bound) a regression there, an improvement at commit 4, nothing else; at 100M
    (host-bound) nothing flagged."""
    import random

    store = ResultStore(tmp_path / "results")
    for n in (1, 2, 3, 4):
        for r in range(3):
            jitter = 1 + random.Random(10 * n + r).gauss(0, 0.01)
            records = [
                _step(
                    f"bench_step.Step{size}",
                    v,
                    ms * jitter * (1.2 if (n, v) == (3, "best") else 1),
                    n + r,
                )
                for v, ms in (("eager", 100.0), ("best", 50.0))
            ]
            save(store, "h100-sxm", commit(n), f"2025-01-0{n}T1{r}:00:00+00:00", records)
    found = {s.key: s for s in data.time_histories(store, "h100-sxm")}
    best, eager = (
        found[f"bench_step.Step{size}|variant=best"],
        found[f"bench_step.Step{size}|variant=eager"],
    )
    assert [len(p.runs) for p in best.commits] == [3, 3, 3, 3]
    assert [p.verdict for p in best.commits] == verdicts
    assert not eager.flagged


STEP_BEST = "bench_step.Step100M|variant=best"
GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def change_point_store(root: Path) -> ResultStore:
    """16 commits of one GPU, 'best' 20% slower from commit 9 on; at each commit a second run on a
    GPU that recorded no UUID, twice as slow, which joins no change-point series."""
    store = ResultStore(root)
    for n in range(1, 17):
        date = f"2025-01-{n:02d}T12:00:00+00:00"
        ms = 50.0 * (1.2 if n >= 9 else 1.0)
        save(
            store,
            "h100-sxm",
            commit(n),
            date,
            [_step("bench_step.Step100M", "best", ms, n)],
            gpu_uuid=GPU_A,
        )
        save(
            store,
            "h100-sxm",
            commit(n),
            date.replace("T12", "T13"),
            [_step("bench_step.Step100M", "best", 100.0, 100 + n)],
            gpu_uuid=None,
        )
    return store


def test_history_finds_the_planted_change_point_on_its_gpu(tmp_path):
    store = change_point_store(tmp_path / "results")
    (series,) = data.time_histories(store, "h100-sxm")
    assert {r.unit for p in series.commits for r in p.runs} == {GPU_A, None}
    (point,) = series.change_points
    assert (point.unit, point.before, point.after) == (GPU_A, commit(8), commit(9))
    assert point.ratio == pytest.approx(1.2, rel=0.02)
    assert series.searched_units() == 1


def test_history_chart_bands_the_change_points_commit_range(tmp_path):
    (series,) = data.time_histories(change_point_store(tmp_path / "results"), "h100-sxm")
    fig = charts.history_grid("t", [series], [p.commit for p in series.commits])
    (ax,) = fig.axes
    (band,) = [p for p in ax.patches if p.get_hatch() == "//"]
    span = (band.get_x(), band.get_x() + band.get_width())
    assert span == pytest.approx((7, 8))  # from commit 8 (x = 7) to commit 9
    assert f"{series.change_points[0].ratio - 1:+.0%}" in [t.get_text() for t in ax.texts]


def test_history_page_lists_the_planted_change_point(tmp_path, asv_calls):
    store = change_point_store(tmp_path / "results")
    page = (site.publish(store.root, tmp_path / "html").parent / "history.html").read_text()
    assert "1 change points in 1 series searched" in page
    row = (
        f"<tr><td>bench_step.Step100M</td><td>variant=best step (wall)</td><td>{GPU_A[:12]}</td>"
        f"<td>{commit(8)[:12]} → {commit(9)[:12]}</td><td>1.2"
    )
    assert row in page
    assert re.search(r"<td>1\.(19|20|21)\d× \(\+(19|20|21)\.\d%\)</td><td>\d+\.\d</td></tr>", page)
    # before any chart of the page; the index lists it too, under the machine's headline
    assert page.index(row) < page.index("<img")
    index = (tmp_path / "html" / "optbench" / "index.html").read_text()
    assert index.index('<h2 id="h100-sxm">') < index.index(row) < index.index('class="thumbs"')


def test_a_difference_between_two_gpus_is_counted_never_listed(tmp_path, asv_calls):
    """Commit 1 measured on one GPU, commit 2 on another, 30% slower: no verdict, no band, no row;
    the history page counts it (mutation: the CROSS-GPU verdict kept as a change)."""
    store = ResultStore(tmp_path / "results")
    for n, (ms, gpu) in enumerate([(50.0, "GPU-a"), (65.0, "GPU-b")], 1):
        records = [_step("bench_step.Step100M", "best", ms, n)]
        save(store, "h100-sxm", commit(n), f"2025-01-0{n}T12:00:00+00:00", records, gpu_uuid=gpu)
    (series,) = data.time_histories(store, "h100-sxm")
    assert not series.flagged and series.cross_gpu == 1
    assert not charts.history_grid("t", [series], [commit(1), commit(2)]).axes[0].patches
    page = (site.publish(store.root, tmp_path / "html").parent / "history.html").read_text()
    assert "CROSS-GPU" not in page and "<table" not in page
    assert "0 changes flagged by the regression gate" in page
    assert "; 1 differences beyond the threshold between runs on different GPUs only" in page


def test_the_index_leads_with_each_machines_headline_and_a_thumbnail_per_page(store, published):
    """Per machine: each size's fastest step, eager's time over it, x HF (none measured: n/a) and
    its memory, then a thumbnail of each page's first chart linking to its section."""
    out, _ = published
    page = (out / "index.html").read_text()
    run = data.runs(store)["h100-sxm"][-1]
    best, eager = (data.steps(run)["100M"][v] for v in ("best", "eager"))
    row = (
        f"<tr><td>100M @ {commit(3)[:8]}</td><td>best</td><td>{data.step_ms(best):.1f} "
        f"[{data.step_iqr_ms(best):.1f}]</td><td>{data.step_ms(eager) / data.step_ms(best):.2f}×"
        f"</td><td>n/a</td><td>{memory.step_memory(run, '100M', 'best', best).cell()}</td></tr>"
    )
    section = page[page.index('<h2 id="h100-sxm">') : page.index('<h2 id="h100-sxm-emulating-t4">')]
    assert row in section and "†</td>" in row
    thumbs = re.findall(r'<a href="(\w+)\.html#h100-sxm"><img src="([^"]+)"', section)
    assert [page for page, _ in thumbs] == list(site.PAGES)
    firsts = [
        next(p.name for p in images(out / f"{name}.html") if p.name.startswith(f"{name}-h100-sxm-"))
        for name in site.PAGES
    ]
    assert [src for _, src in thumbs] == firsts
    assert section.index(row) < section.index('class="thumbs"')


def test_asv_publishes_into_a_folder_of_its_own(tmp_path, monkeypatch):
    """asv publish empties its html dir first: it gets html/asv/, so optbench's pages beside it
    survive."""
    from optbench.asv import asv_atomic
    from optbench.store.store import REPO_ROOT

    calls = []
    monkeypatch.setattr(
        asv_atomic, "asv", lambda args, env=None, echo=True: calls.append(args) or 0
    )
    site.asv_publish(REPO_ROOT / "results", tmp_path / "html")
    assert calls == [
        ["publish", "--no-pull", "--html-dir", str((tmp_path / "html" / "asv").resolve())]
    ]
    assert json.loads((REPO_ROOT / "asv.conf.json").read_text())["html_dir"] == "html/asv"


def test_publish_says_in_one_line_where_the_pages_are_and_how_long_it_took(
    store, asv_calls, tmp_path, capsys
):
    """One line per publish, not one per page: where, how long, how many charts were drawn."""
    html = tmp_path / "html"
    site.publish(store.root, html)
    (line,) = capsys.readouterr().out.splitlines()
    charts_drawn = re.search(r"; (\d+) of \1 charts drawn; asv's site: ", line)
    assert (
        line.startswith(f"optbench report: {html / 'optbench' / 'index.html'} in ") and charts_drawn
    )
    site.publish(store.root, html)
    (line,) = capsys.readouterr().out.splitlines()
    assert "; records unchanged: the pages as before; " in line


def test_a_newer_run_without_the_hf_anchor_does_not_hide_x_hf(tmp_path):
    """Mutation: weighed by its step pairs alone, the newer run (three pairs, no anchor) would take
    the 1B column from the older one (three pairs and the anchor), and the headline would lose its
    x HF row."""

    def step(variant: str, ms: float) -> dict:
        times = {"step": (None, samples(ms, 1))}
        return record("bench_step.Step1B", {"variant": variant}, times=times)

    anchor = record(
        ANCHOR_BENCHMARK, {"size": "1B"}, times={"step": (None, samples(130.0, 2))}, info={}
    )
    store = ResultStore(tmp_path / "results")
    older = [step("eager", 220.0), step("best-kernels", 107.0), step("best-regional", 116.0)]
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", [*older, anchor])
    newer = [step("eager", 221.0), step("best-kernels", 107.2), step("best-regional", 116.2)]
    save(store, "h100-sxm", commit(2), "2025-01-02T12:00:00+00:00", newer)
    page = headline.headline_table(store)
    assert "| 1B @ `fffffff1` |" in page and "× HF (HF ms / our fastest's ms)" in page
    (row,) = dashboard.headline_rows(data.runs(store)["h100-sxm"])
    assert row[0] == "1B @ fffffff1" and row[4].startswith("1.2")


def test_a_long_chart_title_is_wrapped_to_the_figures_width():
    """matplotlib does not wrap a suptitle: a long subtitle ran off both edges of the PNG."""
    subtitle = "speedup vs each variant's own reference, measured in the same run " * 3
    fig = charts.step_bars(f"h200 — NVIDIA H200\n{subtitle}", {"1B @ abc": {"fused": 1.2}}, "x")
    lines = fig._suptitle.get_text().split("\n")
    width_px = fig.get_figwidth() * charts.DPI
    assert len(lines) > 2 and all(len(line) * 7.5 <= width_px for line in lines)
    # drawn, the title's box lies inside the figure
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= fig.bbox.width  # in the canvas's own pixels
    # the gate's chart of changes too, its height grown by the title's lines
    short = charts.changes("h200", [], [])
    wrapped = charts.changes(f"h200\n{subtitle}", [], [])
    assert "\n" in wrapped._suptitle.get_text().split("h200\n", 1)[1]
    assert wrapped.get_figheight() > short.get_figheight()


def test_tokens_per_second_are_bars_on_a_linear_axis():
    """A log axis starts at no zero: one size's bars (within 2x) drawn on it made a 0.57x step a
    sliver beside eager's, and the 100M FP8 steps' 3e4 beside best-kernels' 5.5e5."""
    one_size = {"eager": {"tiny": 2.7e4}, "chunked-ce": {"tiny": 1.55e4}}
    sizes = {"eager": {"100M": 1.1e5, "1B": 3.7e4}, "best": {"100M": 5.5e5}}
    for tokens in (one_size, sizes):
        ax = charts.throughput("h200", tokens, {}).axes[0]
        assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0


def test_the_index_points_to_the_newest_run_where_the_gpus_come_first():
    """A user's CPU run sits below every GPU's section: a line leads to it, dated by its newest
    record (an ab round on a GPU, its records left out of the page, leaves only a machine record
    dated later); none where the newest run's machine already comes first."""
    from types import SimpleNamespace

    def run(label, date, machine_date=None):
        records = {"a case": SimpleNamespace(date=date)}
        records[site.MACHINE_KEY] = SimpleNamespace(date=machine_date or date)
        return SimpleNamespace(label=label, commit="c" * 40, records=records)

    found = {
        "h200": [run("h200", "2026-11-28T10:00:00+00:00", "2026-11-29T10:00:00+00:00")],
        "cpu-amd-epyc-003596": [run("cpu", "2026-11-29T09:00:00+00:00")],
    }
    [line] = site.newest_run_link(found)
    assert '<a href="#cpu-amd-epyc-003596">cpu</a>' in line and "2026-11-29T09:00" in line
    assert site.newest_run_link(dict(reversed(list(found.items())))) == []
    assert site.newest_run_link({"h200": found["h200"]}) == []


def test_the_index_leads_to_a_cpu_run_newer_than_the_gpus(asv_calls, tmp_path):
    store = ResultStore(tmp_path / "results")
    gpu = [_step("bench_step.Step100M", "eager", 60.0, 1)]
    save(store, "h100-sxm", commit(1), "2025-01-01T12:00:00+00:00", gpu)
    cpu = [_step("bench_step.StepTiny", "eager", 9.0, 2)]
    save(store, "cpu-host", commit(2), "2025-01-02T12:00:00+00:00", cpu, gpu_name=None)
    assert site.main(["--results", str(store.root), "--html", str(tmp_path / "html")]) == 0
    index = (tmp_path / "html" / "optbench" / "index.html").read_text()
    assert index.index('Newest run: <a href="#cpu-host">') < index.index('<h2 id="h100-sxm">')


def test_a_history_without_a_trend_says_why_where_ab_rounds_may_explain_it():
    """A machine of one commit has no trend; one of several whose metrics reach two commits in no
    run of optbench's own (ab's rounds are left out) links the machines table counting them."""
    from types import SimpleNamespace

    histories = site.Histories(found={"cpu": []}, order={"cpu": {}})
    one = [SimpleNamespace(machine="cpu", label="cpu — CPU")]
    [alone] = site.history_parts(histories, one)
    assert "two commits or more." in alone and "ab" not in alone
    [several] = site.history_parts(histories, one * 3)
    assert "optbench ab" in several and 'href="index.html#machines"' in several


def test_each_run_with_the_hf_anchor_gets_a_row_of_x_hf_even_without_eager(tmp_path):
    """A run of the anchor and a few best steps (no eager: the step table's column needs each
    variant's reference, so it keeps the older run) still shows its x HF, bf16 and FP8 apart, each
    figure from that run; a run without the anchor has no row."""

    def step(variant: str, ms: float) -> dict:
        return record("bench_step.Step1B", {"variant": variant}, times={"step": (None, [ms] * 5)})

    def anchor(ms: float) -> dict:
        return record(ANCHOR_BENCHMARK, {"size": "1B"}, times={"step": (None, [ms] * 5)}, info={})

    store = ResultStore(tmp_path / "results")
    older = [step("eager", 220.0), step("best-kernels", 107.0), anchor(130.0)]
    save(store, "h200", commit(1), "2025-01-01T12:00:00+00:00", older)
    newer = [
        step("best-kernels", 108.0),
        step("best-kernels-fp8-tensorwise-fast-accum", 90.0),
        step("best-kernels-fp8-triton", 84.0),
        step("best-kernels-fp8-gone", 85.0),  # a variant that has left the catalog since
        anchor(126.0),
    ]
    save(store, "h200", commit(2), "2025-01-02T12:00:00+00:00", newer)
    # no row: no anchor; and an anchor beside no best-* step (a sweep's shard)
    save(store, "h200", commit(3), "2025-01-03T12:00:00+00:00", [step("eager", 219.0)])
    save(store, "h200", commit(4), "2025-01-04T12:00:00+00:00", [step("fused-ce", 200), anchor(1)])
    rows = hf_runs.hf_runs(data.runs(store)["h200"])
    assert [r.commit for r in rows] == [commit(2), commit(1)]
    _, _, body = hf_runs.hf_table(rows)
    assert body[0][5:] == [
        "best-kernels 108.00 ms: 1.167×",
        "best-kernels-fp8-triton 84.00 ms: 1.500×",
    ]
    assert body[1][5:] == ["best-kernels 107.00 ms: 1.215×", "–"]
    assert rows[0].gpu == GPU[4:12] and body[0][3] == GPU[4:12]
    assert hf_runs.hf_runs(data.runs(store)["h200"], limit=1) == rows[:1]
    assert hf_runs.newest_per_size(rows) == rows[:1]
    # the index shows the newest of each size
    index = (site.publish(store.root, tmp_path / "html").parent / "index.html").read_text()
    assert "<td>best-kernels-fp8-triton 84.00 ms: 1.500×</td>" in index
    assert "<td>best-kernels 107.00 ms: 1.215×</td>" not in index
    page = headline.headline_table(store)
    assert "| fffffff2 | " in page and "| 1B @ `fffffff1` |" in page


def test_each_convergence_variant_shows_its_newest_verdict_and_how_many_passed(tmp_path):
    """The newest record that reached a verdict (ok or wrong) of each variant of the catalog's grid,
    in its order, with the figures it was decided by and the run that trained its eager seeds; the
    newest by run, where a later rerun of an older commit stored it; a later timeout decides
    nothing, and a variant with no verdict shows its newest status; a verdict that flipped shows in
    the count of stored verdicts; a variant no longer in the grid has no row."""
    name = "bench_convergence.Convergence100M"

    def case(variant: str, status: str, deviation: float, seeds: int, **eager) -> dict:
        info = {
            "rms_deviation": deviation,
            "tolerance": 0.02 if seeds == 4 else 0.0308,
            "final_loss": 1.97,
            "eager": {"curves": [{"steps": [10], "loss": [2.0]}] * seeds, **eager},
        }
        return {**record(name, {"variant": variant}, info=info), "status": status}

    def runs(*cases_by_run: list[dict], commits: tuple[int, ...] = (1, 2, 3, 1)) -> None:
        for day, cases in enumerate(cases_by_run, 1):
            run = f"2025010{day}T120000Z-{'abcd'[day - 1] * 6}"
            date = f"2025-01-0{day}T12:00:00+00:00"
            sha = commit(commits[day - 1])
            save(store, "h200", sha, date, cases, run_id=run, stamp=True)

    store = ResultStore(tmp_path / "results")
    fp8, fast = "best-kernels-fp8-tensorwise", "best-kernels-fp8-tensorwise-fast-accum"
    runs(
        [case("eager", "ok", 0.005, 4), case(fp8, "wrong", 0.024, 4), case(fast, "ok", 0.002, 4)],
        [case("eager", "ok", 0.007, 8), case(fp8, "ok", 0.0075, 8)],
        [
            case(fp8, "timeout", 0.0, 8),
            record(name, {"variant": fast}, status="timeout"),
            case("fp8-rowwise", "ok", 0.006, 8, from_run="20250102T120000Z-bbbbbb"),
            record(name, {"variant": "fp8-tensorwise"}, status="skipped"),
            case("best-kernels-fp8-gone", "ok", 0.001, 8),  # left the grid since
        ],
        [case("eager", "ok", 0.009, 8)],  # a rerun of the first commit, the newest run
    )
    rows = convergence.convergence_rows(data.runs(store)["h200"])
    assert [r.variant for r in rows] == ["eager", "fp8-tensorwise", "fp8-rowwise", fp8, fast]
    _, header, body = convergence.convergence_table(rows)
    by_variant = {row[0]: dict(zip(header, row)) for row in body}
    assert by_variant[fp8] == {
        "variant": fp8,
        "verdict": "ok",
        "RMS deviation": "0.0075",
        "tolerance": "0.0308",
        "eager seeds": "8",
        "final loss": "1.9700",
        "run": "bbbbbb",
        "commit": commit(2)[:8],
        "GPU": GPU[4:12],
        "stored verdicts ok": "1 of 2",
    }
    assert by_variant[fast]["verdict"] == "ok" and by_variant[fast]["run"] == "aaaaaa"
    assert by_variant["fp8-rowwise"]["eager seeds"] == "8 (run bbbbbb)"
    assert [by_variant["eager"][k] for k in ("RMS deviation", "run", "commit")] == [
        "0.0090",
        "dddddd",
        commit(1)[:8],
    ]
    assert by_variant["eager"]["stored verdicts ok"] == "3 of 3"
    skipped = by_variant["fp8-tensorwise"]
    assert [skipped[k] for k in ("verdict", "RMS deviation", "stored verdicts ok")] == [
        "skipped",
        "–",
        "0 of 0",
    ]
    page = headline.headline_table(store)
    assert "Convergence check (optbench.suite.convergence" in page
    assert f"| {fp8} | ok | 0.0075 | 0.0308 |" in page
    index = (site.publish(store.root, tmp_path / "html").parent / "index.html").read_text()
    assert f"<td>{fp8}</td><td>ok</td><td>0.0075</td>" in index


def test_the_scaling_table_takes_each_variant_from_one_run(tmp_path):
    """A later run of one world size of a commit (a probe, a gate's round, on another GPU) never
    stands beside the run that measured the variant at every world size: its efficiencies are
    against its own 1-GPU figure."""
    from synthetic_results import commit, record, samples, save

    from optbench.reporting.data import distributed_steps, fullest, runs, scaling_rows

    def step(world: int, ms: float, seed: int) -> dict:
        return record(
            "bench_distributed.DistributedStep1B",
            {"variant": "fsdp2-best", "world_size": str(world)},
            times={"step": (None, samples(ms, seed))},
            info={"scaling_efficiency": 1.0 if world == 1 else 0.8, "tokens": 8192},
        )

    store = ResultStore(tmp_path / "results")
    full = [step(1, 139.0, 1), step(2, 181.0, 2), step(4, 169.0, 3)]
    save(store, "h200", commit(1), "2026-11-28T12:00:00+00:00", full, run_id="20261128T1200Z-a")
    later = [step(1, 185.0, 4)]
    save(store, "h200", commit(1), "2026-11-29T18:00:00+00:00", later, run_id="20261129T1800Z-b")
    rows = scaling_rows(fullest(runs(store)["h200"], distributed_steps))
    assert [r[1] for r in rows] == ["1", "2", "4"]
    assert [float(r[2]) for r in rows] == pytest.approx([139.0, 181.0, 169.0], rel=0.02)
