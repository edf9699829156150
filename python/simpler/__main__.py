"""``python -m simpler``: the ``simpler`` command (see :mod:`simpler.cli`)."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
