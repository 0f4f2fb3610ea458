"""Synthetic benchmark datasets, generated once and cached under ``benchmarks/_work``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
US_CONFIG = HERE.parent.parent / "shared" / "fixtures" / "production_config_us.json"


def dataset(n: int, fmt: str, states: list[str]) -> Path:
    """A directory with ``n`` synthetic persons over ``states`` in format ``fmt`` (csv/parquet)."""
    from phsafe.synthetic import generate, write

    path = HERE / "_work" / f"{n}-{fmt}"
    if not (path / f"persons.{fmt}").exists():
        path.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        write(generate(n, states, seed=n), path, fmt=fmt)
        print(f"generated {n:,} persons in {time.perf_counter() - start:.1f} s -> {path}", file=sys.stderr)
    return path
