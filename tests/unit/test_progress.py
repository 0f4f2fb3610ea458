"""The progress facility, the shared --quiet/--verbose, one error line, and report folders."""

from __future__ import annotations

import io
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from rich.console import Console

from phsafe._plots import ReportFolderExists, report_folder
from phsafe.amounts import amount_text, format_exact
from phsafe.progress import NULL, NullProgress, PlainProgress, Progress, RichProgress, for_stream


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
    (Fraction(1, 3 * 10**6), "≈ 0.0000003333333333"),  # plain notation, never an exponent
    (Fraction(1, 2**60), format_exact(Fraction(1, 2**60))),  # terminating: every digit
])
def test_amount_text(value: object, text: str) -> None:
    assert amount_text(value) == text  # type: ignore[arg-type]


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


def test_report_folder_never_replaces_a_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ReportFolderExists, match="is a file"):
        report_folder(path, overwrite=True)
    assert report_folder(tmp_path / "new" / "deep") == tmp_path / "new" / "deep"
