"""The input pass cut into pieces (:func:`phsafe.intake.run_cluster_pass`) is the pass on one machine.

* With a plain synchronous ``submit`` (each task called where it is submitted), the cluster pass
  gives the one-process pass's exact counts, content fingerprint and validation report -- for
  national CSV files (records set aside by the state filter, a broken record mid-file) and for
  data stored by state (a folder outside the state filter);
* its pieces, merged in any order (:func:`phsafe.intake.conclude`, the one ``merge``), give the
  same (pieces made here: ``tests/unit/test_pieces.py``);
* data stored by state is read once by the cluster pass too: each file opened for its data once;
* without validation, a broken record stops the cluster pass with the one line the pass on one
  machine gives.
"""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from phsafe import reader
from phsafe.errors import InputError
from phsafe.intake import Piece, PieceCall, conclude, plan_cluster, run_cluster_pass, validated_counts
from phsafe.synthetic import synthesize
from phsafe.tables import TABLES
from tests.conftest import US_CONFIG

STATES = ["01", "02", "06", "11"]
PERSONS = 6_000
KEY = bytes(range(16))
SPECS = list(TABLES.values())


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cluster")
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = [s for s in STATES if s != "02"]  # Alaska's records are set aside
    raw["tau"] = {k: 3 for k in raw["tau"]}
    config = root / "config.json"
    config.write_text(json.dumps(raw))
    out = {"config": config}
    for fmt in ("csv", "parquet-partitioned"):
        out[fmt] = root / fmt
        synthesize(out[fmt], PERSONS, ",".join(STATES), fmt=fmt, seed=7, chunk_persons=2_000)
    broken = root / "broken"
    shutil.copytree(out["csv"], broken)
    lines = (broken / "persons.csv").read_text().splitlines(keepends=True)
    fields = lines[len(lines) // 2].rstrip("\n").split(",")
    fields[5] = "99"  # a RELSHIP outside the code list, mid-file
    lines[len(lines) // 2] = ",".join(fields) + "\n"
    (broken / "persons.csv").write_text("".join(lines))
    out["broken"] = broken
    return out


def _plan(data: dict[str, Path], which: str, spill: Path, *, validate: bool = True):  # noqa: ANN202
    plan = plan_cluster(data["config"], data[which], spill, specs=SPECS, key=KEY, validate=validate,
                        block_bytes=60_000, bucket_persons=1_500)
    assert plan is not None
    return plan


def _same(a, b, what: str) -> None:  # noqa: ANN001
    assert (a is None) == (b is None), what
    if a is None:
        return
    assert a.content == b.content, what
    for name in TABLES:
        for level, cube in a[name].by_level.items():
            np.testing.assert_array_equal(cube, b[name].by_level[level], err_msg=f"{what}: {name} {level}")


def plain_submit(call: PieceCall) -> Piece:
    """The simplest ``submit``: run the task here, now."""
    return call()


@pytest.mark.parametrize("which", ["csv", "parquet-partitioned", "broken"])
def test_cluster_pass_with_a_plain_submit_is_the_pass_on_one_machine_in_any_order(
        data: dict[str, Path], tmp_path: Path, which: str) -> None:
    local, local_report = validated_counts(data["config"], data[which], SPECS, key=KEY)
    assert local_report is not None
    plan = _plan(data, which, tmp_path / "spill")
    assert plan.by_state == (which == "parquet-partitioned")
    submitted: list[str] = []
    pieces: list[Piece] = []

    def submit(call: PieceCall) -> Piece:
        submitted.append(call.name)
        pieces.append(call())
        return pieces[-1]

    counts, report = run_cluster_pass(plan, submit)
    assert report is not None
    assert report.to_text() == local_report.to_text()
    assert report.failures == local_report.failures
    _same(local, counts, which)
    # The same pieces merged in any order (conclude: the one merge, then the report).
    for seed in (1, 2):
        shuffled = list(pieces)
        random.Random(seed).shuffle(shuffled)
        again, again_report = conclude(plan, shuffled)
        assert again_report is not None and again_report.to_text() == report.to_text()
        _same(counts, again, f"{which}, shuffled {seed}")
    if which == "parquet-partitioned":
        assert sorted(n for n in submitted if n.startswith("count-")) == ["count-01", "count-06", "count-11"]
        assert submitted.count("layout-02") == 1  # the folder outside the filter: its layout only
    else:
        assert {"read-geo-1", "read-units-1", "read-persons-1"} <= set(submitted)
        assert sum(n.startswith("read-persons-") for n in submitted) >= 2  # blocks of 60 kB
        assert sum(n.startswith("count-range-") for n in submitted) >= 3
        assert any(n.startswith("settle-state-filter-") for n in submitted)  # Alaska set aside
    if which == "broken":
        assert local is None and not report.ok and "persons.csv [RELSHIP]" in report.to_text()
    else:
        assert report.ok and counts is not None and counts.content.persons > 0


def test_data_stored_by_state_is_read_once(data: dict[str, Path], tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    reads: Counter[str] = Counter()
    parquet_file = reader.pq.ParquetFile

    class CountedParquetFile(parquet_file):  # type: ignore[misc,valid-type]
        def __init__(self, source, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(source, *args, **kwargs)
            self._counted = str(source)

        def iter_batches(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            reads[self._counted] += 1
            return super().iter_batches(*args, **kwargs)

    monkeypatch.setattr(reader.pq, "ParquetFile", CountedParquetFile)
    plan = _plan(data, "parquet-partitioned", tmp_path / "spill")
    counts, report = run_cluster_pass(plan, plain_submit)
    assert report is not None and report.ok and counts is not None
    released = {f"TABBLKST={s}" for s in ("01", "06", "11")}
    files = sorted(str(p) for p in data["parquet-partitioned"].rglob("*.parquet"))
    expected = {f: 1 for f in files if any(part in released for part in Path(f).parts)}
    # Alaska's folder: the MAFIDs of its units and geo (the layout check), never its persons.
    expected.update({f: 1 for f in files if "TABBLKST=02" in f and "/persons/" not in f})
    assert dict(reads) == expected


def test_without_validation_a_broken_record_is_one_line(data: dict[str, Path], tmp_path: Path) -> None:
    from phsafe.intake import exact_counts
    from phsafe.config import load_config

    with pytest.raises(InputError) as here:
        exact_counts(load_config(data["config"]), data["broken"], SPECS, key=KEY)
    plan = _plan(data, "broken", tmp_path / "spill", validate=False)
    with pytest.raises(InputError) as there:
        run_cluster_pass(plan, plain_submit)
    assert (there.value.file, there.value.column) == (here.value.file, here.value.column) == ("persons.csv", "RELSHIP")
