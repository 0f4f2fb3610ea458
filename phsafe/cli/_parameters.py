"""``phsafe private``'s arguments and options, made from :class:`phsafe.parameters.PrivateRunParameters`.

Each field with a :class:`~phsafe.parameters.CommandLine` spelling becomes a click argument or
option, in the model's order, with the field's description as its help (other parameters named
as the command line spells them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from phsafe.cli._common import EXISTING, EXISTING_FILE, MEMORY_SIZE, PATH, memory_limit_help
from phsafe.parameters import CommandLine, command_line_spelling, describe, on_command_line

F = TypeVar("F", bound=Callable[..., Any])

_TYPES = {"path": PATH, "existing": EXISTING, "existing_file": EXISTING_FILE, "size": MEMORY_SIZE}


def _parameter(name: str, spelling: CommandLine, spell: dict[str, str]) -> Callable[[F], F]:
    kind = _TYPES.get(spelling.kind)
    if spelling.argument:
        return click.argument(name, type=kind)
    text = spelling.help or describe(name, spell, spelling.note)
    if spelling.kind == "size":
        text = memory_limit_help()
    if spelling.kind == "flag":
        return click.option(*spelling.decls, is_flag=True, default=False, help=text)
    if spelling.kind == "negated_flag":
        return click.option(*spelling.decls, is_flag=True, flag_value=False, default=True, help=text)
    return click.option(*spelling.decls, type=kind, default=None, metavar=spelling.metavar, help=text,
                        envvar=spelling.envvar, show_envvar=spelling.envvar is not None)


def private_run_parameters(f: F) -> F:
    """Add the private run's arguments and options to a click command (in the model's order)."""
    spell = command_line_spelling()
    for name, spelling in reversed(list(on_command_line())):
        f = _parameter(name, spelling, spell)(f)
    return f
