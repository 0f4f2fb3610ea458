"""phsafe synth end to end: the command writes every format, refuses bad arguments in one line, and
what it writes passes phsafe validate."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest


def test_command_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from phsafe.cli import main

    out = tmp_path / "cli"
    result = CliRunner().invoke(main, ["synth", "--persons", "300", "--states", "01,06", "--out", str(out),
                                       "--format", "parquet", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["geo.parquet", "persons.parquet",
                                                     "synth.json", "units.parquet"]
    assert len(pd.read_parquet(out / "persons.parquet")) == 300


# --------------------------------------------------------------------------------------------
# synthesize: data of any size, chunk by chunk, in three formats
# --------------------------------------------------------------------------------------------

from phsafe.cli.synth import synth  # noqa: E402
from phsafe.synthetic import synthesize  # noqa: E402


def test_synth_command(tmp_path: Path) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(synth, ["--persons", "2k", "--out", str(tmp_path / "d"), "--states", "pr",
                                        "--format", "parquet-partitioned", "--seed", "4", "--quiet"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "d" / "persons" / "TABBLKST=72" / "part-0.parquet").exists()
    again = CliRunner().invoke(synth, ["--persons", "2k", "--out", str(tmp_path / "d"), "--states", "pr", "--seed", "4"])
    assert again.exit_code == 1 and "--overwrite" in again.output
    bad = CliRunner().invoke(synth, ["--persons", "10", "--out", str(tmp_path / "e"), "--states", "01,72", "--seed", "4"])
    assert bad.exit_code == 2


@pytest.mark.parametrize("fmt", ["csv", "parquet-partitioned"])
def test_generated_data_passes_validation(tmp_path: Path, fmt: str) -> None:
    from phsafe.intake import validate_inputs

    from tests.conftest import PR_CONFIG, US_CONFIG

    synthesize(tmp_path, 30_000, "all", fmt=fmt, seed=21)  # type: ignore[arg-type]
    for name, config in (("us", US_CONFIG), ("pr", PR_CONFIG)):
        report = validate_inputs(config, tmp_path / name)
        assert report.ok, report.to_text()
