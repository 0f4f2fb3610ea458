"""``docs/cli.md`` is the commands' own ``--help``: it cannot drift from them."""

from __future__ import annotations

from pathlib import Path

from phsafe.cli.reference import render

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_cli_reference_is_the_commands_help() -> None:
    assert REFERENCE.read_text(encoding="utf-8") == render(), (
        "docs/cli.md differs from the commands' --help: regenerate it with "
        "`python -m phsafe.cli.reference > docs/cli.md`")


def test_the_reference_covers_every_command() -> None:
    from phsafe.cli import COMMANDS

    text = render()
    for _, command in COMMANDS:
        assert f"`phsafe {command.replace('_', '-')}`" in text, command
    assert "GiB here" not in text  # the machine's own default memory figure is left out
