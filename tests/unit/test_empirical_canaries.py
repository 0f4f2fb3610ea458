"""The empirical audit's neighbours: key-invariant canaries, their packing, the auditor's oracle.

The truncation keys here are random (``secrets``), as the release path draws them; every
assertion must hold for every key, so there is no false-failure probability to state.
"""

from __future__ import annotations

import secrets

import numpy as np
import pytest

from phsafe.audit.empirical.audit import AuditSettings, audit_background, plan_audit, production_config
from phsafe.audit.empirical.canaries import candidates, change_norm, household_records, pack
from phsafe.audit.empirical.mechanism import ReleaseMechanism
from phsafe.audit.empirical.oracle import KeyDependentHousehold, expected_counts
from phsafe.audit.empirical.population import TableRecords
from phsafe.engine import exact_vector
from phsafe.iterations import GeographyLevel
from phsafe.sensitivity import MeasurementCase, exact, measurement_case
from phsafe.tables import TABLES, TAU_TABLES
from tests._empirical import small_config as _small_config
from tests.conftest import US_CONFIG

STATES = ["01", "02", "04"]


def small_config(states=STATES, **tau):  # type: ignore[no-untyped-def]
    return _small_config(list(states), **tau)


def test_the_built_in_production_config_is_the_production_fixture() -> None:
    from phsafe.config import load_config

    assert production_config() == load_config(US_CONFIG)


@pytest.mark.noise_not_asserted("fresh truncation keys on purpose: the exact counts must equal the oracle's for every key, "
                                 "so correct code passes whichever keys are drawn")
@pytest.mark.parametrize("table", TAU_TABLES)
def test_canaries_exact_counts_do_not_depend_on_the_truncation_key(table: str) -> None:
    """100 fresh keys: the release path's exact vectors are always the auditor's (oracle) ones."""
    config = small_config()
    settings = AuditSettings(config=config, tables=(table,), background_persons=400, seed=7)
    plan = plan_audit(settings).tables[0]
    background = audit_background(settings)
    from phsafe.audit.empirical.audit import _renumbered  # noqa: PLC0415 -- the audit's own layout step

    records = TableRecords(background, _renumbered(plan.layout, background), config.states, plan.measurements,
                           settings.tau(table))
    mechanism = ReleaseMechanism()
    rng = np.random.default_rng(11)
    included = rng.integers(0, 2, records.n_canaries).astype(bool)
    inputs = records.inputs(included)
    want = records.expected(included)
    # The canaries really are above tau: without the key-invariance, truncation would matter.
    assert any(c.size >= 3 * settings.tau(table) - 1 for c in plan.layout.canaries)
    for _ in range(100):
        counts = mechanism.exact_counts(inputs, config, table, secrets.token_bytes(16))
        for m in plan.measurements:
            assert np.array_equal(exact_vector(m, counts), want[m.level.config_key]), m.key


def test_the_oracle_refuses_a_household_whose_counts_depend_on_the_key() -> None:
    # A lone parent with tau own children and an under-18 grandchild: tau + 1 persons of PH3's
    # universe in two different cells -- which tau are kept depends on the key.
    template = candidates("PH3")[0]
    persons, units = household_records(template, 6, False, mafid=100_000_001)
    persons = {k: np.append(v, v[-1]) for k, v in persons.items()}
    persons["RELSHIP"][-1] = 30
    with pytest.raises(KeyDependentHousehold):
        expected_counts(TABLES["PH3"], 6, persons, units, np.zeros(1, dtype=np.int64), 1)
    # At or below tau persons, nothing is truncated: counted as they are.
    cubes = expected_counts(TABLES["PH3"], 7, persons, units, np.zeros(1, dtype=np.int64), 1)
    assert cubes[TABLES["PH3"].iteration_levels[0]].sum() == 7


@pytest.mark.parametrize("table", list(TABLES))
def test_packing_gives_each_canary_cells_no_other_canary_owns(table: str) -> None:
    config = production_config()
    measurements = ReleaseMechanism().plan(config, table)
    tau = config.tau[TABLES[table].tau_key] if TABLES[table].tau_key else None
    layout = pack(table, [m.level for m in measurements], tau, len(config.states), 800_000_001)
    for m in measurements:
        key = m.level.config_key
        owned: set[int] = set()
        reach = change_norm(layout.reach[key])
        assert layout.owners(key), f"{table} {key}: no canary owns this level"
        for canary in layout.owners(key):
            change = layout.change[canary.index][key]
            # An owner moves the level by the most any candidate does (the level's reach).
            assert change_norm(change.values()) == pytest.approx(reach, rel=1e-12), (key, canary.template.name)
            assert not owned & set(change), (key, canary.template.name)
            owned |= set(change)
            assert all(0 <= c < m.n_cells for c in change)
    # Many canaries per run at the state levels; the nation's cells are shared, so few there.
    states = len(config.states)
    for m in measurements:
        owners = len(layout.owners(m.level.config_key))
        if m.level.geography is GeographyLevel.STATE:
            assert owners >= states
        if m.level.geography is GeographyLevel.USA:
            assert owners <= 14


@pytest.mark.parametrize("table", list(TABLES))
def test_every_level_is_moved_by_its_exact_sensitivity_where_a_key_invariant_neighbour_can(table: str) -> None:
    """The canaries' reach at every level is the exact sensitivity proven in docs/sensitivity.md
    (L2 and L1), except PH1_num at ``*`` (case P-fixed): there attaining sqrt 2 needs truncation to
    swap a kept person for the added one, which depends on the key; its canaries add one person."""
    for tau in (2, 6, 10) if TABLES[table].tau_key else (None,):
        config = production_config()
        measurements = ReleaseMechanism().plan(config, table)
        layout = pack(table, [m.level for m in measurements], tau, 3, 800_000_001)
        for m in measurements:
            proven = exact(table, m.level, tau)
            shape = layout.reach[m.level.config_key]
            if measurement_case(TABLES[table], m.level) is MeasurementCase.PERSON_FIXED:
                assert shape == (1,), (table, m.level.config_key, tau, shape)
                continue
            assert change_norm(shape) ** 2 == pytest.approx(proven.l2_squared), (table, m.level.config_key, tau)
            assert change_norm(shape, l2=False) == proven.l1, (table, m.level.config_key, tau)


def test_the_star_levels_designs() -> None:
    """PH1_num at ``*``: one more person (+1); PH4 at ``*``: a family of tau leaves the universe
    (-tau); PH1_denom at ``*``: a new household (no unit, no geo row without it) (+1); PH5_denom
    at ``*``: a person alone gains a relative and becomes a family (+1)."""
    config = small_config()
    expected = {"PH1_num": (1,), "PH4": (-6,), "PH1_denom": (1,), "PH5_denom": (1,)}
    for table, shape in expected.items():
        measurements = ReleaseMechanism().plan(config, table)
        layout = pack(table, [m.level for m in measurements], 6 if table in ("PH1_num", "PH4") else None,
                      len(config.states), 800_000_001)
        owners = layout.owners("state_*")
        assert owners and {layout.shape(c.index, "state_*") for c in owners} == {shape}, table
        # A canary per cell of the level in each state: PH1_num and PH4 have two (under 18, 18+).
        assert len(owners) == len(config.states) * (2 if table in ("PH1_num", "PH4") else 1), table
    new = next(t for t in candidates("PH1_denom") if t.unit_out is None)
    persons, units = household_records(new, 1, False, 100_000_001)
    assert len(persons["MAFID"]) == 0 and len(units["MAFID"]) == 0
    persons, units = household_records(new, 1, True, 100_000_001)
    assert len(persons["MAFID"]) == 1 and units["HHT"][0] == 4


def test_a_canary_moves_the_household_at_every_level_it_can() -> None:
    """PH3's first canary: own children of a lone mother, then a married couple's (HHT2 06 -> 01,
    CPLT 5 -> 1, HHT 3 -> 1): tau children move cells at the total, race and Hispanic levels."""
    config = small_config()
    measurements = ReleaseMechanism().plan(config, "PH3")
    layout = pack("PH3", [m.level for m in measurements], 6, len(config.states), 800_000_001)
    first = layout.canaries[0]
    assert first.template.unit_out.hht2 == 6 and first.template.unit_in.hht2 == 1
    assert (first.template.unit_in.cplt, first.template.unit_in.hht) == (1, 1)
    assert {m.level.config_key for m in measurements} == set(first.owns)
    persons_in, units_in = household_records(first.template, first.size, True, 100_000_001)
    persons_out, _ = household_records(first.template, first.size, False, 100_000_001)
    assert len(persons_in["MAFID"]) == len(persons_out["MAFID"]) + 1
    assert units_in["FINAL_POP"][0] == len(persons_in["MAFID"]) and units_in["NPF"][0] == len(persons_in["MAFID"])


def test_each_table_is_packed_once_and_as_pack_packs_it() -> None:
    """Audits of the same table, levels, tau and states share one packing (read only), the one
    pack() gives; another seed or calibration does not pack again."""
    settings = AuditSettings(config=small_config(PH3=2), tables=("PH3", "PH8_denom"), sensitivity="both")
    first, again = plan_audit(settings), plan_audit(AuditSettings(config=small_config(PH3=2), tables=("PH3", "PH8_denom"),
                                                                    sensitivity="both", seed=99))
    for a, b in zip(first.tables, again.tables):
        assert a.layout is b.layout
        fresh = pack(a.table, [m.level for m in a.measurements], settings.tau(a.table), len(STATES), 800_000_001)
        assert fresh == a.layout
    by_table = {}
    for t in first.tables:  # both calibrations of a table: one packing
        assert by_table.setdefault(t.table, t.layout) is t.layout
