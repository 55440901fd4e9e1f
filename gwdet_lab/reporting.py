"""Duration formatting for the lab's reports and progress lines.

Tables are written with the plugin's :mod:`gwdet_lab.tables` (one table writer for ``results.md`` and
every lab report); a duration is a lab concern (study wall times, ETAs), so it lives here.
"""
from __future__ import annotations

import math


def format_duration(seconds: float | None) -> str:
    """``3725`` -> ``"1h02m05s"``, ``65`` -> ``"1m05s"``, ``7`` -> ``"7s"``; ``"?"`` when unknown
    (``None``, NaN or infinite)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(round(max(seconds, 0.0)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
