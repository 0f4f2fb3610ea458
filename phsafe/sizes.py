"""Sizes in bytes as operators type and read them: ``8G``, ``512M``, ``12.5GiB``; ``11.8 GiB``.

Units are binary (K = 1024 bytes, G = 1024^3): memory is counted in them. A leaf module: the
parameters of a run (:mod:`phsafe.parameters`), the memory plan (:mod:`phsafe.memory`) and the
command line all read sizes the same way.
"""

from __future__ import annotations

import re

__all__ = ["GIB", "MIB", "parse_size", "format_size"]

GIB = 1 << 30
MIB = 1 << 20

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*$")
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """``"8G"``, ``"8GiB"``, ``"8GB"``, ``"512M"``, ``"12.5g"``, ``"8589934592"`` -> bytes.

    Raises:
        ValueError: Not a positive size.
    """
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        if not m:
            raise ValueError(f"{text!r} is not a size (e.g. 8G, 512M, 12.5GiB)")
        value = int(float(m.group(1)) * _SCALE[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def format_size(n: int) -> str:
    """Bytes for people: ``11.8 GiB``, ``640 MiB``."""
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    return f"{max(1, round(n / MIB))} MiB"
