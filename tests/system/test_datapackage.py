"""The labelled data package of real outputs, and reading a release back (issue 16).

A private run (zCDP, the demo data), a non-private run of the same data and a pure-DP Puerto
Rico run each write ``datapackage.json``; ``frictionless validate`` (the library and its
command line) checks every CSV and Parquet resource of each against its schema, and
:func:`phsafe.release.read_release` reads them back typed and labelled.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import frictionless
import pandas as pd
import pytest

from phsafe import synthetic
from phsafe.datapackage import DATAPACKAGE, REGION_NAMES, package_descriptor, write_datapackage
from phsafe.engine import run_nonprivate
from phsafe import run_private
from phsafe.iterations import ITERATION_LABELS
from phsafe.release import ReleaseError, read_release, read_tables
from phsafe.tables import OUTPUT_TABLES, output_spec

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"
FRICTIONLESS_CLI = Path(sys.executable).parent / "frictionless"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("datapackage")
    # Not validated here (validate=False): the inputs are the demo's and synthetic records, valid;
    # the packages written from them are what is tested.
    options = dict(ledger=root / "ledger.jsonl", non_confidential=True, validate=False)
    run_private(DEMO_US / "config.json", DEMO_US, root / "private", **options)
    run_nonprivate(DEMO_US / "config.json", DEMO_US, root / "nonprivate", non_confidential=True)
    pr = root / "pr-data"
    synthetic.write(synthetic.generate(800, ["72"], seed=11), pr)
    raw = json.loads((REPO / "demo" / "data" / "pr" / "config.json").read_text())
    raw["privacy_defn"] = "puredp"
    for levels in raw["privacy_budget"].values():
        for key in levels:
            levels[key] = 0 if key.startswith("usa") else 0.5
    (pr / "config.json").write_text(json.dumps(raw))
    run_private(pr / "config.json", pr, root / "pr-private", ledger=root / "pr-ledger.jsonl", non_confidential=True,
                validate=False)
    return {"private": root / "private", "nonprivate": root / "nonprivate", "pr": root / "pr-private"}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", ["private", "nonprivate", "pr"])
def test_frictionless_validates_every_resource(outputs: dict[str, Path], kind: str) -> None:
    out = outputs[kind]
    report = frictionless.validate(out / DATAPACKAGE)
    assert report.valid, report.flatten(["type", "note"])[:5]
    tables = sorted(p.parent.name for p in out.glob("*/*.csv"))
    assert len(report.tasks) == 2 * len(tables) == 22
    for task in report.tasks:
        assert task.stats["rows"] > 0 and task.stats["fields"] >= 4, task.name


@pytest.mark.parametrize("kind", ["private", "nonprivate"])
def test_frictionless_command_line_validates(outputs: dict[str, Path], kind: str) -> None:
    assert FRICTIONLESS_CLI.exists(), "frictionless's command line is installed with the library"
    done = subprocess.run([str(FRICTIONLESS_CLI), "validate", DATAPACKAGE], cwd=outputs[kind],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "INVALID" not in done.stdout and done.stdout.count("VALID") >= 22


def test_validation_catches_a_value_outside_the_package(outputs: dict[str, Path], tmp_path: Path) -> None:
    """The descriptor constrains the data: a cell number no table has, in a copy, is an error."""
    copy = tmp_path / "tampered"
    shutil.copytree(outputs["private"], copy)
    csv = copy / "PH2" / "PH2.csv"
    lines = csv.read_text().splitlines()
    fields = lines[1].split("|")
    fields[2] = "99"  # PH2_DATA_CELL
    lines[1] = "|".join(fields)
    csv.write_text("\n".join(lines) + "\n")
    report = frictionless.validate(copy / DATAPACKAGE)
    assert not report.valid
    assert {t for t, _ in report.flatten(["type", "note"])} == {"constraint-error"}


def test_package_is_in_the_manifest_and_labels_every_code(outputs: dict[str, Path]) -> None:
    out = outputs["private"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"][DATAPACKAGE] == _sha256(out / DATAPACKAGE)
    package = json.loads((out / DATAPACKAGE).read_text())
    config = json.loads((DEMO_US / "config.json").read_text())
    by_name = {r["name"]: r for r in package["resources"]}
    assert set(by_name) == {n for t in OUTPUT_TABLES for n in (t.lower(), t.lower() + "-parquet")}
    for table in OUTPUT_TABLES:
        csv, parquet = by_name[table.lower()], by_name[table.lower() + "-parquet"]
        assert csv["path"] == f"{table}/{table}.csv" and csv["dialect"]["delimiter"] == "|"
        assert parquet["path"] == f"parquet/{table}.parquet" and parquet["schema"] == csv["schema"]
        fields = {f["name"]: f for f in csv["schema"]["fields"]}
        frame = pd.read_csv(out / csv["path"], sep="|", dtype=str, keep_default_na=False)
        assert list(fields) == list(frame.columns)
        cell = f"{table.upper()}_DATA_CELL"
        labels = {c["value"]: c["label"] for c in fields[cell]["categories"]}
        assert labels == {int(c): output_spec(table).cell_label(int(c)) for c in frame[cell].unique()}
        regions = {c["value"]: c["label"] for c in fields["REGION_ID"]["categories"]}
        assert regions == {"1": "United States", **{s: REGION_NAMES[s] for s in config["state_filter"]}}
        if "ITERATION_CODE" in fields:
            codes = [c["value"] for c in fields["ITERATION_CODE"]["categories"]]
            assert codes == list(ITERATION_LABELS)
        assert "1.645 * sqrt(VARIANCE)" in fields["VARIANCE"]["description"]
        assert [c["value"] for c in fields["NOISE_DISTRIBUTION"]["categories"]] == ["Discrete Gaussian"]
        # The primary key in the order of the columns (a reader that indexes by it pairs them by position).
        key = csv["schema"]["primaryKey"]
        assert key == [c for c in fields if c in key] and key[0] == "REGION_ID" and key[-1] == cell
    assert by_name["ph3"]["schema"]["fields"][3]["categories"][1]["label"] == "Own child: in married couple family"


def test_nonprivate_package_has_aggregate_cells_and_no_noise_columns(outputs: dict[str, Path]) -> None:
    package = json.loads((outputs["nonprivate"] / DATAPACKAGE).read_text())
    assert package["name"] == "phsafe-sdhc-nonprivate"
    ph1_denom = next(r for r in package["resources"] if r["name"] == "ph1_denom")
    names = [f["name"] for f in ph1_denom["schema"]["fields"]]
    assert names == ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "PH1_DENOM_DATA_CELL", "COUNT"]
    cells = ph1_denom["schema"]["fields"][3]["categories"]
    assert [c["value"] for c in cells] == [1, 2, 3] and cells[0]["label"] == "Households"


def test_puerto_rico_pure_dp_package(outputs: dict[str, Path]) -> None:
    package = json.loads((outputs["pr"] / DATAPACKAGE).read_text())
    fields = {f["name"]: f for f in package["resources"][0]["schema"]["fields"]}
    assert fields["REGION_ID"]["categories"] == [{"value": "72", "label": "Puerto Rico"}]
    assert fields["REGION_TYPE"]["constraints"]["enum"] == ["STATE"]
    noise = fields["NOISE_DISTRIBUTION"]["categories"]
    assert [c["value"] for c in noise] == ["Two-Sided Geometric"] and "pure DP" in noise[0]["label"]


def test_write_datapackage_from_the_files_alone(outputs: dict[str, Path], tmp_path: Path) -> None:
    """Without the frames, the descriptor is rebuilt from the Parquet files: the same one."""
    copy = tmp_path / "copy"
    shutil.copytree(outputs["private"], copy)
    (copy / DATAPACKAGE).unlink()
    write_datapackage(copy)
    assert (copy / DATAPACKAGE).read_bytes() == (outputs["private"] / DATAPACKAGE).read_bytes()


def test_descriptor_refuses_an_unlabelled_code() -> None:
    frame = pd.DataFrame({"REGION_ID": ["1"], "REGION_TYPE": ["USA"], "PH2_DATA_CELL": [14], "COUNT": [3]})
    with pytest.raises(ValueError, match="PH2_DATA_CELL: value.*without a label"):
        package_descriptor({"PH2": frame})


@pytest.mark.parametrize("kind", ["private", "nonprivate", "pr"])
def test_every_resource_reads_the_same_through_frictionless_and_read_tables(outputs: dict[str, Path],
                                                                            kind: str) -> None:
    """A data user's two ways in agree: ``frictionless``'s ``to_pandas()`` (which indexes each
    resource by its primary key) and :func:`phsafe.release.read_tables` give, for every CSV and
    Parquet resource, the columns in the schema's order, codes as strings with their leading
    zeros (REGION_ID "1" the nation, "01" Alabama) and the declared types."""
    out = outputs[kind]
    ours = read_tables(out, labels=False)
    package = frictionless.Package(out / DATAPACKAGE)
    assert len(package.resources) == 2 * len(ours) == 22
    for resource in package.resources:
        table = next(t for t in OUTPUT_TABLES if resource.name in (t.lower(), t.lower() + "-parquet"))
        fields = resource.schema.fields
        frame = resource.to_pandas()
        assert list(frame.index.names) == resource.schema.primary_key
        frame = frame.reset_index()
        assert list(frame.columns) == [f.name for f in fields] == list(ours[table].columns), resource.name
        for f in fields:
            column = frame[f.name]
            if f.type == "integer":
                assert column.dtype == "int64", (resource.name, f.name)
            elif f.type == "number":
                assert column.dtype == "float64", (resource.name, f.name)
            else:
                assert column.map(type).eq(str).all(), (resource.name, f.name)
                assert set(column) <= set(f.constraints["enum"]), (resource.name, f.name)
        assert set(frame["REGION_TYPE"]) <= {"USA", "STATE"}, resource.name  # not REGION_ID's values
        assert frame["REGION_ID"].str.fullmatch(r"1|\d\d").all(), resource.name
        expected = ours[table].astype({c: str for c in ours[table].columns if ours[table][c].dtype == "category"})
        pd.testing.assert_frame_equal(frame.astype({c: str for c in expected.columns if expected[c].dtype == object}),
                                      expected, check_dtype=False, obj=resource.name)
    # The warning the README gives: a plain read turns "1" and "01" into the same number.
    plain = pd.read_csv(out / "PH1_num" / "PH1_num.csv", sep="|")
    as_text = pd.read_csv(out / "PH1_num" / "PH1_num.csv", sep="|", dtype={"REGION_ID": str})
    assert as_text["REGION_ID"].str.len().max() == 2 and plain["REGION_ID"].dtype != object


# --------------------------------------------------------------------------------------------
# read_release / read_tables
# --------------------------------------------------------------------------------------------


def test_read_release_typed_and_labelled(outputs: dict[str, Path]) -> None:
    tables = read_release(outputs["private"])
    assert list(tables) == list(OUTPUT_TABLES)
    ph3 = tables["PH3"]
    assert list(ph3.columns) == [
        "REGION_ID", "REGION_ID_LABEL", "REGION_TYPE", "REGION_TYPE_LABEL", "ITERATION_CODE",
        "ITERATION_CODE_LABEL", "PH3_DATA_CELL", "PH3_DATA_CELL_LABEL", "COUNT", "NOISE_DISTRIBUTION", "VARIANCE",
    ]
    assert ph3["COUNT"].dtype == "int64" and ph3["VARIANCE"].dtype == "float64"
    assert ph3["PH3_DATA_CELL"].dtype == "int64"
    assert isinstance(ph3["REGION_ID"].dtype, pd.CategoricalDtype) and ph3["REGION_ID"].dtype.ordered
    # Same values as the published CSV, in the same order.
    csv = pd.read_csv(outputs["private"] / "PH3" / "PH3.csv", sep="|", dtype={"REGION_ID": str})
    assert ph3["COUNT"].tolist() == csv["COUNT"].tolist()
    assert ph3["REGION_ID"].astype(str).tolist() == csv["REGION_ID"].tolist()
    row = ph3[(ph3.REGION_ID == "06") & (ph3.ITERATION_CODE == "D") & (ph3.PH3_DATA_CELL == 4)].iloc[0]
    assert row.REGION_ID_LABEL == "California" and row.ITERATION_CODE_LABEL == "Asian alone"
    assert row.PH3_DATA_CELL_LABEL == "Own child: in married couple family"
    assert row.REGION_TYPE_LABEL == "State"
    # Ordered categories follow the release order: the nation first, then the states.
    assert ph3.sort_values("REGION_ID")["REGION_ID"].iloc[0] == "1"
    assert "ITERATION_CODE" not in tables["PH2"]
    assert "NOISE_DISTRIBUTION_LABEL" not in ph3


def test_read_release_without_labels_and_refusals(outputs: dict[str, Path], tmp_path: Path) -> None:
    plain = read_release(outputs["private"], labels=False)
    assert not any(c.endswith("_LABEL") for f in plain.values() for c in f.columns)
    with pytest.raises(ReleaseError, match="non-private"):
        read_release(outputs["nonprivate"])
    truth = read_tables(outputs["nonprivate"])
    assert list(truth["PH1_denom"]["PH1_DENOM_DATA_CELL"].unique()) == [1, 2, 3]
    assert truth["PH8_num"]["PH8_NUM_DATA_CELL_LABEL"].iloc[1] == "Owner occupied"
    with pytest.raises(ReleaseError, match="holds no output table"):
        read_release(tmp_path)


def test_read_release_checks_the_manifest_digests(outputs: dict[str, Path], tmp_path: Path) -> None:
    copy = tmp_path / "modified"
    shutil.copytree(outputs["private"], copy)
    frame = pd.read_parquet(copy / "parquet" / "PH4.parquet")
    frame.loc[0, "COUNT"] += 1
    frame.to_parquet(copy / "parquet" / "PH4.parquet", index=False)
    with pytest.raises(ReleaseError, match="PH4.parquet differs from its SHA-256"):
        read_release(copy)
    assert read_release(copy, verify=False)["PH4"]["COUNT"].iloc[0] == frame.loc[0, "COUNT"]


def test_read_release_of_a_folder_without_package_or_parquet(outputs: dict[str, Path], tmp_path: Path) -> None:
    """An older folder (CSV only, no datapackage.json) reads the same, labelled from code."""
    copy = tmp_path / "old"
    shutil.copytree(outputs["private"], copy)
    shutil.rmtree(copy / "parquet")
    (copy / DATAPACKAGE).unlink()
    old, new = read_release(copy), read_release(outputs["private"])
    for table in OUTPUT_TABLES:
        pd.testing.assert_frame_equal(old[table], new[table])
