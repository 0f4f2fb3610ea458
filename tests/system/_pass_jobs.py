"""Jobs for the pass's worker processes in tests (a module the workers can import by name)."""

from __future__ import annotations

import time


def span(label: str, seconds: float) -> tuple[str, float, float]:
    """Sleep; the label and when the job ran."""
    start = time.monotonic()
    time.sleep(seconds)
    return label, start, time.monotonic()
