"""The regression gate's calls on one machine, for the headline page and the HTML index: each
``optbench ab`` pairing record (``results/<machine>/ab/*.json``, one per head) as a table row,
newest first.

A row says what the call compared (base and head, as named and by commit), how much it measured
(the cases judged, the ABBA rounds each side ran, the lockstep rounds), how long it took to its
verdict (ab's own seconds, setup and worktrees included), its outcome (ab's exit code) and its
GPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optbench.gate.ab import EXIT_INCONCLUSIVE, EXIT_NOTHING, EXIT_OK, EXIT_REGRESSION
from optbench.store.store import ResultStore

OUTCOMES = {
    EXIT_OK: "no regression",
    EXIT_REGRESSION: "regression",
    EXIT_NOTHING: "nothing to compare",
    EXIT_INCONCLUSIVE: "inconclusive",
}
NEWEST = 8  # rows shown: the recent calls, whose time and outcome say what the gate costs now
CAPTION = (
    "The regression gate's newest calls (optbench ab BASE HEAD, both commits measured on one GPU "
    "in one job; pairing records in results/<machine>/ab/), newest first: the cases it judged, "
    "the ABBA rounds each side ran, its lockstep rounds, its seconds to a verdict (setup and "
    "worktrees included) and its outcome (inconclusive: a required metric undecided when the time "
    "budget ended):"
)
HEADER = ("first run", "base -> head", "cases", "rounds a side", "lockstep", "s", "outcome", "GPU")


def gate_calls(store: ResultStore, machine: str, newest: int = NEWEST) -> list[dict[str, Any]]:
    """The ``newest`` pairing records of ``machine``, newest first (by their first run's id, which
    starts with its UTC time); each with ``path``, the file it came from."""
    paths = (store.root / machine / "ab").glob("*.json")
    found = [{**json.loads(p.read_text()), "path": p} for p in paths]
    found.sort(key=lambda r: Path(r["path"]).name)  # a call's heads in order, once stably sorted
    found.sort(key=lambda r: r["base"]["runs"][0], reverse=True)
    return found[:newest]


def _side(side: dict[str, Any]) -> str:
    """A side as the call named it (a branch, ``HEAD``), then its commit; the commit alone where it
    was named by its hash."""
    ref, commit = side.get("ref") or "", side["commit"]
    return commit[:8] if commit.startswith(ref) else f"{ref} {commit[:8]}"


def gate_row(call: dict[str, Any]) -> list[str]:
    """One call's table cells (:data:`HEADER`)."""
    return [
        call["base"]["runs"][0],
        f"{_side(call['base'])} -> {_side(call['head'])}",
        str(len({v["key"] for v in call["verdicts"]})),
        str(call["order"].count("base")),  # each ABBA pass runs the base once
        str(len(call.get("lockstep_rounds", []))),  # records before lockstep have none
        f"{call['seconds']:.0f}",
        OUTCOMES.get(call["exit"], f"exit {call['exit']}"),
        ", ".join(u.removeprefix("GPU-")[:8] for u in call["gpu_uuids"]) or "none",
    ]
