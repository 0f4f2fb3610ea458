"""Benchmark: what a columnar engine spends to join the inputs and count ONE table, as a multiple
of the typed parse -- the floor under the ratio goals of issue 36.

    python3 -m venv /tmp/engines && /tmp/engines/bin/pip install duckdb==2.0.1 polars==2.1.0 pyarrow numpy
    .venv/bin/python benchmarks/engine_floor.py DATA --engines-python /tmp/engines/bin/python [--repeat 2]

DuckDB and Polars are not dependencies of phsafe (the pass is pyarrow and numpy); they run in a
virtual environment of their own, named by ``--engines-python``. Each phase is a fresh process,
measured as every benchmark is (``_measure.run_phase``: CPU-seconds of the process tree, wall
time, summed PSS):

1. ``typed parse`` -- ``benchmarks/pyarrow_read.py DATA``, the baseline of every benchmark;
2. ``ENGINE parse`` -- the engine reads every column of the three files with the same types and
   folds each column's values into one hash (so that no column's reading is skipped, and no
   answer comes from a Parquet file's statistics);
3. ``ENGINE join and count one table`` -- persons joined to units and geo on MAFID, and the
   persons counted by state, county, 5-year age group, CENRACE, CENHISP and HHT: one group-by of
   the kind the pass does for each of the nine tables at each level, with no validation, no
   truncation, no digest of the files, and only the six columns it needs converted (both engines
   skip converting the others). Data stored by state is joined and counted state by state, as the
   pass does; national CSV files as a whole, in each engine's streaming execution (at full US each
   engine held 20-22 GB doing so: run it on a machine with room for that). Columns are read from
   the files themselves (``TABBLKST`` is a column of each state's files; the folder names are not
   read as columns).

A phase of an engine that is less than 1.5x the typed parse for phase 3 would leave room for the
rest of the pass's work under the issue's 1.5x goal; a phase 3 above it says that an engine swap
alone cannot meet it. Results are printed as JSON and appended to ``benchmarks/_work/results.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from _measure import Phase, run_phase  # noqa: E402

WORK = HERE / "_work"

# The engines' program: run with --engines-python, the data folder and the task as arguments.
# phsafe.schema (numpy only) gives the columns and their types, as pyarrow_read.py takes them.
ENGINE_PROGRAM = textwrap.dedent('''
    import sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from phsafe.schema import FILES, ColumnKind
    data, engine, task = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    STEMS = ("persons", "units", "geo")
    KEYS = ["TABBLKST", "TABBLKCOU", "AGE5", "CENRACE", "CENHISP", "HHT"]
    by_state = (data / "persons").is_dir()
    states = sorted(p.name for p in (data / "persons").iterdir()) if by_state else [None]

    def source(stem, state):
        if by_state:
            return str(data / stem / state / "*.parquet")
        return str(data / f"{stem}.csv")

    if engine == "duckdb":
        import duckdb
        con = duckdb.connect()
        con.execute(f"SET threads={__import__('os').cpu_count()}")

        def scan(stem, state):
            if by_state:
                return f"read_parquet('{source(stem, state)}', hive_partitioning=false)"
            types = ", ".join(f"'{c.name}': '{'BIGINT' if c.kind is ColumnKind.INTEGER else 'VARCHAR'}'"
                              for c in FILES[stem])
            return f"read_csv('{source(stem, state)}', header=true, columns={{{types}}})"

        for state in states:
            if task == "parse":
                for stem in STEMS:
                    con.execute(f"SELECT count(*), {', '.join(f'bit_xor(hash({c.name}))' for c in FILES[stem])} "
                                f"FROM {scan(stem, state)}").fetchall()
            else:
                con.execute(f"""SELECT g.TABBLKST, g.TABBLKCOU, p.QAGE // 5 AS AGE5, p.CENRACE, p.CENHISP, u.HHT,
                                       count(*) AS n
                                FROM {scan('persons', state)} p JOIN {scan('units', state)} u USING (MAFID)
                                     JOIN {scan('geo', state)} g USING (MAFID)
                                GROUP BY ALL""").fetchall()
    else:
        import polars as pl

        def scan(stem, state):
            if by_state:
                return pl.scan_parquet(source(stem, state), hive_partitioning=False)
            return pl.scan_csv(source(stem, state), schema={
                c.name: pl.Int64 if c.kind is ColumnKind.INTEGER else pl.Utf8 for c in FILES[stem]})

        for state in states:
            if task == "parse":
                for stem in STEMS:
                    scan(stem, state).select([pl.col(c.name).hash().max() for c in FILES[stem]] + [pl.len()]) \\
                        .collect(engine="streaming")
            else:
                persons = scan("persons", state).select("MAFID", (pl.col("QAGE") // 5).alias("AGE5"), "CENRACE",
                                                        "CENHISP")
                units = scan("units", state).select("MAFID", "HHT")
                geo = scan("geo", state).select("MAFID", "TABBLKST", "TABBLKCOU")
                persons.join(units, on="MAFID").join(geo, on="MAFID").group_by(KEYS).len() \\
                    .collect(engine="streaming")
''')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="a folder of national CSV files or of Parquet stored by state")
    parser.add_argument("--engines-python", default=sys.executable,
                        help="the python of a virtual environment with duckdb and polars")
    parser.add_argument("--engines", default="polars,duckdb")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    data = args.data.resolve()
    engines = args.engines.split(",")
    # Before anything is timed: the engines must import there (they are not phsafe's dependencies).
    missing = subprocess.run([args.engines_python, "-c", f"import {', '.join(engines)}"], capture_output=True)
    if missing.returncode != 0:
        raise SystemExit(f"{args.engines_python} cannot import {', '.join(engines)}: give --engines-python the "
                         "python of a virtual environment that has them (see this script's docstring)")
    load_before = round(os.getloadavg()[0], 2)
    phases: list[Phase] = []
    for _ in range(args.repeat):
        phases.append(run_phase("typed parse", [sys.executable, str(HERE / "pyarrow_read.py"), str(data)]))
        for engine in engines:
            for task, label in (("parse", "parse"), ("count", "join and count one table")):
                phases.append(run_phase(f"{engine} {label}", [args.engines_python, "-c", ENGINE_PROGRAM, str(REPO),
                                                              str(data), engine, task]))
                if phases[-1].returncode != 0:
                    raise SystemExit(f"{engine} {task} failed (exit {phases[-1].returncode})")
    parse_cpu = statistics.median(p.cpu_seconds for p in phases if p.name == "typed parse")
    parse_wall = statistics.median(p.wall_seconds for p in phases if p.name == "typed parse")
    names = list(dict.fromkeys(p.name for p in phases))
    summary = {name: {"cpu_seconds": round(statistics.median(p.cpu_seconds for p in phases if p.name == name), 2),
                      "wall_seconds": round(statistics.median(p.wall_seconds for p in phases if p.name == name), 2),
                      "peak_pss_mib": round(max(p.peak_pss_mib for p in phases if p.name == name))}
               for name in names}
    for figures in summary.values():
        figures["cpu_multiple_of_typed_parse"] = round(figures["cpu_seconds"] / parse_cpu, 2)
        figures["wall_multiple_of_typed_parse"] = round(figures["wall_seconds"] / parse_wall, 2)
    result = {"benchmark": "engine_floor", "data": str(data), "phases": [p.as_dict() for p in phases],
              "summary": summary, "load_average_1min_before": load_before,
              "load_average_1min_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    print(json.dumps(result, indent=2))
    WORK.mkdir(exist_ok=True)
    with (WORK / "results.jsonl").open("a") as f:
        f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
