"""The testing harness: scene tests (:class:`SceneTestCase`, :func:`scene_test`), the standalone
runner (:func:`main`, ``python test_x.py -p sim --rounds 3``) and the pytest plugin
(:mod:`simpler.testing.pytest_plugin`, registered as ``simpler``). The names are re-exported by
``simpler`` itself.
"""

from __future__ import annotations

from .runner import main
from .scene import CaseRun, SceneTestCase, run_case, scene_test

__all__ = ["CaseRun", "SceneTestCase", "main", "run_case", "scene_test"]
