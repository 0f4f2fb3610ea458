"""The command table of ``phsafe`` (:data:`phsafe.cli.COMMAND_TABLE`) says what the commands say.

``phsafe --help`` lists the commands from the table without importing them; these tests import
every command and hold the table to it: the same names, each entry's summary shortened exactly as
click shortens the command's own help, and a help listing that is the same text before and after
the commands are mounted.
"""

from __future__ import annotations

import importlib

import click
from click.testing import CliRunner


def _fresh_group() -> click.Group:
    """The ``phsafe`` group of a fresh import of :mod:`phsafe.cli` (no command mounted yet)."""
    import phsafe.cli

    return importlib.reload(phsafe.cli).main


def test_the_table_names_every_command_once_and_each_module_defines_it() -> None:
    from phsafe.cli import COMMAND_TABLE

    names = [e.name for e in COMMAND_TABLE]
    assert len(names) == len(set(names))
    for entry in COMMAND_TABLE:
        command = getattr(importlib.import_module(entry.module), entry.attribute)
        assert isinstance(command, click.Command)
        assert command.name == entry.name, entry


def test_each_summary_is_the_commands_own_short_help_at_every_width() -> None:
    from phsafe.cli import COMMAND_TABLE

    for entry in COMMAND_TABLE:
        command = getattr(importlib.import_module(entry.module), entry.attribute)
        table = click.Command(entry.name, help=entry.summary)
        for limit in range(3, 160):
            assert table.get_short_help_str(limit) == command.get_short_help_str(limit), (entry.name, limit)


def test_the_help_listing_is_the_same_before_and_after_the_commands_are_mounted() -> None:
    group = _fresh_group()
    runner = CliRunner()
    for width in (60, 80, 100, 200):
        lazy = runner.invoke(group, ["--help"], terminal_width=width)
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            group.get_command(ctx, name)  # mount every command
        mounted = runner.invoke(group, ["--help"], terminal_width=width)
        assert lazy.exit_code == mounted.exit_code == 0
        assert lazy.output == mounted.output
        group = _fresh_group()


def test_the_commands_mapping_mounts_a_command_when_it_is_looked_up() -> None:
    group = _fresh_group()
    assert "synth" in group.commands and "no-such" not in group.commands
    assert group.commands["synth"].name == "synth"
    assert group.commands.get("no-such") is None
    assert sorted(group.commands) == sorted(e.name for e in importlib.import_module("phsafe.cli").COMMAND_TABLE)
