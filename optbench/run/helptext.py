"""Docstrings as command-line help: the reStructuredText markup that Sphinx reads, taken out for a
terminal."""

from __future__ import annotations

import re

_INLINE = re.compile(
    r":(?:[\w-]+:)+`(?P<tilde>~?)(?P<role>[^`<]*?)\s*(?:<[^`>]*>)?`"  # :func:`f`, :meth:`~a.f`
    r"|``(?P<literal>.+?)``"
    r"|(?<![\w`])`(?P<interpreted>[^`\n]+)`(?![\w`])"
    r"|(?<![\w*])(?P<stars>\*\*?)(?P<emphasis>\w[^*\n]*?)(?P=stars)(?![\w*])",
    re.DOTALL,
)
_LITERAL_BLOCK = re.compile(r"(?<=\S)::$|^[ \t]*::\n", re.MULTILINE)


def _inline(match: re.Match[str]) -> str:
    if match["role"] is not None:
        return match["role"].rsplit(".", 1)[-1] if match["tilde"] else match["role"]
    return match["literal"] or match["interpreted"] or match["emphasis"]


def plain(doc: str | None) -> str:
    """``doc`` without Sphinx markup, for an argparse description or help: a role
    (``:func:`f```) leaves its target (the last dotted part after ``~``, the title of
    ``title <target>``); an inline literal, interpreted text, ``*emphasis*`` and ``**strong**``
    their content; the ``::`` that opens a literal block becomes ``:`` after text and goes where
    it stands alone. Line breaks and indentation stay. ``None`` (a docstring that ``python -OO``
    dropped) gives ""."""
    if doc is None:
        return ""
    text = _INLINE.sub(_inline, doc)
    return _LITERAL_BLOCK.sub(lambda m: ":" if m[0] == "::" else "", text)
