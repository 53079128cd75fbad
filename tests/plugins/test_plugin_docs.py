"""docs/plugins.md shows code from examples/kvtiers-sqlite; this keeps the two equal.

A fenced block right after `<!-- file: PATH -->` must be the whole file; one after
`<!-- snippet: PATH -->` is an excerpt: split at lines reading `# ...`, each piece
must appear in the file verbatim, as whole lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "plugins.md"
MARKED_BLOCK = re.compile(
    r"<!-- (?P<mode>file|snippet): (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)


def _blocks() -> list[tuple[str, str, str]]:
    return [(m["mode"], m["path"], m["body"]) for m in MARKED_BLOCK.finditer(GUIDE.read_text())]


def test_the_guide_marks_its_code() -> None:
    modes = {mode for mode, _, _ in _blocks()}
    assert modes == {"file", "snippet"}


@pytest.mark.parametrize(
    ("mode", "path", "body"), _blocks(), ids=[f"{m}:{p}" for m, p, _ in _blocks()]
)
def test_guide_code_matches_the_example(mode: str, path: str, body: str) -> None:
    source = (REPO / path).read_text()
    if mode == "file":
        assert body == source, f"docs/plugins.md shows an outdated copy of {path}"
        return
    lines = "\n" + source
    for piece in re.split(r"^# \.\.\.\n", body, flags=re.MULTILINE):
        assert "\n" + piece in lines, f"not in {path}:\n{piece}"
