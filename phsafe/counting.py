"""Exact counting: from the input files to the exact (truncated) count cubes of every table.

This is the one entry point the engine and the Prefect flows use to turn ``DATA`` into
:class:`~phsafe.tabulate.TableCounts`: read, preprocess (state filter, geography, group quarters),
truncate-join-count. Nothing here draws noise or touches the ledger; the results are exact and
confidential, so they never leave the process except as sums handed to :mod:`phsafe.noise`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Callable, Sequence

from phsafe.config import PHSafeConfig
from phsafe.preprocess import prepare
from phsafe.reader import read_inputs
from phsafe.tables import TableSpec
from phsafe.tabulate import TableCounts, tabulate

StageTimer = Callable[[str], AbstractContextManager[None]]
"""Called with a stage name; times and logs the ``with`` block (see ``phsafe.engine``)."""


def _no_timer(name: str) -> AbstractContextManager[None]:
    return nullcontext()


def exact_counts(
    config: PHSafeConfig,
    data_dir: Path,
    specs: Sequence[TableSpec],
    *,
    key: bytes | None,
    stage: StageTimer = _no_timer,
) -> dict[str, TableCounts]:
    """Exact count cubes of ``specs`` over the states of ``config``.

    Args:
        config: The run's config (state filter and the truncation thresholds τ).
        data_dir: Folder with the persons, units and geo files.
        specs: Tables to count.
        key: Truncation key; ``None`` counts without truncation (the non-private ground truth).
        stage: Stage timer for progress and logs.

    Raises:
        InputError: An input file is unreadable or has inconsistent codes (nothing is spent).
    """
    with stage("read"):
        inputs = read_inputs(data_dir)
    with stage("preprocess"):
        data = prepare(inputs, config.states)
        del inputs
    with stage("truncate, join and count" if key is not None else "join and count"):
        return tabulate(list(specs), data, taus=dict(config.tau) if key is not None else None, key=key)
