"""A second run on the very files a run of the dataset released: refused before the input pass
(:func:`phsafe.sequence.refuse_released_bytes`), with the refusal the ledger itself gives --
and the ledger's own check (on the content fingerprint) still refuses what the early check lets
through."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import phsafe
from phsafe import engine
from phsafe.errors import AlreadyReleasedError
from tests._ledgers import new_ledger

REPO = Path(__file__).resolve().parents[2]
NEW = "the records of the test"
pytestmark = pytest.mark.noise_not_asserted("the releases' noise is never looked at: only refusals, passes and "
                                            "the ledger's bytes are")


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny input, a config measuring one level of each table, a ledger, and a first release."""
    from phsafe.synthetic import synthesize

    base = tmp_path_factory.mktemp("released-bytes")
    synthesize(base / "data", 200, "01", seed=23)
    config = json.loads((REPO / "demo" / "data" / "us" / "config.json").read_text())
    config.update(state_filter=["01"], dataset="released-bytes")
    for levels in config["privacy_budget"].values():
        for level in levels:
            if level != "state_*":
                levels[level] = 0
    (base / "config.json").write_text(json.dumps(config))
    ledger = new_ledger(base / "enclave", cap=10).path
    first = phsafe.run_private(base / "config.json", base / "data", base / "first", ledger=ledger, validate=False,
                               new_version=NEW)
    return {"base": base, "ledger": ledger, "first": first}


class _PassRan(Exception):
    pass


def _count_passes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every input pass from here on is counted (and still runs)."""
    passes: list[int] = []
    real = engine.validate_and_count

    def counted(*args: Any, **kw: Any) -> Any:
        passes.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(engine, "validate_and_count", counted)
    return passes


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The inputs the early check hashes (by name), in order."""
    import phsafe.reader

    hashed: list[str] = []
    real = phsafe.reader.input_digests

    def counted(files: Any) -> dict[str, str]:
        hashed.extend(f.name for f in files.values())
        return real(files)

    monkeypatch.setattr(phsafe.reader, "input_digests", counted)
    return hashed


def test_the_same_files_are_refused_before_the_pass_with_the_ledgers_message(released, tmp_path, monkeypatch) -> None:
    base, ledger = released["base"], released["ledger"]
    before = ledger.read_bytes()
    passes, hashed = _count_passes(monkeypatch), _count_hashes(monkeypatch)
    with pytest.raises(AlreadyReleasedError) as early:
        phsafe.run_private(base / "config.json", base / "data", tmp_path / "again", ledger=ledger, validate=False,
                           new_version=NEW)
    assert passes == []  # refused before any input was read, validated or counted
    assert sorted(hashed) == ["geo.csv", "persons.csv", "units.csv"]
    assert ledger.read_bytes() == before  # nothing recorded, nothing spent
    assert not (tmp_path / "again").exists()
    message = str(early.value)
    assert message.startswith(f"these records were already released: run {released['first'].run_id} published them "
                              f"to {released['first'].output_dir}"), message
    assert "re_release" in message or "--re-release" in message, message

    # The same records in other bytes (the units' rows in reverse order): not the same files, so
    # the early check lets the run through to the pass -- where the ledger refuses it on the
    # records' content fingerprint, with the very message the early check gave.
    other = tmp_path / "reordered"
    shutil.copytree(base / "data", other)
    header, *rows = (other / "units.csv").read_text().splitlines()
    (other / "units.csv").write_text("\n".join([header, *reversed(rows)]) + "\n")
    hashed.clear()
    with pytest.raises(AlreadyReleasedError) as late:
        phsafe.run_private(base / "config.json", other, tmp_path / "reordered-out", ledger=ledger, validate=False,
                           new_version=NEW)
    assert passes == [1]
    assert hashed == ["units.csv"]  # the smallest input first, and no further once none matches
    assert str(late.value) == message
    assert ledger.read_bytes() == before


def test_a_declared_re_release_or_other_config_is_not_refused_early(released, tmp_path, monkeypatch) -> None:
    """The early check refuses only what the ledger would: a declared re-release goes to the
    pass (and through); another config is another question (no input is even hashed)."""
    base = released["base"]
    enclave = tmp_path / "enclave"
    shutil.copytree(released["ledger"].parent, enclave)  # the module's ledger stays as it was
    ledger = enclave / released["ledger"].name
    passes, hashed = _count_passes(monkeypatch), _count_hashes(monkeypatch)
    again = phsafe.run_private(base / "config.json", base / "data", tmp_path / "again", ledger=ledger, validate=False,
                               re_release="a second release, for the test")
    assert passes == [1] and hashed == []
    assert again.output_dir.is_dir()

    config = json.loads((base / "config.json").read_text())
    config["dataset"] = "released-bytes-other"
    (tmp_path / "other.json").write_text(json.dumps(config))
    with pytest.raises(phsafe.PHSafeError) as refused:
        phsafe.run_private(tmp_path / "other.json", base / "data", tmp_path / "other", ledger=ledger, validate=False,
                           new_version="the same records under a second name")
    assert passes == [1, 1] and hashed == []  # refused by the ledger after the pass, for its own reason
    assert "already declared as dataset 'released-bytes'" in str(refused.value), refused.value
