"""Post-processing a private release end to end: every estimate file from the release folder alone,
the command, its refusals."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from phsafe import postprocess as pp
from tests.conftest import US_CONFIG


# --------------------------------------------------------------------------------------------
# The command on a real private output
# --------------------------------------------------------------------------------------------

STATES = ["01", "06"]
FAST_LIMIT = 2_000_000


@pytest.fixture(scope="module")
def private_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A published private output of synthetic data with the production (US) budgets; the
    input data is deleted afterwards, so nothing can read it."""
    from phsafe import synthetic
    from phsafe import run_private

    root = tmp_path_factory.mktemp("pp")
    data = root / "data"
    synthetic.write(synthetic.generate(1500, STATES, seed=11), data)
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = STATES
    config = root / "config.json"
    config.write_text(json.dumps(raw))
    out = root / "out"
    run_private(config, data, out, ledger=root / "ledger.jsonl", non_confidential=True)
    shutil.rmtree(data)
    config.unlink()
    return out


def test_postprocess_writes_every_table_with_documented_columns(private_output: Path, tmp_path: Path) -> None:
    dest = tmp_path / "pp"
    # Nation-level averages beyond 2 million lattice points are sampled here (the lattices
    # themselves are tested against brute force in test_estimates.py): the test stays fast.
    result = pp.postprocess(private_output, dest, draws=200, seed=5, exact_limit=FAST_LIMIT)
    assert result.destination == dest
    for table in ("PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_num", "PH5_denom", "PH6", "PH7", "PH8_num",
                  "PH8_denom"):
        frame = pd.read_csv(dest / f"{table}.csv", sep="|", dtype={"REGION_ID": str})
        source = pd.read_csv(private_output / table / f"{table}.csv", sep="|", dtype={"REGION_ID": str})
        assert list(frame.columns) == list(source.columns) + list(pp.COUNT_COLUMNS)
        marginals = pp.shells.marginal_cells(table)
        groups = len(source.drop_duplicates([c for c in ("REGION_ID", "REGION_TYPE", "ITERATION_CODE") if c in source]))
        assert len(frame) == len(source) + groups * len(marginals)  # every released and marginal cell
        released = frame.merge(source, on=list(source.columns), how="inner")
        assert len(released) == len(source)
        assert (frame["CI90_LOWER"] >= 0).all() and (frame["ESTIMATE"] >= 0).all()
        assert (frame["CI90_LOWER"] <= frame["CI90_UPPER"]).all()
        parquet = pd.read_parquet(dest / f"{table}.parquet")
        assert list(parquet.columns) == list(frame.columns) and len(parquet) == len(frame)
    for name in ("PH1", "PH5", "PH8"):
        frame = pd.read_csv(dest / f"{name}.csv", sep="|", dtype={"REGION_ID": str})
        assert list(frame.columns) == [*pp.GROUP_KEYS, f"{name}_DATA_CELL", *pp.AVERAGE_COLUMNS]
        assert set(frame[f"{name}_DATA_CELL"]) == {1, 2, 3}
        ok = frame["ESTIMATE"].notna()
        assert ok.all()  # noisy denominators: always a posterior
        assert ((frame["CI90_LOWER"] <= frame["MEDIAN"]) & (frame["MEDIAN"] <= frame["CI90_UPPER"])).all()
        assert ((frame["LOWER_BOUND"] <= frame["ESTIMATE"]) & (frame["ESTIMATE"] <= frame["UPPER_BOUND"])).all()
        assert (frame["CI90_LOWER"] >= frame["LOWER_BOUND"]).all() and (frame["CI90_UPPER"] <= frame["UPPER_BOUND"]).all()
    meta = json.loads((dest / "postprocess.json").read_text())
    assert meta["seed"] == 5 and meta["draws"] == 200 and meta["source"]["run_id"]
    assert meta["tau"] == json.loads(US_CONFIG.read_text())["tau"]  # from the release's manifest
    assert "CI90_LOWER" in (dest / "README.md").read_text()
    # same seed, same results
    again = pp.postprocess(private_output, tmp_path / "pp2", draws=200, seed=5, exact_limit=FAST_LIMIT)
    assert (dest / "PH8.csv").read_bytes() == (again.destination / "PH8.csv").read_bytes()


def test_postprocess_never_reads_input_data(private_output: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the output directory is read: the data is gone, the reader fails if called, and an
    audit hook sees every file opened by Python."""
    import phsafe.reader

    def forbidden(*args, **kwargs):
        raise AssertionError("post-processing called the input reader")

    for name in ("read_inputs", "locate_inputs", "input_digests"):
        if hasattr(phsafe.reader, name):
            monkeypatch.setattr(phsafe.reader, name, forbidden)
    pp.postprocess(private_output, tmp_path / "warm", draws=20, seed=1, exact_limit=FAST_LIMIT)  # imports happen here
    opened: list[tuple[str, str]] = []
    active = [True]

    def hook(event: str, args: tuple) -> None:
        if active[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            mode = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
            flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            writing = any(c in mode for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR))
            opened.append((os.path.abspath(path), "w" if writing else "r"))

    sys.addaudithook(hook)
    dest = tmp_path / "dest"
    try:
        pp.postprocess(private_output, dest, draws=20, seed=1, exact_limit=FAST_LIMIT)
    finally:
        active[0] = False
    root = private_output.resolve()
    dest = dest.resolve()

    def own_output(p: Path) -> bool:  # what postprocess wrote (read back to hash it), and fsyncs
        return (p == dest.parent or p.is_relative_to(dest)
                or any(part.startswith(".dest.partial-") for part in p.relative_to(dest.parent).parts[:1])
                if p.is_relative_to(dest.parent) else False)

    ignore = tuple(str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}) + ("/proc", "/sys", "/dev")
    reads = {Path(p).resolve() for p, m in opened if m == "r" and not p.startswith(ignore)}
    writes = {Path(p).resolve() for p, m in opened if m == "w"}
    assert any(p.is_relative_to(root) for p in reads), "the audit hook saw no read of the outputs"
    assert [p for p in reads if not (p.is_relative_to(root) or own_output(p))] == []
    assert writes and [p for p in writes if not own_output(p) or p == dest.parent] == []


def test_postprocess_command_takes_only_the_output_directory(private_output: Path, tmp_path: Path) -> None:
    from phsafe.cli import main

    command = main.commands["postprocess"]
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    assert [a.name for a in arguments] == ["output"]
    dest = tmp_path / "cli"
    result = CliRunner().invoke(main, ["postprocess", str(private_output), "--dest", str(dest), "--draws", "50",
                                       "--seed", "3", "--exact-limit", str(FAST_LIMIT)])
    assert result.exit_code == 0, result.output
    assert (dest / "PH1.csv").is_file() and (dest / "PH1.parquet").is_file()
    again = CliRunner().invoke(main, ["postprocess", str(private_output), "--dest", str(dest)])
    assert again.exit_code == 1 and "already exists" in again.output


def test_postprocess_refuses_what_it_cannot_use(private_output: Path, tmp_path: Path) -> None:
    with pytest.raises(pp.PostprocessError, match="outside the output directory"):
        pp.postprocess(private_output, private_output / "pp")
    with pytest.raises(pp.PostprocessError, match="does not exist"):
        pp.postprocess(tmp_path / "missing", tmp_path / "x")
    nonprivate = tmp_path / "np" / "PH2"
    nonprivate.mkdir(parents=True)
    (nonprivate / "PH2.csv").write_text("REGION_ID|REGION_TYPE|PH2_DATA_CELL|COUNT\n1|USA|1|5\n")
    with pytest.raises(pp.PostprocessError, match="not a private output"):
        pp.postprocess(tmp_path / "np", tmp_path / "y")
    tampered = tmp_path / "tampered"
    shutil.copytree(private_output, tampered)
    with open(tampered / "PH2" / "PH2.csv", "a") as fh:
        fh.write("\n")
    with pytest.raises(pp.PostprocessError, match="SHA-256"):
        pp.postprocess(tampered, tmp_path / "z")
    assert not (tmp_path / "z").exists()
