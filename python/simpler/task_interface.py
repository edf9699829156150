"""Upstream's import path for argument directions.

Scene tests written for upstream's runtime (hw-native-sys/simpler) import the directions of their
``CALLABLE`` signatures with ``from simpler.task_interface import ArgDirection as D`` and use
``D.IN``, ``D.OUT`` and ``D.INOUT``. This module exists so that line works unchanged in a ported
test: :class:`ArgDirection` here is :class:`simpler.ArgDirection` itself (the same class, so
``D.IN is simpler.IN``). Upstream's module holds much more (the C++ task interface bindings);
nothing else of it has a counterpart here.
"""

from __future__ import annotations

from .worker import ArgDirection

__all__ = ["ArgDirection"]
