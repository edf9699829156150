"""The testing harness: scene tests (:class:`SceneTestCase`, :func:`scene_test`), the standalone
runner (:func:`main`, ``python test_x.py -p sim --rounds 3``; upstream's
``SceneTestCase.run_module(__name__)`` is the same runner) and the pytest plugin
(:mod:`simpler.testing.pytest_plugin`, registered as ``simpler``). The main names are re-exported
by ``simpler`` itself. For files ported from the upstream runtime: :data:`PLATFORM_ALIASES`
(``a2a3sim`` -> ``sim``, ...), :func:`scene_runtime` (the decorator's ``runtime=``) and
:class:`SceneTestWarning` (an ignored case ``config``). A case on several devices runs as
:class:`GroupCaseRun` (one process per device) and reports a :class:`GroupRound` per round.
"""

from __future__ import annotations

from ._cases import PLATFORM_ALIASES, scene_level, scene_runtime
from .caserun import CaseRun
from .runner import main
from .running import run_case
from .scene import SceneTestCase, SceneTestWarning, scene_test
from .scene_group import GroupCaseRun, GroupRound

__all__ = [
    "PLATFORM_ALIASES",
    "CaseRun",
    "GroupCaseRun",
    "GroupRound",
    "SceneTestCase",
    "SceneTestWarning",
    "main",
    "run_case",
    "scene_level",
    "scene_runtime",
    "scene_test",
]
