"""What the commands show an operator: -q/-v the same on the group and the command, the input files
read, log events with --verbose, a failure in one line, report folders never replaced."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from phsafe.cli import main
from tests.conftest import PR_CONFIG, US_CONFIG

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"


# --------------------------------------------------------------------------------------------
# The command line: -q/-v, one error line, report folders
# --------------------------------------------------------------------------------------------


def _invoke(*args: object) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_quiet_and_verbose_mean_the_same_on_the_group_and_the_command(tmp_path: Path) -> None:
    normal = _invoke("plan", "--from-config", US_CONFIG, "--out", tmp_path / "a")
    assert normal.exit_code == 0
    assert "phsafe: plan -- done in" in normal.stderr  # plain progress (not a terminal)
    assert "total rho 1.257281 (bounded 2.514562; paper sensitivities)" in normal.stdout
    for args in (["-q", "plan"], ["plan", "--quiet"]):
        quiet = _invoke(*args, "--from-config", US_CONFIG, "--out", tmp_path / args[0].strip("-"))
        assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == ""
    both = _invoke("-q", "plan", "--verbose", "--from-config", US_CONFIG, "--out", tmp_path / "c")
    assert both.exit_code == 2 and "--quiet and --verbose" in both.stderr


def test_validate_and_private_show_the_input_files_read(tmp_path: Path) -> None:
    validated = _invoke("validate", DEMO_US / "config.json", DEMO_US)
    assert validated.exit_code == 0, validated.stderr
    # the files read, then each input's size (rounded) and the rate it was read at
    assert "phsafe: read, check and join: 3 files, geo.csv " in validated.stderr
    assert "units.csv " in validated.stderr and "persons.csv " in validated.stderr
    assert "phsafe: evaluate the rules (Great Expectations) -- done in " in validated.stderr
    assert "phsafe: validate the config and the inputs -- done in " in validated.stderr
    private = _invoke("private", DEMO_US / "config.json", DEMO_US, tmp_path / "out",
                      "--ledger", tmp_path / "ledger.jsonl", "--non-confidential")
    assert private.exit_code == 0, private.stderr
    assert "phsafe: read, check, join and count: 3 files, geo.csv " in private.stderr
    assert "phsafe: evaluate the rules (Great Expectations) -- done in " in private.stderr
    assert "measurements -- done in " in private.stderr


def test_verbose_shows_log_events(tmp_path: Path) -> None:
    private = tmp_path / "out"
    from phsafe import run_private, synthetic

    # A small release (300 persons, one state) post-processed by a few seeded draws (--exact-limit 0):
    # the log events are those of any release and either way of computing the averages, and the demo
    # data's exact two-dimensional lattices, twice, cost about 15 CPU-seconds.
    data = tmp_path / "data"
    synthetic.write(synthetic.generate(300, ["01"], seed=3), data)
    config = json.loads(US_CONFIG.read_text())
    config["state_filter"] = ["01"]
    (data / "config.json").write_text(json.dumps(config))
    run_private(data / "config.json", data, private, ledger=tmp_path / "ledger.jsonl", non_confidential=True,
                validate=False)  # its log events are the postprocess command's
    small = ("--draws", "2", "--seed", "1", "--exact-limit", "0")
    quiet_log = _invoke("postprocess", private, "--dest", tmp_path / "pp1", *small)
    loud = _invoke("-v", "postprocess", private, "--dest", tmp_path / "pp2", *small)
    assert quiet_log.exit_code == loud.exit_code == 0
    assert "postprocess written" not in quiet_log.stderr
    assert "phsafe: postprocess written (destination=" in loud.stderr


def test_a_failure_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for args in (["postprocess", empty], ["-v", "postprocess", empty],
                 ["plan", "--targets", REPO / "docs" / "table10_moe_targets.csv", "--out", tmp_path / "p"],
                 ["risk", tmp_path / "missing.json"]):
        result = _invoke(*args)
        lines = result.stderr.strip().splitlines()
        assert result.exit_code in (1, 2), result.stderr
        errors = [line for line in lines if "error" in line.lower()]
        assert len(errors) == 1, lines


def test_report_commands_refuse_a_folder_with_files_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "risk"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    refused = _invoke("risk", PR_CONFIG, "--out", out)
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (f"phsafe: error: output folder {out} already holds files; "
                                      "choose a new folder, or replace them with --overwrite")
    assert (out / "notes.txt").exists() and not (out / "risk.json").exists()
    replaced = _invoke("risk", PR_CONFIG, "--out", out, "--overwrite")
    assert replaced.exit_code == 0, replaced.stderr
    assert not (out / "notes.txt").exists() and json.loads((out / "risk.json").read_text())["levels"]
    empty = tmp_path / "empty-plan"
    empty.mkdir()
    assert _invoke("plan", "--from-config", PR_CONFIG, "--out", empty).exit_code == 0  # empty: fine
    again = _invoke("plan", "--from-config", PR_CONFIG, "--out", empty)
    assert again.exit_code == 1 and "--overwrite" in again.stderr


def test_validate_report_dir_is_a_new_folder(tmp_path: Path) -> None:
    report = tmp_path / "report"
    first = _invoke("validate", DEMO_US / "config.json", DEMO_US, "--report-dir", report)
    assert first.exit_code == 0 and "inputs are valid" in first.stdout
    second = _invoke("validate", DEMO_US / "config.json", DEMO_US, "--report-dir", report)
    assert second.exit_code == 1 and "report folder" in second.stderr and "--overwrite" in second.stderr
    third = _invoke("-q", "validate", DEMO_US / "config.json", DEMO_US, "--report-dir", report, "--overwrite")
    assert third.exit_code == 0 and third.stdout == ""
    assert (report / "inputs" / "index.html").exists()


# --------------------------------------------------------------------------------------------
# The installed command, in processes of its own
# --------------------------------------------------------------------------------------------
# The system tests run the command line in their own process (tests/_cli.py); what only the
# installed console script shows -- it starts, dispatches to each command and ends with the exit
# status a script sees -- is checked here, once per command, as cheaply as the command allows.
# (validate, private, audit and witness are also run as processes elsewhere: test_bad_inputs,
# test_resume, test_crash_safety, test_witness_service; the e2e stack runs ledger and keys as its
# service user.)


def test_each_command_runs_as_the_installed_script(tmp_path: Path) -> None:
    from tests._cli import subprocess_phsafe as script

    def ran(*args: object, code: int = 0, out: str = "", err: str = "") -> None:
        done = script(*args, timeout=600)
        assert done.returncode == code, (args, done.stdout[-2000:], done.stderr[-2000:])
        assert out in done.stdout and err in done.stderr, (args, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, done.stderr[-2000:]

    ran("--version", out="phsafe, version ")
    ran("private", code=2, err="Usage: phsafe private [OPTIONS] CONFIG DATA OUTPUT")  # click's usage error
    ran("validate", tmp_path / "missing.json", tmp_path, code=2, err="Usage: phsafe validate")
    ran("-q", "non-private", DEMO_US / "config.json", DEMO_US, tmp_path / "nonprivate", "--non-confidential")
    assert (tmp_path / "nonprivate" / "PH2" / "PH2.csv").is_file()
    ran("keys", "generate", tmp_path / "keys", out="signing key")
    ran("ledger", "init", tmp_path / "ledger.jsonl", "--lifetime-cap", "1", "--reason", "smoke test",
        out="created the confidential ledger")
    ran("audit", "verify", tmp_path / "ledger.jsonl", out="OK")
    ran("witness", "--help", out="Usage: phsafe witness")
    ran("-q", "plan", "--from-config", PR_CONFIG, "--out", tmp_path / "plan")
    assert (tmp_path / "plan" / "plan_report.html").is_file()
    ran("-q", "synth", "--persons", "200", "--states", "01", "--out", tmp_path / "synth")
    assert (tmp_path / "synth" / "persons.csv").is_file()
    for command in ("risk", "postprocess", "accuracy"):  # each a report over a release or a config: its usage
        ran(command, "--help", out=f"Usage: phsafe {command}")
    ran("no-such-command", code=2, err="No such command 'no-such-command'")
