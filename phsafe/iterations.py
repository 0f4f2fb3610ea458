"""Race and ethnicity iterations and population-group levels (spec §3).

The mapping from a race code and an ethnicity to iteration codes is written here once; every
table that iterates (by the person's or by the householder's characteristics) uses
:func:`iteration_index`.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


class GeographyLevel(enum.Enum):
    """Geographic level of a population group."""

    USA = "USA"
    STATE = "STATE"

    @property
    def config_prefix(self) -> str:
        return self.value.lower()

    @property
    def label(self) -> str:
        """What the output's ``REGION_TYPE`` value means (spec §4)."""
        return _GEOGRAPHY_LABELS[self]


_GEOGRAPHY_LABELS: dict[GeographyLevel, str] = {
    GeographyLevel.USA: "Nation",
    GeographyLevel.STATE: "State",
}


class IterationLevel(enum.Enum):
    """Iteration level: which race/ethnicity groups a record is counted in."""

    TOTAL = "*"
    RACE_ALONE = "A-G"
    HISPANIC = "H,I"

    @property
    def codes(self) -> tuple[str, ...]:
        """The released iteration codes of this level, in output order."""
        return _CODES[self]


ITERATION_LABELS: dict[str, str] = {
    "*": "Total (all races and ethnicities)",
    "A": "White alone",
    "B": "Black or African American alone",
    "C": "American Indian and Alaska Native alone",
    "D": "Asian alone",
    "E": "Native Hawaiian and Other Pacific Islander alone",
    "F": "Some Other Race alone",
    "G": "Two or more races",
    "H": "Hispanic or Latino",
    "I": "White alone, not Hispanic or Latino",
}
"""Iteration code -> label (spec §3)."""

_CODES: dict[IterationLevel, tuple[str, ...]] = {
    IterationLevel.TOTAL: ("*",),
    IterationLevel.RACE_ALONE: ("A", "B", "C", "D", "E", "F", "G"),
    IterationLevel.HISPANIC: ("H", "I"),
}

# Race codes 01..06 are the six single races in the order A..F; 07..63 are combinations (G).
_RACE_MIN, _RACE_SINGLE_MAX, _RACE_MAX = 1, 6, 63
NOT_IN_LEVEL = -1
"""Index returned for a record that belongs to no population group of a level."""


@dataclass(frozen=True, order=True)
class PopulationGroupLevel:
    """A (geography level, iteration level) pair; each has its own budget and noise."""

    geography: GeographyLevel
    iteration: IterationLevel

    @functools.cached_property  # asked in inner loops (the audit's packing); fields are frozen
    def config_key(self) -> str:
        """The key of this level in ``config.json``'s ``privacy_budget`` entries."""
        return f"{self.geography.config_prefix}_{self.iteration.value}"

    def __str__(self) -> str:
        return self.config_key


ALL_LEVELS: tuple[PopulationGroupLevel, ...] = tuple(
    PopulationGroupLevel(g, i) for g in GeographyLevel for i in IterationLevel
)
TOTAL_ONLY_LEVELS: tuple[PopulationGroupLevel, ...] = tuple(
    PopulationGroupLevel(g, IterationLevel.TOTAL) for g in GeographyLevel
)


def iteration_index(
    level: IterationLevel,
    race: npt.NDArray[np.integer],
    hispanic: npt.NDArray[np.integer],
) -> npt.NDArray[np.int8]:
    """Index into ``level.codes`` of each record's iteration code, or ``NOT_IN_LEVEL``.

    Args:
        level: The iteration level.
        race: Race codes as integers (``"01"`` -> 1, ..., ``"63"`` -> 63).
        hispanic: Ethnicity as integers (1 not Hispanic, 2 Hispanic).

    Raises:
        ValueError: A race code outside 1..63 or an ethnicity outside {1, 2} was given; the
            caller turns this into an error naming the input column. Codes outside the domain
            never silently fall into a group.
    """
    race = np.asarray(race)
    hispanic = np.asarray(hispanic)
    if level is IterationLevel.TOTAL:
        return np.zeros(race.shape, dtype=np.int8)
    if race.size and (race.min() < _RACE_MIN or race.max() > _RACE_MAX):
        raise ValueError("race code outside 01..63")
    if hispanic.size and not np.isin(hispanic, (1, 2)).all():
        raise ValueError("ethnicity outside {1, 2}")
    if level is IterationLevel.RACE_ALONE:
        # 01..06 -> A..F (0..5); 07..63 -> G (6).
        return (np.minimum(race, _RACE_SINGLE_MAX + 1) - 1).astype(np.int8)
    if level is IterationLevel.HISPANIC:
        out = np.full(race.shape, NOT_IN_LEVEL, dtype=np.int8)
        out[hispanic == 2] = 0  # H: Hispanic or Latino, any race
        out[(hispanic == 1) & (race == 1)] = 1  # I: White alone, not Hispanic
        return out
    raise AssertionError(level)
