"""docs/plugins.md (and the README's "Write your own tier") show code from the
example plugins in examples/; this keeps the two equal.

A fenced block right after `<!-- file: PATH -->` must be the whole file; one after
`<!-- snippet: PATH -->` is an excerpt: split at lines reading `# ...`, each piece
must appear in the file verbatim, as whole lines. Every Python and TOML block of
the guide is marked so (code nobody checks goes stale), and the guide's links to
its own sections and to files of the repository lead somewhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "plugins.md"
README = REPO / "README.md"
MARKED_BLOCK = re.compile(
    r"<!-- (?P<mode>file|snippet): (?P<path>\S+) -->\n```[a-z]*\n(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.DOTALL | re.MULTILINE)
# The whole tier of Part 1 is shown, with its package and tests.
MINIMAL = [
    "examples/kvtiers-scratch/pyproject.toml",
    "examples/kvtiers-scratch/src/kvtiers_scratch/plugin.py",
    "examples/kvtiers-scratch/src/kvtiers_scratch/tier.py",
    "examples/kvtiers-scratch/tests/test_scratch_tier.py",
    "examples/kvtiers-scratch/config.json",
]


def _blocks(doc: Path) -> list[tuple[str, str, str]]:
    return [(m["mode"], m["path"], m["body"]) for m in MARKED_BLOCK.finditer(doc.read_text())]


ALL_BLOCKS = [(doc, *block) for doc in (GUIDE, README) for block in _blocks(doc)]


def test_the_guide_marks_its_code() -> None:
    modes = {mode for mode, _, _ in _blocks(GUIDE)}
    assert modes == {"file", "snippet"}
    whole = {path for mode, path, _ in _blocks(GUIDE) if mode == "file"}
    assert set(MINIMAL) <= whole, f"not shown whole: {sorted(set(MINIMAL) - whole)}"


def test_every_python_and_toml_block_of_the_guide_is_checked() -> None:
    text = GUIDE.read_text()
    marked = {m.start("body") for m in MARKED_BLOCK.finditer(text)}
    unmarked = [
        m["body"][:80] for m in FENCE.finditer(text)
        if m["lang"] in {"python", "toml"} and m.start("body") not in marked
    ]  # fmt: skip
    assert not unmarked, f"code blocks not taken from a file: {unmarked}"


@pytest.mark.parametrize(
    ("doc", "mode", "path", "body"),
    ALL_BLOCKS,
    ids=[f"{d.name}:{m}:{p}" for d, m, p, _ in ALL_BLOCKS],
)
def test_guide_code_matches_the_example(doc: Path, mode: str, path: str, body: str) -> None:
    source = (REPO / path).read_text()
    if mode == "file":
        assert body == source, f"{doc.name} shows an outdated copy of {path}"
        return
    lines = "\n" + source
    for piece in re.split(r"^# \.\.\.\n", body, flags=re.MULTILINE):
        assert "\n" + piece in lines, f"{doc.name}: not in {path}:\n{piece}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_guides_links_lead_somewhere() -> None:
    text = GUIDE.read_text()
    outside_code = FENCE.sub("", text)
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", outside_code, re.MULTILINE)}
    links = re.findall(r"\]\(([^)\s]+)\)", outside_code)
    assert links
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        if link.startswith("#"):
            assert link[1:] in anchors, f"no section {link} in {GUIDE.name}"
        else:
            assert (GUIDE.parent / link).exists(), f"{link} does not exist"
