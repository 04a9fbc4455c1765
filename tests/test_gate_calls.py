"""optbench.reporting.gate_calls: the regression gate's calls on the headline page and the HTML
index, newest first, a call's heads in order, records from before lockstep read too."""

from __future__ import annotations

import json
from pathlib import Path

from synthetic_results import report_store

from optbench.reporting import gate_calls, headline
from optbench.store.store import ResultStore


def _call(folder: Path, name: str, first_run: str, exit_code: int, **more) -> None:
    record = {
        "base": {"commit": "a" * 40, "ref": "main", "runs": [first_run, "r2", "r3", "r4"]},
        "head": {"commit": "b" * 40, "ref": "bbbbbbb", "runs": ["r5", "r6", "r7", "r8"]},
        "order": ["base", "head", "head", "base", "base", "head", "head", "base"],
        "lockstep_rounds": [],
        "seconds": 282.1,
        "exit": exit_code,
        "gpu_uuids": ["GPU-2d8d1501-73eb-7590-7525-16007ec06c65"],
        "verdicts": [{"key": "k1"}, {"key": "k1"}, {"key": "k2"}],
        **more,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(record))


def test_the_newest_calls_read_as_rows(tmp_path):
    store = ResultStore(tmp_path / "results")
    ab = store.root / "h200" / "ab"
    lockstep_only = {"order": [], "lockstep_rounds": [{}] * 6}  # each round a run of each side
    base = {"commit": "a" * 40, "runs": ["20261128T100000Z-old", *"23456"]}
    _call(ab, "20261128T100000Z-old", "20261128T100000Z-old", 3, base=base, **lockstep_only)
    # a lockstep call's later head has base runs of its own, started after the first head's
    _call(ab, "20261129T100000Z-two-head2", "20261129T100500Z-later", 0)
    _call(ab, "20261129T100000Z-two-head1", "20261129T100000Z-two", 1)
    _call(ab, "20261127T100000Z-pre", "20261127T100000Z-pre", 0)
    before = json.loads((ab / "20261127T100000Z-pre.json").read_text())
    del before["lockstep_rounds"]  # a record from before lockstep
    (ab / "20261127T100000Z-pre.json").write_text(json.dumps(before))
    rows = [gate_calls.gate_row(c) for c in gate_calls.gate_calls(store, "h200")]
    assert [r[0] for r in rows] == ["20261129T100000Z-two"] * 2 + [
        "20261128T100000Z-old",
        "20261127T100000Z-pre",
    ]
    assert rows[0] == [
        "20261129T100000Z-two",
        "main aaaaaaaa -> bbbbbbbb",  # a ref that is the hash's start reads once
        "2",
        "4",
        "0",
        "282",
        "regression",
        "2d8d1501",
    ]
    assert rows[1][6] == "no regression"
    assert rows[2][3:5] == ["0", "6"] and rows[2][6] == "inconclusive" and rows[3][4] == "0"
    assert len(gate_calls.gate_calls(store, "h200", newest=2)) == 3  # two calls, one of two heads


def test_the_headline_shows_the_gate_s_calls_where_there_are_some(tmp_path):
    store = report_store(tmp_path / "results")
    assert "regression gate" not in headline.headline_table(store)
    _call(store.root / "h100-sxm" / "ab", "20261129T100000Z-one", "20261129T100000Z-one", 0)
    text = headline.headline_table(store)
    assert gate_calls.CAPTION in text and "| 20261129T100000Z-one |" in text


def test_the_index_shows_the_newest_calls_of_each_machine(tmp_path, monkeypatch):
    from optbench.reporting import site

    store = report_store(tmp_path / "results")
    ab = store.root / "h100-sxm" / "ab"
    for i in range(site.INDEX_GATE_CALLS + 1):
        _call(ab, f"2026112{i}T100000Z-run{i}", f"2026112{i}T100000Z-run{i}", 0)
    monkeypatch.setattr(site, "asv_publish", lambda results, html: None)
    site.publish(store.root, tmp_path / "html")
    newest = site.INDEX_GATE_CALLS + 1  # a call whose records alone are new: the index is redrawn
    _call(ab, f"2026112{newest}T100000Z-run{newest}", f"2026112{newest}T100000Z-run{newest}", 0)
    index = site.publish(store.root, tmp_path / "html").read_text()
    assert (
        "regression gate&#x27;s newest calls" in index or "regression gate's newest calls" in index
    )
    shown = [i for i in range(newest + 1) if f"2026112{i}T100000Z-run{i}" in index]
    assert shown == [2, 3, 4]  # the newest three, not the older ones
