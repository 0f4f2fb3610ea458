"""The ``phsafe`` command line: one module per command, each a thin layer over the library.

``validate``, ``private`` and ``non-private`` keep the production release's arguments and flags
(spec §8); the other commands are this project's. Every command module owns its command and its
options; this module only makes the group and mounts them, each from its module when it is run
or asked for its help (:data:`COMMAND_TABLE`: ``phsafe --help`` imports no command). A failure
exits non-zero with one human line on stderr.

``-q/--quiet`` and ``-v/--verbose`` are options of the group and mean the same for every
command (``phsafe -q validate ...``); each command also takes them as ``--quiet``/``--verbose``
(:mod:`phsafe.cli._output`).
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import click

import phsafe
from phsafe.cli._output import group_verbosity_options


class CommandEntry(NamedTuple):
    """A command of the table: mounted from its module only when it is run or asked for its help."""

    name: str
    module: str
    attribute: str
    summary: str
    """What ``phsafe --help`` lists for it: the first sentence of the command's own help
    (``tests/unit/test_cli_table.py`` checks it against the command)."""


# Every command, by name. ``phsafe --help`` lists them from this table, so that it imports no
# command module (each pulls in what its command needs: pandas, pyarrow, structlog, ...).
COMMAND_TABLE: tuple[CommandEntry, ...] = (
    CommandEntry("validate", "phsafe.cli.validate", "validate",
                 "Validate CONFIG and the input files in DATA; spends no budget."),
    CommandEntry("private", "phsafe.cli.private", "private",
                 "Run PHSafe on DATA with CONFIG and publish the eleven tables to OUT."),
    CommandEntry("non-private", "phsafe.cli.nonprivate", "non_private",
                 "Ground-truth tables (no truncation, no noise) -- for synthetic data only."),
    CommandEntry("ledger", "phsafe.cli.ledger", "ledger",
                 "Create, raise, repair and migrate the privacy-loss ledger."),
    CommandEntry("keys", "phsafe.cli.keys", "keys",
                 "The Ed25519 key pair that signs the ledger checkpoints of every release."),
    CommandEntry("audit", "phsafe.cli.audit", "audit",
                 "Verify the privacy-loss ledger and report on it, offline."),
    CommandEntry("witness", "phsafe.cli.witness", "witness",
                 "Witness public privacy-loss logs: cosign checkpoints that extend the last one cosigned."),
    CommandEntry("plan", "phsafe.cli.plan", "plan",
                 "Plan budgets for MOE targets (writes config.json), or the MOEs of a config."),
    CommandEntry("risk", "phsafe.cli.risk", "risk",
                 "Disclosure risk of one released cell, for every measured level of CONFIG."),
    CommandEntry("postprocess", "phsafe.cli.postprocess", "postprocess",
                 "Model-based estimates with 90% intervals from the private outputs in OUTPUT alone."),
    CommandEntry("accuracy", "phsafe.cli.accuracy", "accuracy",
                 "Accuracy of K private runs of CONFIG on synthetic DATA, written to OUTPUT."),
    CommandEntry("synth", "phsafe.cli.synth", "synth",
                 "Generate consistent synthetic inputs (persons, units, geo) of any size."),
)

# (module, click command) of every command.
COMMANDS: tuple[tuple[str, str], ...] = tuple((e.module, e.attribute) for e in COMMAND_TABLE)


HELP_OPTIONS = ["-h", "--help"]


def _help_everywhere(command: click.Command) -> None:
    # Every command takes -h, also when invoked on its own (a test's CliRunner, the reference):
    # click remembers a command's help option the first time it is asked, from the context of
    # that call, so inheriting the names from the group is not enough.
    command.context_settings.setdefault("help_option_names", HELP_OPTIONS)
    # ... and a command invoked on its own before it is mounted here (a test's CliRunner on
    # `audit`) has already built its help option from `--help` alone: built again on next use.
    # (`_help_option` is click's cache, 8.2 onwards; click is pinned in requirements.lock.)
    if getattr(command, "_help_option", None) is not None:
        command._help_option = None
    for sub in getattr(command, "commands", {}).values():
        _help_everywhere(sub)


class _Commands(dict):  # type: ignore[type-arg]
    """The group's commands by name: a command of :data:`COMMAND_TABLE` is imported and mounted
    when it is first looked up (``main.commands["synth"]``, ``"synth" in main.commands`` and
    iteration see every command of the table)."""

    def __missing__(self, name: str) -> click.Command:
        entry = next((e for e in COMMAND_TABLE if e.name == name), None)
        if entry is None:
            raise KeyError(name)
        command = getattr(importlib.import_module(entry.module), entry.attribute)
        _help_everywhere(command)
        self[name] = command
        return command

    def mounted(self, name: str) -> bool:
        return dict.__contains__(self, name)

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or any(e.name == name for e in COMMAND_TABLE)

    def get(self, name: str, default: click.Command | None = None) -> click.Command | None:  # type: ignore[override]
        try:
            return self[name]
        except KeyError:
            return default

    def names(self) -> list[str]:
        return sorted({e.name for e in COMMAND_TABLE} | set(dict.keys(self)))

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def keys(self):  # type: ignore[no-untyped-def,override]
        return self.names()

    def values(self):  # type: ignore[no-untyped-def,override]
        return [self[n] for n in self.names()]

    def items(self):  # type: ignore[no-untyped-def,override]
        return [(n, self[n]) for n in self.names()]


class _CommandTable(click.Group):
    """The ``phsafe`` group: its commands mounted from :data:`COMMAND_TABLE` on first use.

    ``phsafe COMMAND ...`` imports that command's module only; ``phsafe --help`` imports none
    (the list shows each command's summary from the table, shortened as click shortens a
    command's own help)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.commands = _Commands(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = self.commands
        assert isinstance(commands, _Commands)
        summaries = {e.name: e.summary for e in COMMAND_TABLE}
        rows = []
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        for name in names:
            if commands.mounted(name) or name not in summaries:  # mounted already: its own help
                command = self.get_command(ctx, name)
                if command is None or command.hidden:
                    continue
                rows.append((name, command.get_short_help_str(limit)))
            else:
                rows.append((name, click.Command(name, help=summaries[name]).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_CommandTable, context_settings={"help_option_names": HELP_OPTIONS})
@click.version_option(phsafe.__version__, prog_name="phsafe")
@group_verbosity_options
def main() -> None:
    """PHSafe: the S-DHC tables under differential privacy.

    -q/--quiet and -v/--verbose apply to every command (also as --quiet/--verbose after it).
    """


def console() -> None:
    """The installed ``phsafe`` command: :func:`main` in a process that runs no Prefect, so Great
    Expectations is imported without what the suites never use (about 1.3 CPU-s less for a
    command that validates in this process; :mod:`phsafe._trimmed_imports`). ``main`` itself
    trims nothing: tests and other programs call it in processes that may run Prefect."""
    from phsafe._trimmed_imports import trim_imports

    trim_imports()
    main()


if __name__ == "__main__":  # pragma: no cover
    console()
