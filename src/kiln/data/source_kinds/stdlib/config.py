"""The stdlib kind's keys."""

from __future__ import annotations

from kiln.config.declare import Strings, setting
from kiln.data.source_kinds import registry


class Keys(registry.Keys):
    QUALITY = "code"  # the standard library is code

    include: Strings = setting(("**/*.py",), "Glob patterns relative to the standard library directory.")
