"""The progress facility, the shared --quiet/--verbose, one error line, and report folders."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from phsafe._plots import ReportFolderExists, report_folder
from phsafe.cli import main
from phsafe.progress import NULL, NullProgress, PlainProgress, Progress, RichProgress, budget_text, for_stream
from tests.conftest import PR_CONFIG, US_CONFIG

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"


# --------------------------------------------------------------------------------------------
# Numbers for people
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, text", [
    (Fraction(1257281, 1000000), "1.257281"),
    ("1257281/1000000", "1.257281"),
    (Decimal("0.000022"), "0.000022"),
    (Decimal("2.500"), "2.5"),
    (Fraction(3), "3"),
    (0.016371, "0.016371"),
    (Decimal("Infinity"), "Infinity"),
    ("Infinity", "Infinity"),
    (Fraction(1, 3), "≈ 0.3333333333"),
])
def test_budget_text(value: object, text: str) -> None:
    assert budget_text(value) == text  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# The three displays
# --------------------------------------------------------------------------------------------


def _work(progress: Progress) -> None:
    with progress:
        with progress.stage("read inputs"):
            with progress.task("files", total=3, unit="files") as task:
                for name in ("persons", "units", "geo"):
                    task.advance(item=name)
        progress.log_sink("info", {"event": "an info event", "table": "PH2"})
        progress.log_sink("warning", {"event": "a warning", "table": "PH3"})
        progress.log_sink("error", {"event": "the error"})
        with progress.stage("measure"), progress.task("measurements", total=58) as task:
            task.update(20, item="PH3 state_A-G")


def test_plain_progress_is_a_few_lines() -> None:
    lines: list[str] = []
    _work(PlainProgress(lines.append))
    assert lines[0].startswith("phsafe: read inputs: 3 files -- done in ")
    assert lines[1] == "phsafe: warning: a warning (table=PH3)"
    assert lines[2].startswith("phsafe: measure: 20/58 measurements -- done in ")
    assert len(lines) == 3  # no info (not verbose), never the error


def test_plain_progress_verbose_shows_info_and_not_a_failed_stage() -> None:
    lines: list[str] = []
    progress = PlainProgress(lines.append, verbose=1)
    _work(progress)
    assert "phsafe: an info event (table=PH2)" in lines
    before = list(lines)
    with pytest.raises(ZeroDivisionError), progress.stage("broken"):
        1 / 0  # noqa: B018
    assert lines == before  # the failure is the command's one error line


def test_rich_progress_prints_finished_stages() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    _work(RichProgress(console))
    text = console.export_text()
    assert "✓ read inputs (3 files)" in text
    assert "✓ measure (20/58 measurements)" in text
    assert "warning: a warning (table=PH3)" in text
    assert "an info event" not in text and "the error" not in text


def test_byte_tasks_show_sizes_rates_and_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """An input file being read: plain lines while it runs (percent, rate, time left) and a
    rounded size with its rate when done -- never the exact number of bytes."""
    import phsafe.progress as progress_module

    clock = [1000.0]
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: clock[0])
    lines: list[str] = []
    progress = PlainProgress(lines.append)
    total = 7_578_433_623
    with progress.stage("read"), progress.task("persons.csv", total=total, unit="bytes") as task:
        for _ in range(40):  # 95 MB a second for 40 seconds
            clock[0] += 1.0
            task.advance(95_000_000)
    running = [line for line in lines if "% read" in line]
    assert running == ["phsafe: persons.csv: 38% read, 95 MB/s, about 49.8 s left"], lines
    assert lines[-1].startswith("phsafe: read: persons.csv 3.8 GB at 95 MB/s -- done in ")
    assert not any(str(total) in line or f"{total:,}" in line or "3800000000" in line for line in lines)

    console = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    rich = RichProgress(console)
    with rich, rich.stage("read"), rich.task("geo.csv", total=6_868_017_986, unit="bytes") as task:
        task.advance(2_100_000_000)
        rich._bars.refresh()
        live = console.export_text(clear=False)
    assert "geo.csv" in live and "2.1/6.9 GB" in live
    assert "✓ read (geo.csv 2.1 GB" in console.export_text()


def test_null_progress_shows_nothing_but_quiet_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    _work(NULL)
    assert capsys.readouterr().err == ""
    _work(NullProgress(warnings=True))
    assert capsys.readouterr().err == "warning: a warning (table=PH3)\n"


def test_for_stream_picks_the_display() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(for_stream(io.StringIO()), PlainProgress)
    assert isinstance(for_stream(Tty()), RichProgress)
    assert isinstance(for_stream(Tty(), quiet=True), NullProgress)
    for p in (for_stream(io.StringIO()), for_stream(Tty()), NULL):
        assert isinstance(p, Progress)


# --------------------------------------------------------------------------------------------
# The command line: -q/-v, one error line, report folders
# --------------------------------------------------------------------------------------------


def _invoke(*args: object) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_quiet_and_verbose_mean_the_same_on_the_group_and_the_command(tmp_path: Path) -> None:
    normal = _invoke("plan", "--from-config", US_CONFIG, "--out", tmp_path / "a")
    assert normal.exit_code == 0
    assert "phsafe: plan -- done in" in normal.stderr  # plain progress (not a terminal)
    assert "total rho 1.257281 (bounded 2.514562)" in normal.stdout
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
    from phsafe import run_private

    run_private(DEMO_US / "config.json", DEMO_US, private, ledger=tmp_path / "ledger.jsonl", non_confidential=True)
    quiet_log = _invoke("postprocess", private, "--dest", tmp_path / "pp1", "--draws", "20")
    loud = _invoke("-v", "postprocess", private, "--dest", tmp_path / "pp2", "--draws", "20")
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


def test_report_folder_never_replaces_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ReportFolderExists, match="is a file"):
        report_folder(path, overwrite=True)
    assert report_folder(tmp_path / "new" / "deep") == tmp_path / "new" / "deep"
