"""``phsafe --help`` in a fresh interpreter imports no command: the command table lists them
(:data:`phsafe.cli.COMMAND_TABLE`; ``tests/unit/test_cli_table.py`` holds it to the commands)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pandas", "pyarrow", "numpy", "structlog", "pydantic", "great_expectations", "phsafe.cli.private",
         "phsafe.cli.validate", "phsafe.synthetic", "phsafe.logs")


def test_help_imports_no_command_module_nor_their_libraries() -> None:
    code = ("import sys\nfrom phsafe.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print('IMPORTED', sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "Commands:" in out and "private" in out
    assert "IMPORTED []" in out, out


def test_a_command_imports_what_it_needs_only() -> None:
    code = ("import sys\nfrom phsafe.cli import main\n"
            "try:\n    main(['keys', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('IMPORTED', sorted(m for m in ('phsafe.cli.private', 'phsafe.cli.synth', 'great_expectations')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "IMPORTED []" in out, out
