"""The exact sensitivities of ``docs/sensitivity.md``, checked exhaustively on small universes.

For every measured table, tau in {1, 2, 3} (unit tables have none) and every iteration level,
:mod:`tests._sensitivity_universe` enumerates every household of up to tau + 2 persons over the
table's classes of records, every unit record, every neighbour of every dataset of one or two
households, and computes their count vectors with the production tabulation. The largest L1 and
L2 distances must *equal* the proven values of :func:`phsafe.sensitivity.exact` -- below would
mean the proof (or the universe) misses a case, above that a release calibrated to them
under-states its privacy loss. The datasets attaining each maximum are then run through the whole
release path (preprocess, tabulate, the run plan's vectors) and must give the same distances.

Also here: the proof's case of every measurement, the known values at tau in {1, 2, 6, 10}, and
the paper's bound above the exact one everywhere.
"""

from __future__ import annotations

import functools

import pytest

from phsafe.iterations import ALL_LEVELS, GeographyLevel, IterationLevel, PopulationGroupLevel
from phsafe.sensitivity import (
    MeasurementCase,
    SensitivityBound,
    bounded_factor,
    declared,
    encode_l2,
    exact,
    measurement_case,
    paper,
    squared,
)
from phsafe.tables import MEASURED_TABLES, TABLE_LEVELS, TABLES, TableKind

from tests._sensitivity_universe import check, measurement_levels, witness_distances

TAUS = (1, 2, 3)
CASES = [(t, tau) for t in MEASURED_TABLES if TABLES[t].kind is TableKind.PERSON for tau in TAUS] + \
        [(t, None) for t in MEASURED_TABLES if TABLES[t].kind is TableKind.UNIT]


@functools.lru_cache(maxsize=None)
def _checked(table: str, tau: int | None):  # type: ignore[no-untyped-def]
    return check(table, tau)


@pytest.mark.parametrize(("table", "tau"), CASES, ids=[f"{t}-tau{tau}" if tau else t for t, tau in CASES])
def test_the_largest_neighbour_distances_equal_the_proven_sensitivities(table: str, tau: int | None) -> None:
    results = _checked(table, tau)
    assert set(results) == set(TABLES[table].iteration_levels)
    for iteration, r in results.items():
        want = exact(table, iteration, tau)
        where = f"{table} tau={tau} {iteration.value}"
        assert r.neighbour_pairs > 0
        assert (r.l1.value, r.l2_squared.value) == (want.l1, want.l2_squared), where
        # USA levels: both households in the one region. STATE levels: in one state or in two.
        for geography in {lv.geography for lv in measurement_levels(table, iteration)}:
            kinds = ("same",) if geography is GeographyLevel.USA else ("same", "apart")
            got = (max(r.bounded_l1[k].value for k in kinds), max(r.bounded_l2_squared[k].value for k in kinds))
            assert got == (want.bounded_l1, want.bounded_l2_squared), f"{where} {geography.value} bounded"


@pytest.mark.parametrize(("table", "tau"), CASES, ids=[f"{t}-tau{tau}" if tau else t for t, tau in CASES])
def test_the_datasets_attaining_them_do_so_through_the_whole_release_path(table: str, tau: int | None) -> None:
    """The witness datasets, as input columns through preprocess, tabulate and the plan's vectors."""
    for iteration, r in _checked(table, tau).items():
        want = exact(table, iteration, tau)
        keys = {lv: f"{table}/{lv.config_key}" for lv in measurement_levels(table, iteration)}
        unbounded = [(r.l1, 0, want.l1), (r.l2_squared, 1, want.l2_squared)]
        for found, norm, value in unbounded:
            got = witness_distances(table, tau, found.witness, found.states)
            for key in keys.values():
                assert got[key][norm] == value, (key, "unbounded", found.witness)
        for found_by_kind, norm, value in ((r.bounded_l1, 0, want.bounded_l1), (r.bounded_l2_squared, 1,
                                                                                 want.bounded_l2_squared)):
            found = found_by_kind["same"]  # the maximum is attained in one state (so at both geographies)
            got = witness_distances(table, tau, found.witness, found.states)
            for key in keys.values():
                assert got[key][norm] == value, (key, "bounded", found.witness)


# --------------------------------------------------------------------------------------------
# Known answers
# --------------------------------------------------------------------------------------------

_MOVES = MeasurementCase.PERSON_MOVES
_CASE = {
    ("PH1_num", "*"): MeasurementCase.PERSON_FIXED, ("PH1_num", "A-G"): _MOVES, ("PH1_num", "H,I"): _MOVES,
    ("PH2", "*"): _MOVES,
    ("PH3", "*"): _MOVES, ("PH3", "A-G"): _MOVES, ("PH3", "H,I"): _MOVES,
    ("PH4", "*"): MeasurementCase.PERSON_FIXED_FILTERED, ("PH4", "A-G"): _MOVES, ("PH4", "H,I"): _MOVES,
    ("PH6", "*"): _MOVES,
    ("PH7", "*"): _MOVES, ("PH7", "A-G"): _MOVES, ("PH7", "H,I"): _MOVES,
    ("PH1_denom", "*"): MeasurementCase.UNIT_SINGLE, ("PH1_denom", "A-G"): MeasurementCase.UNIT_MOVES,
    ("PH1_denom", "H,I"): MeasurementCase.UNIT_MOVES,
    ("PH5_denom", "*"): MeasurementCase.UNIT_SINGLE, ("PH5_denom", "A-G"): MeasurementCase.UNIT_MOVES,
    ("PH5_denom", "H,I"): MeasurementCase.UNIT_MOVES,
    ("PH8_denom", "*"): MeasurementCase.UNIT_MOVES, ("PH8_denom", "A-G"): MeasurementCase.UNIT_MOVES,
    ("PH8_denom", "H,I"): MeasurementCase.UNIT_MOVES,
}

# (L1, L2 as the ledger writes it) per case at tau = 1, 2, 6, 10, written out by hand from the
# proof: 2 tau and tau sqrt 2; 2 and sqrt 2; max(tau, 2) and max(tau, sqrt 2); 2 and sqrt 2; 1 and 1.
_KNOWN = {
    MeasurementCase.PERSON_MOVES: {1: (2, "sqrt(2)"), 2: (4, "sqrt(8)"), 6: (12, "sqrt(72)"), 10: (20, "sqrt(200)")},
    MeasurementCase.PERSON_FIXED: {1: (2, "sqrt(2)"), 2: (2, "sqrt(2)"), 6: (2, "sqrt(2)"), 10: (2, "sqrt(2)")},
    MeasurementCase.PERSON_FIXED_FILTERED: {1: (2, "sqrt(2)"), 2: (2, 2), 6: (6, 6), 10: (10, 10)},
    MeasurementCase.UNIT_MOVES: {None: (2, "sqrt(2)")},
    MeasurementCase.UNIT_SINGLE: {None: (1, 1)},
}


def test_every_measurement_is_in_the_case_the_proof_gives_it() -> None:
    seen = {(t, lv.iteration.value): measurement_case(TABLES[t], lv) for t in MEASURED_TABLES for lv in TABLE_LEVELS[t]}
    assert seen == _CASE


@pytest.mark.parametrize("tau", [1, 2, 6, 10])
def test_known_sensitivities_per_table_and_level(tau: int) -> None:
    for table in MEASURED_TABLES:
        t = tau if TABLES[table].kind is TableKind.PERSON else None
        for level in TABLE_LEVELS[table]:
            case = _CASE[(table, level.iteration.value)]
            l1, l2 = _KNOWN[case][t]
            s = exact(table, level, t)
            assert (s.l1, encode_l2(s.l2_squared)) == (l1, l2), (table, level)
            assert declared(table, level, t, SensitivityBound.EXACT, l2=False) == l1
            assert declared(table, level, t, SensitivityBound.EXACT, l2=True) == l2
            # Bounded neighbours: twice, in both norms (L2 squared four times).
            assert (s.bounded_l1, s.bounded_l2_squared) == (2 * l1, 4 * squared(l2))
            # The paper's bound: 2 tau + 2 or 2, whatever the level, and above the exact one.
            p = paper(table, t)
            delta = 2 * tau + 2 if t else 2
            assert (p.l1, p.l2_squared) == (delta, delta * delta)
            assert declared(table, level, t, SensitivityBound.PAPER, l2=True) == delta
            assert p.l1 >= s.l1 and p.l2_squared >= s.l2_squared
            assert p.bounded_l1 >= s.bounded_l1 and p.bounded_l2_squared >= s.bounded_l2_squared


def test_the_variance_ratio_of_the_issue_at_production_tau() -> None:
    """Person tables whose unit moves rows: (2 tau + 2)^2 / (2 tau^2) = 2.42 at tau 10, 2.72 at 6;
    unit tables: 2 (4 at the one-cell levels); PH1_num at * 242 and PH4 at * 4.84 at tau 10."""
    ratios = {}
    for table, tau in (("PH1_num", 10), ("PH3", 6), ("PH4", 10), ("PH1_denom", None), ("PH8_denom", None)):
        for level in TABLE_LEVELS[table]:
            ratios[(table, level.config_key)] = paper(table, tau).l2_squared / exact(table, level, tau).l2_squared
    assert ratios[("PH1_num", "state_A-G")] == pytest.approx(2.42)
    assert ratios[("PH3", "usa_*")] == pytest.approx(196 / 72)
    assert ratios[("PH1_num", "usa_*")] == 242 and ratios[("PH4", "state_*")] == 4.84
    assert ratios[("PH1_denom", "usa_*")] == 4 and ratios[("PH1_denom", "usa_A-G")] == 2
    assert ratios[("PH8_denom", "state_*")] == 2


def test_bounded_privacy_loss_factor() -> None:
    """The ledger's rho is unbounded. Bounded: 2 rho with the paper's calibration (its Theorems
    3-4), 4 rho with the exact one; pure DP: 2 epsilon either way."""
    assert bounded_factor(SensitivityBound.PAPER, zcdp=True) == 2
    assert bounded_factor(SensitivityBound.EXACT, zcdp=True) == 4
    assert bounded_factor(SensitivityBound.PAPER, zcdp=False) == bounded_factor(SensitivityBound.EXACT, zcdp=False) == 2
    # ... because every exact bounded sensitivity is exactly twice the unbounded one.
    for table in MEASURED_TABLES:
        for tau in (1, 2, 6, 10):
            t = tau if TABLES[table].kind is TableKind.PERSON else None
            for level in TABLE_LEVELS[table]:
                s = exact(table, level, t)
                assert s.bounded_l2_squared == 4 * s.l2_squared and s.bounded_l1 == 2 * s.l1


@pytest.mark.parametrize("encoded", [0, -2, True, "sqrt(4)", "sqrt(0)", "sqrt(1)", "sqrt(02)", "14.14", "sqrt(2.0)"])
def test_a_sensitivity_has_one_spelling(encoded: object) -> None:
    with pytest.raises(ValueError):
        squared(encoded)  # type: ignore[arg-type]


def test_levels_cover_every_measurement() -> None:
    for table in MEASURED_TABLES:
        levels = [lv for it in TABLES[table].iteration_levels for lv in measurement_levels(table, it)]
        assert len(levels) == len(set(levels)) and set(levels) == set(TABLE_LEVELS[table])
    assert {lv.iteration for lv in ALL_LEVELS} == set(IterationLevel)
    assert all(isinstance(lv, PopulationGroupLevel) for lv in ALL_LEVELS)
