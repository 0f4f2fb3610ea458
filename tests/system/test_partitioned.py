"""Data stored by state (Parquet partitioned as ``persons/TABBLKST=06/part-0.parquet``).

* Partitioned and unpartitioned inputs holding the same records give identical exact counts --
  truncated (a fixed key) and untruncated -- however the counting is cut: whole states, states
  sliced into MAFID ranges, MAFID ranges of one CSV, partitions counted in any order after a
  pickle round trip (as on a cluster);
* a private run with Infinity budgets publishes the same tables from CSV and from partitions;
* a layout that is not "every record in its state's folder" stops the run with an InputError;
* the digest of a folder input is stable, independent of where the folder is, and changes when
  any of its files changes, moves or appears; single-file digests are the file's SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from phsafe.config import load_config
from phsafe.counting import combine_counts
from phsafe.intake import exact_counts, validate_inputs
from phsafe import run_private
from phsafe.errors import InputError
from phsafe.reader import input_digests, locate_inputs, read_inputs
from phsafe.synthetic import synthesize
from phsafe.tables import OUTPUT_TABLES, TABLES
from phsafe.tabulate import TableCounts

from tests.conftest import US_CONFIG

STATES = ["01", "02", "06", "11", "36", "48", "56"]
PERSONS = 12_000
SEED = 2020
KEY = bytes(range(16))
SPECS = list(TABLES.values())


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same records in the three formats (generation does not depend on the format)."""
    root = tmp_path_factory.mktemp("partitioned")
    out = {}
    for fmt in ("csv", "parquet", "parquet-partitioned"):
        out[fmt] = root / fmt
        # Small chunks: California is generated in several chunks, like a big state at scale.
        synthesize(out[fmt], PERSONS, ",".join(STATES), fmt=fmt, seed=SEED, chunk_persons=2_000)
    return out


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = [s for s in STATES if s != "02"]  # Alaska's folder is not read
    raw["tau"] = {k: 3 for k in raw["tau"]}  # small tau: truncation matters
    path = tmp_path_factory.mktemp("config") / "config.json"
    path.write_text(json.dumps(raw))
    return path


def assert_same_counts(a: dict[str, TableCounts], b: dict[str, TableCounts], what: str) -> None:
    assert set(a) == set(b), what
    for name in a:
        assert set(a[name].by_level) == set(b[name].by_level), (what, name)
        for level, cube in a[name].by_level.items():
            np.testing.assert_array_equal(b[name].by_level[level], cube, err_msg=f"{what}: {name} {level}")


def test_layout_is_hive_partitioned_by_state(datasets: dict[str, Path]) -> None:
    root = datasets["parquet-partitioned"]
    for stem in ("persons", "units", "geo"):
        folders = sorted(p.name for p in (root / stem).iterdir())
        assert folders == [f"TABBLKST={s}" for s in sorted(STATES)], stem
        for s in STATES:
            assert [p.name for p in (root / stem / f"TABBLKST={s}").iterdir()] == ["part-0.parquet"]
    geo = pq.read_table(root / "geo" / "TABBLKST=06" / "part-0.parquet")
    assert set(geo.column("TABBLKST").to_pylist()) == {"06"}
    files = locate_inputs(root)
    assert all(f.partitioned for f in files.values())
    assert {f.name for f in files.values()} == {"persons", "units", "geo"}


def test_same_records_in_every_format(datasets: dict[str, Path]) -> None:
    tables = {fmt: read_inputs(d) for fmt, d in datasets.items()}
    for stem in ("persons", "units", "geo"):
        ref = tables["csv"]
        for fmt, t in tables.items():
            a, b = getattr(ref, stem), getattr(t, stem)
            order_a, order_b = np.lexsort(tuple(a.values())), np.lexsort(tuple(b.values()))
            for col in a:
                np.testing.assert_array_equal(a[col][order_a], b[col][order_b], err_msg=f"{fmt} {stem} {col}")


@pytest.mark.parametrize("key", [KEY, None], ids=["truncated", "untruncated"])
def test_partitioned_and_unpartitioned_counts_are_identical(
    datasets: dict[str, Path], config_path: Path, key: bytes | None
) -> None:
    config = load_config(config_path)
    reference = exact_counts(config, datasets["csv"], SPECS, key=key)
    assert sum(int(c.sum()) for c in reference["PH1_num"].by_level.values()) > 0
    for fmt in ("parquet", "parquet-partitioned"):
        assert_same_counts(reference, exact_counts(config, datasets[fmt], SPECS, key=key), fmt)


def test_no_released_state_in_the_data_counts_zeros(datasets: dict[str, Path], tmp_path: Path) -> None:
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = ["05", "09"]
    (tmp_path / "c.json").write_text(json.dumps(raw))
    config = load_config(tmp_path / "c.json")
    counts = exact_counts(config, datasets["parquet-partitioned"], SPECS, key=KEY)
    assert all(cube.shape[0] == 2 and not cube.any() for c in counts.values() for cube in c.by_level.values())


def test_combine_counts_rejects_mismatches() -> None:
    with pytest.raises(ValueError):
        combine_counts([])


# --------------------------------------------------------------------------------------------
# The private run
# --------------------------------------------------------------------------------------------


def test_private_run_with_infinity_budget_is_identical(
    datasets: dict[str, Path], config_path: Path, tmp_path: Path
) -> None:
    raw = json.loads(config_path.read_text())
    raw["privacy_budget"] = {t: {lv: float("inf") for lv in levels} for t, levels in raw["privacy_budget"].items()}
    config = tmp_path / "infinity.json"
    config.write_text(json.dumps(raw))  # Python's json writes Infinity
    key_hex = KEY.hex()
    outs = {}
    for fmt in ("csv", "parquet-partitioned"):
        outs[fmt] = tmp_path / f"out-{fmt}"
        run_private(config, datasets[fmt], outs[fmt], ledger=tmp_path / f"ledger-{fmt}.jsonl", non_confidential=True,
                    truncation_key=key_hex)
    for table in OUTPUT_TABLES:
        a = pd.read_csv(outs["csv"] / table / f"{table}.csv", sep="|", dtype=str)
        b = pd.read_csv(outs["parquet-partitioned"] / table / f"{table}.csv", sep="|", dtype=str)
        pd.testing.assert_frame_equal(a, b, obj=table)
    # The folder inputs' digests are confidential lineage: in the ledger, not in the manifest.
    manifest = json.loads((outs["parquet-partitioned"] / "manifest.json").read_text())
    assert "inputs" not in manifest
    from phsafe.ledger import read_ledger

    (run,) = read_ledger(tmp_path / "ledger-parquet-partitioned.jsonl").runs.values()
    assert set(run.input_digests) == {"persons", "units", "geo"}


# --------------------------------------------------------------------------------------------
# Layout violations: a record outside its state's folder stops the run before any spending
# --------------------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _move(root: Path, stem: str, src_state: str, dst_state: str) -> None:
    """Move a state's file of ``stem`` into another state's folder (same contents)."""
    src = root / stem / f"TABBLKST={src_state}" / "part-0.parquet"
    src.rename(root / stem / f"TABBLKST={dst_state}" / "part-1.parquet")
    (root / stem / f"TABBLKST={src_state}").rmdir()


@pytest.mark.parametrize("stem, rule", [
    ("geo", "stored in the partition folder of its own state"),
    ("persons", "no geo row in the same partition"),
    ("units", "no geo row in the same partition"),
])
def test_records_outside_their_state_folder_are_rejected(
    datasets: dict[str, Path], config_path: Path, tmp_path: Path, stem: str, rule: str
) -> None:
    root = _copy(datasets["parquet-partitioned"], tmp_path / "data")
    _move(root, stem, "11", "01")
    config = load_config(config_path)
    with pytest.raises(InputError, match=rule):
        exact_counts(config, root, SPECS, key=KEY)


def test_a_mafid_in_two_states_is_rejected(datasets: dict[str, Path], config_path: Path, tmp_path: Path) -> None:
    root = _copy(datasets["parquet-partitioned"], tmp_path / "data")
    # Wyoming's geo rows copied, with Alaska's state code, into Alaska's folder.
    wy = pq.read_table(root / "geo" / "TABBLKST=56" / "part-0.parquet").to_pandas()
    wy["TABBLKST"] = "02"
    pq.write_table(pq.read_table(root / "geo" / "TABBLKST=02" / "part-0.parquet").schema.empty_table()
                   .from_pandas(wy, preserve_index=False), root / "geo" / "TABBLKST=02" / "part-1.parquet")
    with pytest.raises(InputError, match="more than one state") as refused:
        exact_counts(load_config(config_path), root, SPECS, key=KEY)
    assert "geo" in str(refused.value)


@pytest.mark.parametrize("make_bad, rule", [
    (lambda root: (root / "persons" / "TABBLKST=06").rename(root / "persons" / "STATE=06"), "TABBLKST"),
    (lambda root: (root / "persons" / "TABBLKST=06").rename(root / "persons" / "TABBLKST=6"), "2-digit"),
    (lambda root: (root / "units" / "TABBLKST=06" / "notes.txt").write_text("x"), "only Parquet"),
    (lambda root: shutil.copy(root / "units" / "TABBLKST=06" / "part-0.parquet", root / "units" / "x.parquet"),
     "mixes"),
])
def test_malformed_folders_are_rejected(datasets: dict[str, Path], tmp_path: Path, make_bad, rule: str) -> None:
    root = _copy(datasets["parquet-partitioned"], tmp_path / "data")
    make_bad(root)
    with pytest.raises(InputError, match=rule):
        locate_inputs(root)


def test_hidden_and_underscore_files_are_ignored(datasets: dict[str, Path], tmp_path: Path) -> None:
    root = _copy(datasets["parquet-partitioned"], tmp_path / "data")
    before = input_digests(locate_inputs(root))
    (root / "persons" / "_SUCCESS").write_text("")
    (root / "persons" / "TABBLKST=06" / ".part-0.parquet.crc").write_text("x")
    assert input_digests(locate_inputs(root)) == before


# --------------------------------------------------------------------------------------------
# Digests
# --------------------------------------------------------------------------------------------


def _expected_directory_digest(folder: Path) -> str:
    """The documented rule, written out independently."""
    h = hashlib.sha256(b"phsafe directory digest v1\n")
    for rel in sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.parquet")):
        h.update(rel.encode() + b"\0" + hashlib.sha256((folder / rel).read_bytes()).hexdigest().encode() + b"\n")
    return h.hexdigest()


def test_digests(datasets: dict[str, Path], tmp_path: Path) -> None:
    root = datasets["parquet-partitioned"]
    digests = input_digests(locate_inputs(root))
    assert digests == input_digests(locate_inputs(root))
    assert digests == {stem: _expected_directory_digest(root / stem) for stem in ("persons", "units", "geo")}
    # Independent of the folder's location.
    assert input_digests(locate_inputs(_copy(root, tmp_path / "elsewhere"))) == digests
    # Single files: the SHA-256 of their bytes, as before.
    csv = datasets["csv"]
    assert input_digests(locate_inputs(csv)) == {
        f"{s}.csv": hashlib.sha256((csv / f"{s}.csv").read_bytes()).hexdigest() for s in ("persons", "units", "geo")}


@pytest.mark.parametrize("change", ["modify", "move", "add", "remove"])
def test_directory_digest_changes_with_any_file(datasets: dict[str, Path], tmp_path: Path, change: str) -> None:
    root = _copy(datasets["parquet-partitioned"], tmp_path / "data")
    before = input_digests(locate_inputs(root))
    target = root / "units" / "TABBLKST=56" / "part-0.parquet"
    if change == "modify":
        table = pq.read_table(target)
        pq.write_table(table.slice(1), target)
    elif change == "move":
        (root / "units" / "TABBLKST=56").rename(root / "units" / "TABBLKST=57")
    elif change == "add":
        shutil.copy(target, target.with_name("part-1.parquet"))
    else:
        shutil.rmtree(root / "units" / "TABBLKST=56")
    after = input_digests(locate_inputs(root))
    assert after["units"] != before["units"]
    assert after["persons"] == before["persons"] and after["geo"] == before["geo"]


# --------------------------------------------------------------------------------------------
# Validation reads the folders too
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def all_states_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Validation wants every geo state in the filter (the engine merely skips the others)."""
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = STATES
    path = tmp_path_factory.mktemp("config") / "all.json"
    path.write_text(json.dumps(raw))
    return path


def test_validation_accepts_partitioned_data(datasets: dict[str, Path], all_states_config: Path) -> None:
    report = validate_inputs(all_states_config, datasets["parquet-partitioned"])
    assert report.ok, report.to_text()


def test_validation_reports_a_malformed_folder(datasets: dict[str, Path], all_states_config: Path,
                                               tmp_path: Path) -> None:
    root = _copy(datasets["parquet-partitioned"], tmp_path / "data")
    (root / "geo" / "TABBLKST=06").rename(root / "geo" / "TABBLKST=6")
    report = validate_inputs(all_states_config, root)
    assert not report.ok
    assert any("2-digit" in f.rule for f in report.failures), report.to_text()


def test_validation_shows_each_file_of_each_released_state_read(datasets: dict[str, Path], config_path: Path) -> None:
    from phsafe.progress import PlainProgress

    lines: list[str] = []
    progress = PlainProgress(lines.append)
    with progress.stage("validate"):
        report = validate_inputs(config_path, datasets["parquet-partitioned"], progress=progress)
    assert report.ok, report.to_text()
    released = len(STATES) - 1  # Alaska's folders are set aside, not read
    assert any(line.startswith(f"phsafe: read, check and join: {3 * released} files, geo ") and " kB" in line
               for line in lines), lines

    lines.clear()
    with progress.stage("validate"):
        assert validate_inputs(config_path, datasets["csv"], progress=progress).ok
    assert any(line.startswith("phsafe: read, check and join: 3 files, geo.csv ") for line in lines), lines


@pytest.mark.parametrize("workers", [True, False])
def test_the_pass_hashes_the_folders_it_reads_as_the_ledger_does(
        datasets: dict[str, Path], config_path: Path, monkeypatch: pytest.MonkeyPatch, workers: bool) -> None:
    # States counted in worker processes hash the folders they read (and the pass the folders
    # outside the state filter: Alaska's): the run need not read the files again, and the digests
    # are those the ledger would compute (reader.input_digests). In one process: left to the run.
    from phsafe import memory

    monkeypatch.setattr(memory, "WORKERS_MIN_PERSONS", 1000 if workers else 1 << 40)
    data = datasets["parquet-partitioned"]
    counts = exact_counts(load_config(config_path), data, SPECS, key=KEY, memory_limit=1 << 40)
    if workers:
        assert counts.input_digests == input_digests(locate_inputs(data))
    else:
        assert counts.input_digests is None
    csv = exact_counts(load_config(config_path), datasets["csv"], SPECS, key=KEY, memory_limit=1 << 40)
    assert csv.input_digests == input_digests(locate_inputs(datasets["csv"]))
