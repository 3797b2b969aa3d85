"""Durations as the spec writes them (``500ms``, ``30s``, ``5m``, ``1h``, ``1h30m``).

The accepted shape is the schema's ``$defs/duration`` pattern, so the schema and the
parser cannot drift apart.
"""

from __future__ import annotations

import re
from functools import cache

from queueplane.spec.schema import load_schema

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)")


@cache
def _pattern() -> re.Pattern[str]:
    return re.compile(load_schema()["$defs"]["duration"]["pattern"])


def is_duration(text: object) -> bool:
    return isinstance(text, str) and _pattern().fullmatch(text) is not None


def parse_ms(text: str) -> int:
    """Milliseconds in a duration string; ValueError names the accepted forms."""
    if not is_duration(text):
        raise ValueError(f"{text!r} is not a duration such as 500ms, 30s, 5m, 1h or 1h30m")
    return sum(int(n) * _UNIT_MS[unit] for n, unit in _PART.findall(text))


def parse_seconds(text: str) -> float:
    return parse_ms(text) / 1000.0


def format_ms(ms: int) -> str:
    """The shortest spec-style string for a number of milliseconds (inverse of parse_ms)."""
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNIT_MS[unit]
        if ms >= size:
            count, ms = divmod(ms, size)
            parts.append(f"{count}{unit}")
    return "".join(parts)
