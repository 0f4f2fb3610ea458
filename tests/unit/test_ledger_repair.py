"""``phsafe ledger repair``: its record is written and synced before the tail is cut.

A stop at any step -- after the record, after the cut, after TAIL_REPAIRED, or in the middle of
writing any of them -- leaves a ledger that says what is left to do: ``audit verify`` names the
repair as unfinished (exit 3, never OK), the ledger takes no other entry until it is finished,
and running ``repair`` again finishes it -- the tail the record states is dropped once and
recorded once. A record that does not describe the ledger is refused, nothing changed.
(Every such stop under a power cut is explored in tests/system/test_crash_states.py.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from phsafe import durable
from phsafe.cli.audit import audit
from phsafe.errors import LedgerError
from phsafe.ledger import store as store_mod
from phsafe.ledger.admin import RepairRecord
from phsafe.ledger.store import repair_record_path
from phsafe.publog import open_ledger, repair_ledger
from tests._ledgers import new_ledger, start
from tests.unit.test_ledger import PLAN

TORN = b'{"budget":"0.25","key":"PH1_num/sta'


class Stop(BaseException):
    """A process stopped here (a kill, a power cut): nothing after it runs."""


def _torn(tmp_path: Path) -> tuple[Path, bytes]:
    ledger = new_ledger(tmp_path)
    start(ledger, PLAN, "run-1")
    before = ledger.path.read_bytes()
    with open(ledger.path, "ab") as f:
        f.write(TORN)
    return ledger.path, before


def _verify(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(audit, ["verify", str(path)])
    return result.exit_code, result.output


def _repaired_once(path: Path, before: bytes) -> None:
    data = path.read_bytes()
    assert data.startswith(before) and not repair_record_path(path).exists()
    entries = [json.loads(line) for line in data[len(before):].splitlines()]
    assert [e["kind"] for e in entries] == ["TAIL_REPAIRED"]
    assert entries[0]["dropped_bytes"] == len(TORN)
    assert entries[0]["dropped_sha256"] == hashlib.sha256(TORN).hexdigest()
    code, output = _verify(path)
    assert code == 0 and output.rstrip().endswith("OK"), output


def test_a_torn_tail_is_an_action_not_a_failure_and_repair_records_what_it_drops(tmp_path: Path) -> None:
    path, before = _torn(tmp_path)
    code, output = _verify(path)
    assert code == 3, output
    assert (f"ACTION NEEDED: the ledger ends in an incomplete entry: {len(TORN)} bytes of an interrupted write after "
            "entry") in output and f"`phsafe ledger repair {path}`" in output
    repair = repair_ledger(path)
    assert repair is not None and not repair.finished_earlier
    _repaired_once(path, before)


@pytest.mark.parametrize("step", ["before the cut", "after the cut", "after TAIL_REPAIRED"])
def test_a_repair_stopped_at_any_step_is_named_and_finished_by_running_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    path, before = _torn(tmp_path)
    if step == "before the cut":
        monkeypatch.setattr(durable, "truncate", lambda fd, size: (_ for _ in ()).throw(Stop()))
    elif step == "after the cut":
        monkeypatch.setattr(store_mod.LedgerFile, "append_line", lambda self, line: (_ for _ in ()).throw(Stop()))
    else:
        real = Path.unlink

        def unlink(self: Path, missing_ok: bool = False) -> None:
            if self == repair_record_path(path):
                raise Stop()
            real(self, missing_ok=missing_ok)

        monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(Stop):
        repair_ledger(path)
    monkeypatch.undo()
    record = RepairRecord.decode(repair_record_path(path).read_bytes())
    assert record is not None and record.dropped_sha256 == hashlib.sha256(TORN).hexdigest()
    assert record.kept_bytes == len(before)
    code, output = _verify(path)
    assert code == 3 and "ACTION NEEDED: a repair of the ledger is not finished" in output or \
        "ACTION NEEDED: a repair of the ledger is recorded" in output, output
    assert f"run `phsafe ledger repair {path}` to finish it" in output
    if step == "after the cut":
        assert path.read_bytes() == before  # cut, and the cut is not recorded yet: the record says so
        assert "is not yet in the ledger" in output
        # Nothing else is recorded meanwhile: the repair's entry must come next.
        with pytest.raises(LedgerError, match="a repair of the ledger .* is not finished"):
            start(open_ledger(path), PLAN, "run-2", re_release="again")
    repair = repair_ledger(path)
    assert repair is not None and repair.finished_earlier and repair.seq == record.seq
    _repaired_once(path, before)


def _stopped_before_its_entry(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A repair that cut the tail and stopped before appending its TAIL_REPAIRED entry."""
    monkeypatch.setattr(store_mod.LedgerFile, "append_line", lambda self, line: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        repair_ledger(path)
    monkeypatch.undo()


def test_a_torn_part_of_the_repairs_own_entry_is_cut_and_the_entry_written(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path, before = _torn(tmp_path)
    _stopped_before_its_entry(path, monkeypatch)
    record = RepairRecord.decode(repair_record_path(path).read_bytes())
    assert record is not None
    with open(path, "ab") as f:  # the TAIL_REPAIRED write, cut by a power cut
        f.write(record.entry[:40])
    code, output = _verify(path)
    assert code == 3 and "is not yet in the ledger" in output, output
    assert repair_ledger(path) is not None
    _repaired_once(path, before)


def test_a_record_cut_short_is_written_again(tmp_path: Path) -> None:
    path, before = _torn(tmp_path)
    repair_record_path(path).write_bytes(b'{"format":"phsafe-led')  # its write was cut: nothing was cut after it
    code, output = _verify(path)
    assert code == 3 and "stopped while writing its record" in output, output
    assert repair_ledger(path) is not None
    _repaired_once(path, before)


def test_a_record_that_does_not_describe_the_ledger_is_refused_and_nothing_changes(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path, before = _torn(tmp_path)
    _stopped_before_its_entry(path, monkeypatch)
    with open(path, "ab") as f:  # something else written after the cut: not the repair's entry
        f.write(b'{"kind":"INTENT","key":"PH2')
    data = path.read_bytes()
    with pytest.raises(LedgerError, match="does not describe it"):
        repair_ledger(path)
    assert path.read_bytes() == data and repair_record_path(path).exists()
    code, output = _verify(path)
    assert code == 1 and "does not describe the ledger" in output, output


def test_the_cut_never_happens_before_the_record_is_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = _torn(tmp_path)
    order: list[str] = []
    real_create, real_truncate, real_sync = durable.create, durable.truncate, durable.fsync_folder

    def create(p, data, **kw):  # noqa: ANN001, ANN202
        real_create(p, data, **kw)
        order.append(f"record {Path(p).name}")

    def truncate(fd, size):  # noqa: ANN001, ANN202
        order.append("cut")
        real_truncate(fd, size)

    monkeypatch.setattr(durable, "create", create)
    monkeypatch.setattr(durable, "truncate", truncate)
    repair_ledger(path)
    assert order[:2] == [f"record {repair_record_path(path).name}", "cut"]  # create syncs the file and its folder


def test_a_run_is_refused_in_preflight_while_a_repair_is_unfinished(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Before reading any input: the ledger would refuse the run's first entry anyway, hours later.
    import phsafe
    from tests.unit.test_ledger import US_CONFIG

    path, _ = _torn(tmp_path)
    monkeypatch.setattr(durable, "truncate", lambda fd, size: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        repair_ledger(path)
    monkeypatch.undo()
    with pytest.raises(LedgerError, match=r"a repair of the ledger .* is not finished .*run `phsafe ledger repair"):
        phsafe.run_private(US_CONFIG, tmp_path / "no-inputs-read", tmp_path / "out", ledger=path,
                           dataset="test-data", re_release="again")
