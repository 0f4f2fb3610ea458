"""Synthetic benchmark datasets, generated once with ``phsafe synth`` and cached under ``benchmarks/_work``.

A cached dataset is ``_work/synth-<persons>-<format>/`` (``us`` states, seed = persons). It is
complete when its ``synth.json`` exists: ``phsafe synth`` moves the files into place only when
they are all written. ``PHSAFE_BENCH_DATA=DIR`` keeps the datasets in ``DIR`` instead (the full
US as CSV is 19 GB: put it on a disk with room).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _measure import Phase, run_phase  # benchmarks/ is the script's directory

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work"
DATA = Path(os.environ.get("PHSAFE_BENCH_DATA") or WORK)
US_CONFIG = HERE.parent.parent / "shared" / "fixtures" / "production_config_us.json"
PHSAFE = str(Path(sys.executable).parent / "phsafe")


def synth_command(n: int, fmt: str, out: Path) -> list[str]:
    """The ``phsafe synth`` command line of a benchmark dataset (documented in the README)."""
    return [PHSAFE, "synth", "--persons", str(n), "--states", "us", "--format", fmt, "--seed", str(n),
            "--out", str(out), "--overwrite", "--quiet"]


def dataset_path(n: int, fmt: str) -> Path:
    return DATA / f"synth-{n}-{fmt}"


def dataset(n: int, fmt: str, states: list[str] | None = None) -> Path:
    """A directory with ``n`` synthetic persons over the 50 states and DC in format ``fmt``.

    ``fmt`` is ``csv``, ``parquet`` or ``parquet-partitioned``. ``states`` is accepted for the
    older scripts and must be the production US states (or None).
    """
    return ensure_dataset(n, fmt)[0]


def ensure_dataset(n: int, fmt: str) -> tuple[Path, Phase | None]:
    """The cached dataset, generating it if missing; the generation's measurements if it ran."""
    path = dataset_path(n, fmt)
    if (path / "synth.json").exists():
        return path, None
    path.parent.mkdir(parents=True, exist_ok=True)
    phase = run_phase("generate", synth_command(n, fmt, path))
    print(f"generated {n:,} persons ({fmt}) in {phase.wall_seconds:.1f} s, peak RSS "
          f"{phase.peak_rss_mib:.0f} MiB -> {path}", file=sys.stderr)
    return path, phase
