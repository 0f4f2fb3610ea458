"""The command-line reference (``docs/cli.md``), generated from the commands' own ``--help``.

The reference is what ``phsafe ... --help`` prints, command by command, at a fixed width, so it
cannot say anything the commands do not; ``tests/unit/test_cli_reference.py`` fails when the file
and the commands disagree. Regenerate it after changing a command::

    python -m phsafe.cli.reference > docs/cli.md

One thing of the machine is left out: the memory limit's default is the machine's (half of its
memory), which each machine's ``--help`` states and the reference does not.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import click

WIDTH = 100
"""Columns of the help text (click wraps to it)."""

HEADER = """\
# The `phsafe` command line

Generated from the commands' own `--help` by `python -m phsafe.cli.reference > docs/cli.md`
(a test fails when the two differ). Every command takes `-q/--quiet` and `-v/--verbose`, as
options of `phsafe` or after the command; a failure is one line, `phsafe: error: ...`, and a
non-zero exit.

"""


def _commands(command: click.Command, chain: tuple[tuple[str, click.Command], ...]
              ) -> Iterator[tuple[tuple[str, click.Command], ...]]:
    """Every command below ``command`` (itself first), as the chain of (name, command) that leads to it."""
    yield chain
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            sub = command.get_command(click.Context(command), name)
            if sub is not None and not sub.hidden:
                yield from _commands(sub, chain + ((name, sub),))


@contextlib.contextmanager
def _without_machine_figures(root: click.Command) -> Iterator[None]:
    """The memory limit's help without this machine's default figure (``, 11.8 GiB here``)."""
    from phsafe.memory import default_memory_limit
    from phsafe.sizes import format_size

    figure = f", {format_size(default_memory_limit())} here"
    changed: list[tuple[click.Parameter, str]] = []
    for chain in _commands(root, (("phsafe", root),)):
        for param in chain[-1][1].params:
            text = getattr(param, "help", None)
            if isinstance(param, click.Option) and text and figure in text:
                changed.append((param, text))
                param.help = text.replace(figure, "")
    try:
        yield
    finally:
        for param, text in changed:
            param.help = text


def render() -> str:
    """The reference in Markdown: one section per command, its help as printed."""
    from phsafe.cli import main

    parts = [HEADER]
    with _without_machine_figures(main):
        for chain in _commands(main, (("phsafe", main),)):
            ctx: click.Context | None = None
            for name, command in chain:
                ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True, max_content_width=WIDTH,
                                           terminal_width=WIDTH)
            assert ctx is not None
            names = " ".join(name for name, _ in chain)
            level = "#" * min(len(chain) + 1, 4)
            parts.append(f"{level} `{names}`\n\n```text\n{ctx.command.get_help(ctx).rstrip()}\n```\n\n")
    return "".join(parts).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
