"""The structure the counting relies on, checked on every run -- validated or not.

``--no-validate`` skips the Great Expectations suites, never these: a record the join cannot place
would be counted wrongly, or silently not at all, and no noise fixes that. Checked on a
partition's MAFID join (:class:`phsafe.preprocess.Join`), before its tables are counted, so a
run that breaks one stops before any budget is spent:

* a MAFID is unique in units and in geo (among the rows the state filter keeps);
* every unit has its geo row and every geo row its unit, and every person a unit (and so a
  geography);
* every household (a housing unit, RTYPE 2, with a household type, HHT ≠ 0) has exactly one
  householder (RELSHIP 20).

Codes in range are checked as each column is read (:func:`phsafe.reader.encode`). With validation
the suites report the same rules, with counts, in the report; this module then adds nothing.
A refusal names the file, the column and the rule, with a number of rows -- never a value.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from phsafe.errors import InputError
from phsafe.preprocess import Join
from phsafe.reader import Columns
from phsafe.schema import RELSHIP_HOUSEHOLDER, RTYPE_UNIT_HU

__all__ = ["check_structure"]


def check_structure(join: Join, units: Columns, persons: Columns, files: Mapping[str, str]) -> None:
    """Refuse a partition whose records break a structural invariant (see the module docstring).

    Args:
        join: The partition's MAFID join of its kept records.
        units, persons: The kept rows' columns (codes), in the order of the join's keys.
        files: The name of each input (``{"units": "units.csv", ...}``; with the partition of
            data stored by state), for the message.

    Raises:
        InputError: The first invariant broken, with its number of rows.
    """
    geo = join.geo
    n_geo = len(geo.index)

    def refuse(stem: str, column: str, rule: str, rows: int) -> None:
        raise InputError(files[stem], column, f"{rule} (checked even without validation)", rows=rows)

    repeated = int(np.count_nonzero(join.unit_rows > 1))
    if repeated:
        refuse("units", "MAFID", "every MAFID is unique in units", repeated)
    repeated = int(np.count_nonzero(geo.kept > 1))
    if repeated:
        refuse("geo", "MAFID", "every MAFID is unique in geo", repeated)

    in_geo = np.zeros(join.n_keys, dtype=bool)
    in_geo[:n_geo] = geo.kept > 0
    has_unit = join.unit_rows > 0
    unplaced = int(np.count_nonzero(has_unit & ~in_geo))
    if unplaced:
        refuse("units", "MAFID", "every unit's MAFID is in geo", unplaced)
    unplaced = int(np.count_nonzero(in_geo & ~has_unit))
    if unplaced:
        refuse("geo", "MAFID", "every geo MAFID is in units", unplaced)

    person_key = join.person_key
    has_unit_of = np.concatenate([has_unit, [False]])  # key -1 (no unit, no geo) reads the last entry
    homeless = int(np.count_nonzero(~has_unit_of[person_key]))
    if homeless:
        refuse("persons", "MAFID", "every person's MAFID is in units", homeless)

    first = join.unit_first
    with_unit = first >= 0
    household = np.zeros(join.n_keys, dtype=bool)
    rows = first[with_unit]
    household[with_unit] = (units["RTYPE"][rows] == RTYPE_UNIT_HU) & (units["HHT"][rows] > 0)
    heads = person_key[(persons["RELSHIP"] == RELSHIP_HOUSEHOLDER) & (person_key >= 0)]
    householders = np.bincount(heads, minlength=join.n_keys)
    wrong = int(np.count_nonzero(household & (householders[: join.n_keys] != 1)))
    if wrong:
        refuse("units", "persons.RELSHIP", "every household has exactly one householder (RELSHIP 20)", wrong)
