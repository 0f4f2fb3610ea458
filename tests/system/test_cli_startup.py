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


def test_a_process_of_the_pass_imports_great_expectations_without_what_the_suites_never_use() -> None:
    # The validation's second process and the pass's worker processes call trim_imports() first:
    # the suites still evaluate (a failing rule too, with its count), and neither SciPy's
    # statistics nor SQLAlchemy were loaded. (Their reports are compared with the in-process
    # evaluation's in tests/system/test_validation_by_state.py.)
    code = """
import sys
from phsafe.validation import _gx
_gx.trim_imports()
import pandas as pd
from phsafe.validation._suites import load_suite
suite = load_suite("persons")
frame = next(iter({r.frame for r in suite.rules}))
rules = [r for r in suite.rules if r.frame == frame]
results = _gx.run(suite, frame, pd.DataFrame({c: [None] for r in rules for c in r.referenced_columns()}), rules)
print("EVALUATED", len(results), all(r.raised is None for r in results))
print("LAZY", type(sys.modules["scipy.stats"]).__name__ if "scipy.stats" in sys.modules else "absent")
print("SQL", sys.modules.get("sqlalchemy", "absent"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "EVALUATED" in out and "True" in out.split("EVALUATED")[1].splitlines()[0], out
    assert "LAZY _LazyModule" in out or "LAZY absent" in out, out
    assert "SQL None" in out, out


def test_the_installed_command_trims_great_expectations_and_main_does_not() -> None:
    # The console script is phsafe.cli:console, which trims before anything else is imported (the
    # command never runs Prefect); main -- called in processes that may run Prefect, as this
    # one -- does not. That the suites evaluate alike trimmed is the test above's; the installed
    # command validating through it is tests/system/test_cli_output.py's and test_wheel.py's.
    from importlib.metadata import entry_points

    from phsafe._trimmed_imports import _LazyFinder
    from phsafe.cli import main

    (script,) = entry_points(group="console_scripts", name="phsafe")
    assert script.value == "phsafe.cli:console"
    code = """
import sys
from phsafe.cli import console
sys.argv = ["phsafe", "--version"]
try:
    console()
except SystemExit as stop:
    print("EXIT", stop.code)
print("SQL", sys.modules.get("sqlalchemy", "absent"))
print("LAZY", any(type(f).__name__ == "_LazyFinder" for f in sys.meta_path))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "EXIT 0" in out and "SQL None" in out and "LAZY True" in out, out
    try:
        main(["--version"], standalone_mode=False)
    finally:
        assert not any(isinstance(f, _LazyFinder) for f in sys.meta_path)
        assert sys.modules.get("sqlalchemy", "absent") is not None
