"""``python -m simpler``: the ``simpler`` command (see :mod:`simpler.tools.cli`)."""

from __future__ import annotations

from .tools.cli import main

raise SystemExit(main())
