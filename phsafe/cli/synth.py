"""The ``phsafe synth`` command: synthetic inputs of any size for tests and benchmarks.

``phsafe synth --persons N --out DIR [--states all|us|pr|01,06,...]
[--format csv|parquet|parquet-partitioned] [--seed S] [--chunk-persons M] [--overwrite]``

Mounted by :mod:`phsafe.cli`. The data is synthetic (see :mod:`phsafe.synthetic`); its seed only
makes it reproducible and has nothing to do with privacy noise.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from phsafe.cli._common import handle_errors, log_option
from phsafe.cli._output import command_progress, result_line, verbosity_options
from phsafe.synthetic import DEFAULT_CHUNK_PERSONS, FORMATS, synthesize

_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGbB]?)\s*$")
_SCALE = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}


def parse_count(text: str) -> int:
    """``"1000000"``, ``"1_000_000"``, ``"1e6"``, ``"10M"``, ``"331.4M"`` -> an integer.

    Raises:
        click.BadParameter: Not a positive count.
    """
    cleaned = text.replace("_", "").replace(",", "")
    m = _COUNT.match(cleaned)
    try:
        value = float(m.group(1)) * _SCALE[m.group(2).lower()] if m else float(cleaned)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a count (e.g. 1000000, 1e6, 10M)") from None
    if value < 1 or value != int(value):
        raise click.BadParameter(f"{text!r} is not a positive whole count")
    return int(value)


class _Count(click.ParamType):
    name = "COUNT"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_count(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


@click.command("synth")
@click.option("--persons", type=_Count(), required=True,
              help="Persons to generate in all, e.g. 1000000, 1e6, 10M or 331M.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Output folder (with --states all: us/ and pr/ inside it).")
@click.option("--states", default="us", show_default=True,
              help="us (50 states + DC), pr (Puerto Rico), all (both, as two datasets), "
                   "or 2-digit codes such as 01,06,48.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="csv", show_default=True,
              help="csv: persons.csv, units.csv, geo.csv (production format); parquet: one "
                   "file each; parquet-partitioned: persons/TABBLKST=<state>/part-0.parquet ...")
@click.option("--seed", type=int, default=None,
              help="Seed of the synthetic data (default: fresh; the one used is printed and "
                   "saved in synth.json). Never used for privacy noise.")
@click.option("--chunk-persons", type=_Count(), default=DEFAULT_CHUNK_PERSONS, show_default=True,
              help="Persons generated at once (memory: about 200 bytes each).")
@click.option("--overwrite", is_flag=True, help="Replace input files already in the output folder.")
@log_option
@verbosity_options
@handle_errors
def synth(persons: int, out: Path, states: str, fmt: str, seed: int | None, chunk_persons: int,
          overwrite: bool, log_file: Path | None) -> None:
    """Generate consistent synthetic inputs (persons, units, geo) of any size.

    Realistic structure: state populations in proportion to the 2020 census, households with
    a tail of sizes above the truncation threshold, relationships consistent with HHT, HHT2,
    CPLT and ages, race and ethnicity varying by state, tenure, vacant units, group quarters.
    The output passes `phsafe validate`. Written chunk by chunk in bounded memory.
    """
    try:
        with command_progress(log_file) as progress, progress.stage(f"synthesize {fmt} inputs"), \
                progress.task("persons", total=persons, unit="persons") as task:
            result = synthesize(out, persons, states, fmt=fmt,  # type: ignore[arg-type]
                                seed=seed, chunk_persons=chunk_persons, overwrite=overwrite,
                                progress=lambda done, total: task.update(done, total=total))
    except FileExistsError as exc:
        click.echo(f"phsafe: error: {exc}; pass --overwrite to replace them", err=True)
        raise SystemExit(1) from None
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    rate = result.n_persons / result.seconds if result.seconds > 0 else float("inf")
    for folder, codes in result.datasets.items():
        what = "Puerto Rico" if codes == ["72"] else f"{len(codes)} state(s)"
        result_line(f"phsafe: wrote {what} to {folder}")
    result_line(f"phsafe: {result.n_persons:,} persons, {result.n_units:,} units in "
                f"{result.seconds:.1f} s ({rate / 1e6:.2f}M persons/s), seed {result.seed}")
