"""A content version is released once (issue 19), through the command line.

The same records -- as typed, with their rows shuffled, or stored as Parquet -- are the same
content version; a second run on them is refused before any spend however much room the
dataset's cap leaves, naming the run that released them and where. A declared re-release
(``--re-release REASON``) is recorded, verified by ``audit verify``, and capped like any run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from phsafe.cli import main
from tests._ledgers import new_ledger

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"
CONFIG = DEMO_US / "config.json"
FILES = ("persons", "units", "geo")


def _entries(ledger: Path) -> list[dict]:
    return [json.loads(line) for line in ledger.read_text().splitlines()]


def _private(out: Path, ledger: Path, *extra: str, data: Path = DEMO_US):
    return CliRunner().invoke(main, ["-q", "private", str(CONFIG), str(data), str(out), "--ledger", str(ledger),
                                     "--no-validate", *extra])


def _shuffled(tmp_path: Path) -> Path:
    folder = tmp_path / "shuffled"
    folder.mkdir()
    for name in FILES:
        frame = pd.read_csv(DEMO_US / f"{name}.csv", dtype=str, keep_default_na=False)
        frame.sample(frac=1, random_state=7).to_csv(folder / f"{name}.csv", index=False)
    return folder


def _as_parquet(tmp_path: Path) -> Path:
    folder = tmp_path / "parquet"
    folder.mkdir()
    for name in FILES:
        frame = pd.read_csv(DEMO_US / f"{name}.csv", dtype=str, keep_default_na=False)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), folder / f"{name}.parquet")
    return folder


def test_the_same_records_are_released_once_whatever_room_the_cap_leaves(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path / "enclave", cap=10).path  # room for seven releases
    first = _private(tmp_path / "out", ledger, "--new-version", "the demo's records")
    assert first.exit_code == 0, first.output
    (started,) = [e for e in _entries(ledger) if e["kind"] == "RUN_STARTED"]
    run_id = started["run_id"]
    size = ledger.stat().st_size

    for label, data in (("as typed", DEMO_US), ("shuffled", _shuffled(tmp_path)), ("parquet", _as_parquet(tmp_path))):
        out = tmp_path / f"again-{label}"
        again = _private(out, ledger, data=data)
        assert again.exit_code == 1, (label, again.output)
        assert f"run {run_id} published them to {tmp_path / 'out'}" in again.output, (label, again.output)
        assert "--re-release" in again.output
        assert ledger.stat().st_size == size, label  # no entry at all: no INTENT
        assert not out.exists()

    # Declared: recorded, and charged against the cap like any run.
    declared = _private(tmp_path / "second", ledger, "--re-release", "an approved second release")
    assert declared.exit_code == 0, declared.output
    entries = _entries(ledger)
    second = [e for e in entries if e["kind"] == "RUN_STARTED"][-1]
    assert second["re_release"] == "an approved second release"
    assert second["spent_before"] == started["planned_total"]
    verified = CliRunner().invoke(main, ["audit", "verify", str(ledger), "--outputs", str(tmp_path / "second")])
    assert verified.exit_code == 0, verified.output
    assert f"run {second['run_id']}: a declared re-release of run(s) {run_id}'s records" in verified.output


def test_a_re_release_is_still_capped_and_a_needless_one_is_not_recorded(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path / "enclave", cap="1.5").path  # one release of the demo's 1.257281
    assert _private(tmp_path / "out", ledger, "--new-version", "the demo's records").exit_code == 0
    size = ledger.stat().st_size
    capped = _private(tmp_path / "again", ledger, "--re-release", "once more")
    assert capped.exit_code == 1 and "lifetime cap" in capped.output and "exceeds the cap" in capped.output
    assert ledger.stat().st_size == size

    # Other records (a new version) are not a re-release: a reason given anyway is not recorded.
    other = tmp_path / "other"
    other.mkdir()
    for name in FILES:
        frame = pd.read_csv(DEMO_US / f"{name}.csv", dtype=str, keep_default_na=False)
        if name == "persons":
            roommate = frame.index[frame["RELSHIP"] == "34"][0]  # a householder's removal breaks the structure
            frame = frame.drop(index=roommate)  # one person fewer
        frame.to_csv(other / f"{name}.csv", index=False)
    ledger2 = new_ledger(tmp_path / "enclave2", cap=10).path
    done = _private(tmp_path / "out2", ledger2, "--new-version", "the records", "--re-release", "not needed", data=other)
    assert done.exit_code == 0, done.output
    assert all("re_release" not in e for e in _entries(ledger2))


def test_resuming_a_run_whose_records_another_run_released_needs_a_declaration(tmp_path: Path, monkeypatch) -> None:
    """Run A fails after spending; run B (declared) releases the same records; resuming A would be
    a third release and says so. The ledger rule is the same one `audit verify` replays."""
    import phsafe.engine
    from phsafe.errors import PHSafeError

    ledger = new_ledger(tmp_path / "enclave", cap=10).path
    original = phsafe.engine.publish_private_run

    def unavailable(*args, **kwargs):  # noqa: ANN001
        raise PHSafeError("the release area is unavailable (injected)")

    monkeypatch.setattr(phsafe.engine, "publish_private_run", unavailable)
    failed = _private(tmp_path / "a", ledger, "--new-version", "the demo's records")
    assert failed.exit_code == 1 and "--resume" in failed.output
    monkeypatch.setattr(phsafe.engine, "publish_private_run", original)
    run_a = [e for e in _entries(ledger) if e["kind"] == "RUN_STARTED"][0]["run_id"]
    # Run A failed: it claims nothing, so B is the records' first release.
    assert _private(tmp_path / "b", ledger).exit_code == 0
    size = ledger.stat().st_size
    resumed = _private(tmp_path / "a", ledger, "--resume", run_a, "--resume-reason", "publish again")
    assert resumed.exit_code == 1 and "resuming run" in resumed.output and "--re-release" in resumed.output
    assert ledger.stat().st_size == size
    resumed = _private(tmp_path / "a", ledger, "--resume", run_a, "--resume-reason", "publish again",
                       "--re-release", "complete A as a second release")
    assert resumed.exit_code == 0, resumed.output
    assert [e["kind"] for e in _entries(ledger)].count("INTENT") == 2 * 46  # A's spends reused, none again


@pytest.mark.parametrize("give_version", [False, True])
def test_a_first_run_without_its_version_is_refused_before_reading(tmp_path: Path, give_version: bool) -> None:
    ledger = new_ledger(tmp_path / "enclave", cap=10).path
    extra = ("--new-version", "the demo's records") if give_version else ()
    result = CliRunner().invoke(main, ["private", str(CONFIG), str(DEMO_US), str(tmp_path / "out"),
                                       "--ledger", str(ledger), *extra])
    if give_version:
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == 1
    assert "no declared content version" in result.output and "--new-version" in result.output
    assert "validate and count" not in result.output  # refused in preflight, before reading the inputs
    assert [e["kind"] for e in _entries(ledger)] == ["LEDGER_INIT"]
