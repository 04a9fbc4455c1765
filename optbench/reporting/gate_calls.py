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
import re
from pathlib import Path
from typing import Any

from optbench.gate.ab import (
    EXIT_INCONCLUSIVE,
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_REGRESSION,
    PAIRING_DIR,
)
from optbench.store.store import ResultStore

OUTCOMES = {
    EXIT_OK: "no regression",
    EXIT_REGRESSION: "regression",
    EXIT_NOTHING: "nothing to compare",
    EXIT_INCONCLUSIVE: "inconclusive",
}
NEWEST = 8  # rows shown: the recent calls, whose time and outcome say what the gate costs now
CAPTION = (
    "The regression gate's newest calls (optbench ab BASE HEAD, both commits measured on this "
    "machine in one job; pairing records in results/<machine>/ab/), newest first: the cases it "
    "judged, the ABBA rounds each side ran, its lockstep rounds, its seconds to a verdict (setup "
    "and worktrees included) and its outcome (inconclusive: a required metric undecided when its "
    "time budget or its rounds ended):"
)
HEADER = ("call", "base -> head", "cases", "rounds a side", "lockstep", "s", "outcome", "GPU")


def call_id(path: Path) -> tuple[str, int]:
    """The call a pairing record belongs to (ab names it after the call's first base run, with
    ``-head<i>`` for each of several heads) and its head's number (0 for a call of one head)."""
    stem, _, head = path.stem.rpartition("-head")
    return (stem, int(head)) if stem and head.isdigit() else (path.stem, 0)


def gate_calls(store: ResultStore, machine: str, newest: int = NEWEST) -> list[dict[str, Any]]:
    """The pairing records of the ``newest`` calls on ``machine``, newest first (a call's id
    starts with its UTC time), a call's heads in order; each with ``path``, its file."""
    ids = {p: call_id(p) for p in (store.root / machine / PAIRING_DIR).glob("*.json")}
    paths = sorted(ids, key=lambda p: (ids[p][0], -ids[p][1]), reverse=True)
    calls = set(list(dict.fromkeys(ids[p][0] for p in paths))[:newest])
    return [{**json.loads(p.read_text()), "path": p} for p in paths if ids[p][0] in calls]


def _side(side: dict[str, Any]) -> str:
    """A side as the call named it (a branch, ``HEAD``, a hash cut to 8 digits), then the commit
    whose code it measured; that commit alone where the call named it by its hash."""
    ref, commit = side.get("ref") or "", side["commit"]
    if commit.startswith(ref):
        return commit[:8]
    return f"{ref[:8] if re.fullmatch('[0-9a-f]{7,40}', ref) else ref} {commit[:8]}"


def gate_row(call: dict[str, Any]) -> list[str]:
    """One call's table cells (:data:`HEADER`)."""
    return [
        call_id(call["path"])[0],
        f"{_side(call['base'])} -> {_side(call['head'])}",
        str(len({v["key"] for v in call["verdicts"]})),
        str(call["order"].count("base")),  # the base's ABBA rounds, as many as each head's
        str(len(call.get("lockstep_rounds", []))),  # records before lockstep have none
        f"{call['seconds']:.0f}",
        OUTCOMES.get(call["exit"], f"exit {call['exit']}"),
        ", ".join(u.removeprefix("GPU-")[:8] for u in call["gpu_uuids"]) or "none",
    ]
