"""National input files processed within a memory limit: the spilled pass.

The records are small; the memory model is made to believe each row costs 200 kB
(:func:`forced_spill`), so that a limit of a few GiB cuts each partition into MAFID ranges spilled
to the work folder -- the code path of a 331M-person national CSV, on 12,000 persons.

* The spilled pass gives the in-memory pass's exact counts (same truncation key), content
  fingerprint and validation report -- and those of the same records stored by state -- for a
  national CSV, a single Parquet file and states spilled in their turn;
* a private run on the spilled path publishes the same tables and records the same fingerprint;
* an input that cannot be processed within the limit is refused in preflight, in one line, with
  nothing in the ledger;
* spill files exist only under the run's confidential work folder, and are gone after success,
  after a failure and after a resume; a broken record in the middle of a national file is one line
  naming file, column and rule, with nothing spent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner

from phsafe import memory
from phsafe.intake import spill, workers
from phsafe.cli import main
from phsafe.config import load_config
from phsafe.intake import InputPass, exact_counts, validated_counts
from phsafe import run_private
from phsafe.errors import PHSafeError
from phsafe.ledger import read_ledger
from phsafe.measurements import MeasurementStore
from phsafe.synthetic import synthesize
from phsafe.tables import OUTPUT_TABLES, TABLES
from tests._ledgers import new_ledger
from tests.conftest import US_CONFIG

STATES = ["01", "02", "06", "11", "36", "48", "56"]
PERSONS = 12_000
KEY = bytes(range(16))
SPECS = list(TABLES.values())
LIMIT = int(2.6 * (1 << 30))
"""With rows of 200 kB, a limit that cuts these inputs into about five MAFID ranges, counted one at
a time in the pass's process."""
LIMIT_PARALLEL = 4 << 30
"""A limit with room for two ranges at once: counted in two worker processes."""


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same records as one national CSV, one Parquet file each, and stored by state."""
    root = tmp_path_factory.mktemp("national")
    out = {}
    for fmt in ("csv", "parquet", "parquet-partitioned"):
        out[fmt] = root / fmt
        synthesize(out[fmt], PERSONS, ",".join(STATES), fmt=fmt, seed=2023, chunk_persons=2_000)
    return out


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = [s for s in STATES if s != "02"]  # Alaska's records are set aside
    raw["tau"] = {k: 3 for k in raw["tau"]}  # small tau: truncation matters
    path = tmp_path_factory.mktemp("config") / "config.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.fixture
def forced_spill(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Rows of 200 kB and buckets of at least 500 persons; returns the buckets read back."""
    monkeypatch.setattr(memory, "BYTES_PER_ROW", {"persons": 200_000, "units": 200_000, "geo": 200_000})
    monkeypatch.setattr(memory, "MIN_BUCKET_PERSONS", 500)
    buckets: list[str] = []
    load = InputPass._load_bucket

    def spy(self, part, spilled, bucket):  # type: ignore[no-untyped-def]
        assert spilled.folder.is_dir()
        buckets.append(f"{part.label}:{bucket}")
        return load(self, part, spilled, bucket)

    monkeypatch.setattr(InputPass, "_load_bucket", spy)
    in_workers = workers.WorkerProcesses.map

    def spy_workers(self, fn, calls, **kwargs):  # type: ignore[no-untyped-def]
        buckets.extend(f"worker:{fn.__name__}:{getattr(call[-1], 'label', call[1])}" for call in calls)
        return in_workers(self, fn, calls, **kwargs)

    monkeypatch.setattr(workers.WorkerProcesses, "map", spy_workers)
    return buckets


def _same_counts(a, b, what: str) -> None:  # noqa: ANN001
    assert set(a) == set(b), what
    for name in a:
        for level, cube in a[name].by_level.items():
            np.testing.assert_array_equal(b[name].by_level[level], cube, err_msg=f"{what}: {name} {level}")
    assert a.content == b.content, f"{what}: content fingerprint"


@pytest.mark.parametrize("key", [KEY, None], ids=["truncated", "untruncated"])
def test_spilled_counts_are_those_in_memory_and_by_state(datasets: dict[str, Path], config_path: Path,
                                                         key: bytes | None, forced_spill: list[str],
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(config_path)
    big = 1 << 50  # a limit nothing exceeds: in memory
    reference = exact_counts(config, datasets["csv"], SPECS, key=key, memory_limit=big)
    assert sum(int(c.sum()) for c in reference["PH1_num"].by_level.values()) > 0
    _same_counts(reference, exact_counts(config, datasets["parquet-partitioned"], SPECS, key=key, memory_limit=big),
                 "stored by state, in memory")
    assert not forced_spill
    one_at_a_time = int(1.6 * (1 << 30))  # without validation: no room for two ranges at once
    for fmt, limit, workers in (("csv", one_at_a_time, False), ("csv", LIMIT_PARALLEL, True),
                                ("parquet", one_at_a_time, False), ("parquet-partitioned", one_at_a_time, False)):
        forced_spill.clear()
        monkeypatch.setattr(memory, "WORKERS_MIN_PERSONS", 1000 if workers else 1 << 40)
        spilled = exact_counts(config, datasets[fmt], SPECS, key=key, memory_limit=limit,
                               spill_dir=tmp_path / fmt / "spill")
        assert len(forced_spill) >= 3, forced_spill  # cut in MAFID ranges
        assert all(b.startswith("worker") == workers for b in forced_spill), forced_spill
        assert not (tmp_path / fmt / "spill").exists()
        _same_counts(reference, spilled, f"{fmt}, spilled" + (" (worker processes)" if workers else ""))


def test_states_counted_in_worker_processes_are_those_counted_in_one(
        datasets: dict[str, Path], config_path: Path, forced_spill: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Data stored by state: the states read, validated and counted two at a time in worker
    processes give the counts, fingerprint and validation report of the pass in one process."""
    import pyarrow.parquet as pq

    bad = tmp_path / "bad"
    shutil.copytree(datasets["parquet-partitioned"], bad)
    for state, value in (("48", "9Z"), ("06", "X1")):  # irregular values, counted apart in two processes
        persons = bad / "persons" / f"TABBLKST={state}" / "part-0.parquet"
        table = pq.read_table(persons)
        relship = table.column("RELSHIP").to_pylist()
        relship[len(relship) // 2] = value
        pq.write_table(table.set_column(table.schema.get_field_index("RELSHIP"), "RELSHIP",
                                        pa.array(relship, pa.string())), persons)
    config = load_config(config_path)
    found = {}
    for label, threshold in (("one process", 1 << 40), ("worker processes", 1000)):
        monkeypatch.setattr(memory, "WORKERS_MIN_PERSONS", threshold)
        forced_spill.clear()
        counts = exact_counts(config, datasets["parquet-partitioned"], SPECS, key=KEY, memory_limit=1 << 50)
        _, report = validated_counts(config_path, bad, SPECS, key=KEY, memory_limit=1 << 50)
        assert any("count_state" in b for b in forced_spill) == (label == "worker processes"), forced_spill
        found[label] = counts, report
    (counts, report), (counts_w, report_w) = found["one process"], found["worker processes"]
    _same_counts(counts, counts_w, "states in worker processes")
    assert report is not None and report_w is not None and not report.ok
    assert report_w.to_text() == report.to_text() and report_w.failures == report.failures
    assert "persons [RELSHIP]" in report.to_text() and "TABBLKST=<state> folders" in report.to_text()
    assert "(2 failing rows)" in report.to_text() and "9Z" not in report.to_text()


def _break_mid_file(source: Path, target: Path) -> None:
    """A copy of a national CSV dataset with broken records in the middle of its files."""
    shutil.copytree(source, target)
    persons = (target / "persons.csv").read_text().splitlines(keepends=True)
    mid = len(persons) // 2
    for offset, column, value in ((0, 2, "117"), (5, 5, "9Z"), (9, 1, "12345")):
        fields = persons[mid + offset].rstrip("\n").split(",")
        fields[column] = value
        persons[mid + offset] = ",".join(fields) + "\n"
    (target / "persons.csv").write_text("".join(persons))
    units = (target / "units.csv").read_text().splitlines(keepends=True)
    units.insert(len(units) // 2, units[len(units) // 2 + 3])  # a MAFID twice
    (target / "units.csv").write_text("".join(units))


def test_spilled_validation_reports_what_the_pass_in_memory_reports(datasets: dict[str, Path], config_path: Path,
                                                                    forced_spill: list[str], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad"
    _break_mid_file(datasets["csv"], bad)
    reports = {}
    for label, limit in (("in memory", 1 << 50), ("spilled", LIMIT), ("worker processes", LIMIT_PARALLEL)):
        forced_spill.clear()
        monkeypatch.setattr(memory, "WORKERS_MIN_PERSONS", 1000 if label == "worker processes" else 1 << 40)
        counts, reports[label] = validated_counts(config_path, bad, SPECS, key=KEY, memory_limit=limit,
                                                  spill_dir=tmp_path / "spill")
        assert counts is None and reports[label] is not None and not reports[label].ok
        assert bool(forced_spill) == (label != "in memory")
        assert any(b.startswith("worker") for b in forced_spill) == (label == "worker processes")
    for label in ("spilled", "worker processes"):
        assert reports[label].to_text() == reports["in memory"].to_text(), label
        assert reports[label].failures == reports["in memory"].failures
        assert reports[label].set_aside == reports["in memory"].set_aside and reports[label].set_aside["persons"]
    text = reports["spilled"].to_text()
    for value in ("117", "9Z", "12345"):
        assert value not in text
    assert "persons.csv [RELSHIP]" in text and "units.csv [MAFID]: MAFID is unique" in text
    # The valid records validate the same, spilled or stored by state.
    for data in (datasets["csv"], datasets["parquet-partitioned"]):
        counts, report = validated_counts(config_path, data, SPECS, key=KEY, memory_limit=LIMIT,
                                          spill_dir=tmp_path / "spill")
        assert report is not None and report.ok and counts is not None, report.to_text()


def _infinity_config(config_path: Path, tmp_path: Path) -> Path:
    raw = json.loads(config_path.read_text())
    raw["privacy_budget"] = {t: {lv: float("inf") for lv in levels} for t, levels in raw["privacy_budget"].items()}
    config = tmp_path / "infinity.json"
    config.write_text(json.dumps(raw))  # Python's json writes Infinity
    return config


def _spill_watch(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every spill folder a pass makes."""
    made: list[Path] = []
    part_folder = spill.SpillArea.part_folder

    def watch(self):  # type: ignore[no-untyped-def]
        folder = part_folder(self)
        made.append(folder)
        return folder

    monkeypatch.setattr(spill.SpillArea, "part_folder", watch)
    return made


def test_a_spilled_private_run_publishes_the_same_tables_and_fingerprint(
        datasets: dict[str, Path], config_path: Path, forced_spill: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = _infinity_config(config_path, tmp_path)
    ledger = new_ledger(tmp_path, cap="inf", non_confidential=True).path
    made = _spill_watch(monkeypatch)
    import phsafe.engine as engine

    hashed_again: list[dict] = []
    digest_files = engine.input_digests
    monkeypatch.setattr(engine, "input_digests", lambda files: hashed_again.append(files) or digest_files(files))
    runs = {}
    for fmt, limit in (("parquet-partitioned", 1 << 50), ("csv", LIMIT)):
        forced_spill.clear()
        runs[fmt] = run_private(config, datasets[fmt], tmp_path / f"out-{fmt}",
                                ledger=ledger, non_confidential=True, truncation_key=KEY.hex(), memory_limit=limit)
        assert bool(forced_spill) == (fmt == "csv")
    # The CSV files were hashed as they were read: one read of their bytes, whose digests the
    # ledger records; the Parquet folders (read column by column) are hashed on their own.
    assert len(hashed_again) == 1 and all(f.directory for f in hashed_again[0].values())
    from phsafe.reader import file_digest

    recorded_digests = read_ledger(ledger).runs[runs["csv"].run_id].input_digests
    assert recorded_digests == {f"{s}.csv": file_digest(datasets["csv"] / f"{s}.csv") for s in ("persons", "units", "geo")}
    # Spill files only in the run's confidential work folder, gone once it published.
    assert made and all(f.is_relative_to(runs["csv"].run_dir / "spill") for f in made), made
    assert not (runs["csv"].run_dir / "spill").exists()
    assert not any(p.name.startswith("spill") for p in runs["csv"].output_dir.rglob("*"))
    for table in OUTPUT_TABLES:
        a = pd.read_csv(runs["csv"].output_dir / table / f"{table}.csv", sep="|", dtype=str)
        b = pd.read_csv(runs["parquet-partitioned"].output_dir / table / f"{table}.csv", sep="|", dtype=str)
        pd.testing.assert_frame_equal(a, b, obj=table)
    recorded = read_ledger(ledger).runs
    assert recorded[runs["csv"].run_id].fingerprint == recorded[runs["parquet-partitioned"].run_id].fingerprint


def test_spill_files_are_removed_after_a_failure_and_a_resume(
        datasets: dict[str, Path], config_path: Path, forced_spill: list[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = _infinity_config(config_path, tmp_path)
    ledger = new_ledger(tmp_path, cap="inf", non_confidential=True).path
    options = dict(ledger=ledger, non_confidential=True, memory_limit=LIMIT)
    made = _spill_watch(monkeypatch)

    # A failure in the pass itself: the counting refuses (nothing spent).
    import phsafe.counting as counting

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected")

    with monkeypatch.context() as m:
        m.setattr(counting, "tabulate", broken)
        with pytest.raises(PHSafeError, match="could not complete"):  # validation's own wrapper
            run_private(config, datasets["csv"], tmp_path / "out0", **options)
    assert made and not any(f.exists() for f in made)
    assert not read_ledger(ledger).runs  # nothing was started in the ledger

    # A failure after spending, then a resume whose work folder holds a killed attempt's spill.
    original, saved = MeasurementStore.save, []

    def save(store, key, vector):  # type: ignore[no-untyped-def]
        saved.append(key)
        if len(saved) == 3:
            raise OSError("injected")
        return original(store, key, vector)

    with monkeypatch.context() as m:
        m.setattr(MeasurementStore, "save", save)
        with pytest.raises(OSError):
            run_private(config, datasets["csv"], tmp_path / "out", **options)
    (run_id, run), = read_ledger(ledger).runs.items()
    assert run.status.value == "failed" and run.intents
    work = ledger.parent / "runs" / run_id
    assert not (work / "spill").exists()
    leftover = work / "spill" / "part-0001" / "persons" / "bucket=0"
    leftover.mkdir(parents=True)
    (leftover / "block-000000-0.arrow").write_bytes(b"records of a killed attempt")
    made.clear()
    result = run_private(config, datasets["csv"], tmp_path / "out", **options, resume=run_id)
    assert made and all(f.is_relative_to(work / "spill") for f in made)
    assert not (work / "spill").exists() and result.output_dir.is_dir()


def _invoke(*args: object):  # noqa: ANN202
    return CliRunner().invoke(main, [str(a) for a in args])


def test_inputs_too_large_for_the_limit_are_refused_in_preflight(datasets: dict[str, Path], config_path: Path,
                                                                 tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path, cap=10).path
    before = ledger.read_text()
    refused = _invoke("-q", "private", config_path, datasets["csv"], tmp_path / "out", "--ledger", ledger,
                      "--dataset", "test", "--new-version", "test records", "--memory-limit", "64M")
    assert refused.exit_code == 1
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("phsafe: error: the inputs need more than "
                                                                         "the memory limit")
    # No log file: the console (inside the enclave) gets the figures; with --log they go there.
    assert "--memory-limit" in refused.stderr and "; at least " in refused.stderr and "GiB" in refused.stderr
    logged = _invoke("-q", "private", config_path, datasets["csv"], tmp_path / "out", "--ledger", ledger,
                     "--dataset", "test", "--new-version", "test records", "--memory-limit", "64M",
                     "--log", tmp_path / "run.jsonl")
    assert logged.exit_code == 1 and "GiB" not in logged.stderr
    assert logged.stderr.startswith("phsafe: error: the inputs need more than the memory limit; the figures are in "
                                    f"the enclave log at {tmp_path / 'run.jsonl'} (give --memory-limit more"), \
        logged.stderr
    assert ledger.read_text() == before  # no RUN_STARTED, no INTENT: nothing spent
    assert not (tmp_path / "out").exists()
    validate = _invoke("-q", "validate", config_path, datasets["csv"], "--memory-limit", "64M")
    assert validate.exit_code == 1 and validate.stderr.count("\n") == 1 and "--memory-limit" in validate.stderr
    bad_size = _invoke("private", config_path, datasets["csv"], tmp_path / "out", "--ledger", ledger,
                       "--memory-limit", "lots")
    assert bad_size.exit_code == 2 and "is not a size" in bad_size.stderr


def test_a_broken_record_mid_file_is_one_line_and_nothing_is_spent(datasets: dict[str, Path], config_path: Path,
                                                                   forced_spill: list[str], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    made = _spill_watch(monkeypatch)
    bad = tmp_path / "bad"
    _break_mid_file(datasets["csv"], bad)
    ledger = new_ledger(tmp_path, cap=10).path
    before = ledger.read_text()
    work = tmp_path / "work"
    args = ["-q", "private", config_path, bad, tmp_path / "out", "--ledger", ledger, "--dataset", "test",
            "--new-version", "test records",
            "--memory-limit", f"{LIMIT}", "--work-dir", work]
    strict = _invoke(*args, "--no-validate")
    assert strict.exit_code == 1 and made  # stopped while it streamed the file into its MAFID ranges
    assert strict.stderr.count("\n") == 1, strict.stderr
    assert strict.stderr.startswith("phsafe: error: persons.csv, column ") and "(1 row)" in strict.stderr
    made.clear()
    validated = _invoke(*args)
    assert validated.exit_code == 1 and made and forced_spill
    assert "persons.csv [RELSHIP]: RELSHIP is one of the codes" in validated.stderr
    assert "persons.csv [QAGE]: QAGE is between 0 and 115 (1 failing row)" in validated.stderr
    for result in (strict, validated):  # no value of the file (the lines naming paths aside)
        shown = [line for line in (result.stderr + result.stdout).splitlines() if str(tmp_path) not in line]
        for value in ("117", "9Z", "12345"):
            assert not any(value in line for line in shown), shown
    assert ledger.read_text() == before  # nothing spent
    assert not (tmp_path / "out").exists()
    assert not [p for p in work.rglob("*") if "spill" in p.name]  # no spill file left behind
    assert all(f.is_relative_to(work) and not f.exists() for f in made)


def test_worker_processes_start_what_fits_the_budget_and_answer_in_order() -> None:
    # Costs 3, 9, 3, 8, 2 with a budget of 10 on two processes: 9 waits for the first 3 and runs
    # alone, then 3 beside 8, then 2 -- no two jobs over the budget at once, the answers in the
    # calls' order. (Timing is observed, never asserted: which jobs overlap follows from the
    # budget, not from how fast the machine is.)
    from phsafe.intake.workers import WorkerProcesses
    from tests.system._pass_jobs import span

    costs = [3, 9, 3, 8, 2]
    calls = [(f"job{i}", 0.3) for i in range(len(costs))]
    with WorkerProcesses(2) as pool:
        answers = list(pool.map(span, calls, costs=costs, budget=10))
    assert [a[0] for a in answers] == [c[0] for c in calls]
    runs = {label: (start, end) for label, start, end in answers}
    cost = {f"job{i}": c for i, c in enumerate(costs)}
    for a in runs:
        for b in runs:
            if a < b and runs[a][0] < runs[b][1] and runs[b][0] < runs[a][1]:  # ran at the same time
                assert cost[a] + cost[b] <= 10, (a, b)
    assert runs["job0"][0] <= min(start for start, _ in runs.values())  # the calls' order first


# ------------------------------------------------------------------------------ the second process
_FORKED_SECOND_PROCESS = r"""
import atexit, sys
import numpy as np
import pandas as pd
from phsafe.validation import _gx, _worker

atexit.register(lambda: open(sys.argv[1], "a").write("exit handler\n"))
assert _worker.can_fork() and "great_expectations" not in sys.modules
second = _worker.SecondProcess()
assert isinstance(second.process, _worker._Forked)
frame = pd.DataFrame({"QAGE": [10.0, 40.0, np.nan, 131.0, 16.0],
                      "RELSHIP": pd.Series(["20", "20", "20", "34", "21"], dtype="str")})
weights = np.array([3, 1000, 7, 5, 2], dtype=np.int64)
rule_ids = ("persons.QAGE.range", "persons.RELSHIP.domain")
results = second.submit(_gx.Job("persons", "persons", rule_ids, frame, weights)).result(timeout=600)
second.close()
assert "great_expectations" not in sys.modules  # imported by the copy only
print(second.process.returncode, [(r.rule_id, r.success, r.counts) for r in results])
"""


def test_the_second_process_is_this_one_forked_when_no_other_thread_runs(tmp_path: Path) -> None:
    """A fresh interpreter (one thread) forks its second process: the copy imports Great
    Expectations itself, answers as an evaluation here would (the counts of
    test_weighted_counts_are_the_counts_of_every_row), exits 0 when its jobs end, and runs none of
    the caller's exit handlers (they ran once: the caller's)."""
    exits = tmp_path / "exits.txt"
    done = subprocess.run([sys.executable, "-c", _FORKED_SECOND_PROCESS, str(exits)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (
        "0 [('persons.QAGE.range', False, {'element_count': 1017, 'unexpected_count': 5, 'missing_count': 7}), "
        "('persons.RELSHIP.domain', True, {})]")
    assert exits.read_text() == "exit handler\n"
