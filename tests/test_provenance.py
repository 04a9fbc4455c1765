"""Docstrings and comments state contracts; where a figure came from is NOTES.md's business.

No docstring or comment in ``optbench/``, ``kernels/``, ``models/`` or ``benchmarks/`` names a
commit hash or a run id: such a name goes stale with the next change, and the figure it vouches for
is kept, with its run and command, in NOTES.md. Code is not prose: string literals the code uses and
hex in expressions are not read, only comments (``tokenize``) and string statements (docstrings,
attribute docstrings). A planted case of each kind is caught (the check can fail), and hex the code
uses is not.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

from optbench.store.store import REPO_ROOT, records_stem

ROOT = REPO_ROOT
SCANNED = ("optbench", "kernels", "models", "benchmarks")

# 7-40 hex digits with at least one digit and one letter: an abbreviated or full commit hash (a GPU
# UUID's prefix too); words of letters only ('deadbeef', 'accede') and numbers ('1000000') are not.
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
# A run id in full (UTC start, random suffix) or its 6-hex suffix after "run"/"runs" (with a digit,
# so that English words such as 'decade' do not count), as NOTES.md names runs.
_SUFFIX = r"\b(?=[0-9a-f]*\d)[0-9a-f]{6}\b"
_LIST = r"(?:,\s*|\s+(?:and|or|vs)\s+)"
RUN_ID = re.compile(
    rf"\b\d{{8}}T\d{{6}}Z-[0-9a-f]{{6}}\b|\bruns?\s+{_SUFFIX}(?:{_LIST}{_SUFFIX})*", re.IGNORECASE
)
RUN_SUFFIX = re.compile(_SUFFIX)
# Hex-looking words that name no commit or run, each with what it is. A new entry needs its reason.
NOT_PROVENANCE: dict[str, str] = {
    "f8f8bf16": "CUTLASS's rowwise FP8 GEMM kernel name (fp8 x fp8 -> bf16)",
    "20261124T190512Z-3fa1c2": "the run id format's example in optbench.store.store.new_run_id; no "
    "stored run",
}


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string statement (docstrings) of ``source``."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found += [
                (node.lineno + i, line) for i, line in enumerate(node.value.value.splitlines())
            ]
    return sorted(found)


def provenance(source: str) -> list[str]:
    """'line: name' for each commit hash or run id that a comment or docstring of ``source``
    names."""
    hits = []
    for line, text in prose(source):
        names = [m.group() for m in COMMIT.finditer(text)]
        for m in RUN_ID.finditer(text):
            names += (
                [m.group()] if "T" in m.group() else RUN_SUFFIX.findall(m.group().split(None, 1)[1])
            )
        hits += [f"{line}: {name}" for name in names if name not in NOT_PROVENANCE]
    return hits


def _sources() -> dict[str, str]:
    return {
        str(p.relative_to(ROOT)): p.read_text()
        for d in SCANNED
        for p in sorted((ROOT / d).rglob("*.py"))
    }


def test_no_docstring_or_comment_names_a_commit_or_a_run():
    found = {path: hits for path, source in _sources().items() if (hits := provenance(source))}
    assert found == {}, "move the provenance to NOTES.md and state the contract instead"


def test_a_planted_commit_or_run_is_caught():
    """Mutation: each way a docstring or comment has named where a figure came from."""
    planted = [
        "x = 1  # measured in 26a3bb8\n",
        "# 2.3x faster (fdd61acd936a62a5568c67859f8a836a02e817d9)\n",
        'def f():\n    """Tuned on an H100. Run b94ca2."""\n',
        '"""Module.\n\nThe steps of runs 5ec258 and b514ea.\n"""\n',
        "# samples: results/h100-sxm/optbench/x/20261125T032825Z-b94ca2.jsonl\n",
        'X = 2\n"""Attribute docstring: 1.3x at 65a3058."""\n',
    ]
    assert [len(provenance(source)) for source in planted] == [1, 1, 1, 2, 1, 1]


def test_hex_in_code_and_words_are_not_provenance():
    """Hex the code uses (literals, strings, names), numbers and hex-letter words pass."""
    clean = [
        "MASK = 0xFFFFFFFF  # all lanes\nSEED = 0x9E3779B9\n",
        'EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbdaad7"  # git\'s empty tree, used as a '
        "value\n",
        "assert run_id.endswith('-3fa1c2')  # ids end in 6 hex digits\n",
        "# rounds up to 1000000 elements; a deadbeef canary; the run before; a decade of runs\n",
        '"""e4m3 x e5m2 GEMMs (f8f8bf16); ids look like 20261124T190512Z-3fa1c2."""\n',
    ]
    assert [provenance(source) for source in clean] == [[]] * len(clean)


def test_examples_name_no_stored_run():
    """The run-id example left in a docstring stays fictional: no run of that id is stored."""
    stored = {records_stem(p) for p in (ROOT / "results").glob("*/optbench/*/*.jsonl*")}
    assert not stored & set(NOT_PROVENANCE)
