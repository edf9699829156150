"""The code blocks of the README and of ``docs/`` run (so they cannot drift from the code).

Every fenced ``python`` block of a page runs, in page order, in one namespace per page. Blocks
fenced without a language (shell commands, output) are not run.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)], ids=lambda p: p.name)
def test_the_page_s_python_blocks_run(page, capsys):
    namespace: dict[str, object] = {"__name__": f"doc_{page.stem}"}
    for i, block in enumerate(_blocks(page)):
        code = compile(block, f"{page.name} (python block {i + 1})", "exec")
        exec(code, namespace)


def test_every_page_is_seen():
    assert {p.name for p in PAGES} >= {"README.md", "concepts.md", "scene_tests.md"}
    assert sum(len(_blocks(p)) for p in PAGES) >= 4
