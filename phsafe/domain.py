"""The full public domain of each measurement (spec §4, §6).

The released regions come from public information only: the nation (``USA``, id ``1``) and the
configured ``state_filter`` -- never from which states happen to hold records. A measurement's
count vector covers regions x iteration codes x basis cells, zeros included, in this order
(row-major), which is also the order of its digest in the audit ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from phsafe.config import PHSafeConfig
from phsafe.iterations import GeographyLevel, PopulationGroupLevel
from phsafe.tables import TableSpec

USA_REGION_ID = "1"


def regions(geography: GeographyLevel, config: PHSafeConfig) -> tuple[str, ...]:
    """Region ids released at ``geography``: ``("1",)`` for USA, sorted states for STATE."""
    if geography is GeographyLevel.USA:
        if config.is_puerto_rico:
            return ()
        return (USA_REGION_ID,)
    return config.states


@dataclass(frozen=True)
class Domain:
    """The cells of one measurement, in vector order."""

    geography: GeographyLevel
    region_ids: tuple[str, ...]
    iteration_codes: tuple[str, ...]
    cells: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.region_ids), len(self.iteration_codes), len(self.cells))

    @property
    def size(self) -> int:
        r, i, c = self.shape
        return r * i * c

    def frame(self) -> pd.DataFrame:
        """One row per cell, in vector order: REGION_ID, REGION_TYPE, ITERATION_CODE, CELL."""
        r, i, c = self.shape
        return pd.DataFrame(
            {
                "REGION_ID": np.repeat(np.array(self.region_ids, dtype=object), i * c),
                "REGION_TYPE": self.geography.value,
                "ITERATION_CODE": np.tile(np.repeat(np.array(self.iteration_codes, dtype=object), c), r),
                "CELL": np.tile(np.array(self.cells, dtype=np.int64), r * i),
            }
        )


def measurement_domain(
    spec: TableSpec, level: PopulationGroupLevel, config: PHSafeConfig, *, cells: tuple[int, ...] | None = None
) -> Domain:
    """The domain of ``spec`` at ``level``: basis cells unless ``cells`` is given."""
    return Domain(
        geography=level.geography,
        region_ids=regions(level.geography, config),
        iteration_codes=level.iteration.codes,
        cells=spec.basis_numbers if cells is None else cells,
    )


def domain_size(spec: TableSpec, level: PopulationGroupLevel, config: PHSafeConfig) -> int:
    return measurement_domain(spec, level, config).size
