"""The ``phsafe`` command line: one module per command, each a thin layer over the library.

``validate``, ``private`` and ``non-private`` keep the production release's arguments and flags
(spec §8); the other commands are this project's. Every command module owns its command and its
options; this module only makes the group and mounts them. A failure exits non-zero with one
human line on stderr.

``-q/--quiet`` and ``-v/--verbose`` are options of the group and mean the same for every
command (``phsafe -q validate ...``); each command also takes them as ``--quiet``/``--verbose``
(:mod:`phsafe.cli._output`).
"""

from __future__ import annotations

import importlib
import sys

import click

import phsafe
from phsafe.cli._output import group_verbosity_options


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(phsafe.__version__, prog_name="phsafe")
@group_verbosity_options
def main() -> None:
    """PHSafe: the S-DHC tables under differential privacy.

    -q/--quiet and -v/--verbose apply to every command (also as --quiet/--verbose after it).
    """


# (module, click command) of every command, in the order ``--help`` lists them.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("phsafe.cli.validate", "validate"),
    ("phsafe.cli.private", "private"),
    ("phsafe.cli.nonprivate", "non_private"),
    ("phsafe.cli.ledger", "ledger"),
    ("phsafe.cli.keys", "keys"),
    ("phsafe.cli.audit", "audit"),
    ("phsafe.cli.witness", "witness"),
    ("phsafe.cli.plan", "plan"),
    ("phsafe.cli.risk", "risk"),
    ("phsafe.cli.postprocess", "postprocess"),
    ("phsafe.cli.accuracy", "accuracy"),
    ("phsafe.cli.synth", "synth"),
)


HELP_OPTIONS = ["-h", "--help"]


def _help_everywhere(command: click.Command) -> None:
    # Every command takes -h, also when invoked on its own (a test's CliRunner, the reference):
    # click remembers a command's help option the first time it is asked, from the context of
    # that call, so inheriting the names from the group is not enough.
    command.context_settings.setdefault("help_option_names", HELP_OPTIONS)
    for sub in getattr(command, "commands", {}).values():
        _help_everywhere(sub)


def _mount_commands() -> None:
    for module_name, attribute in COMMANDS:
        command = getattr(importlib.import_module(module_name), attribute)
        _help_everywhere(command)
        main.add_command(command)


_mount_commands()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
