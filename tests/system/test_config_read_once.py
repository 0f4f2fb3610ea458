"""A run reads its config once: the ledger's config digest, the config suite and every stage
come from the same bytes, so a config file edited during a run changes nothing of it.

Opens are counted with an audit hook (``open`` events, as ``strace -e openat`` would see them);
the edit happens just as the input pass starts, after the run has read its config and before
anything else would have read it again in the former layout.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

import phsafe
from phsafe import synthetic
from phsafe.ledger import read_ledger

from tests.conftest import US_CONFIG

STATES = ["01", "11"]

_OPENS: list[str] = []
_WATCHED: set[str] = set()


def _count_opens(event: str, args: tuple) -> None:
    # Audit hooks cannot be removed: this one only looks at the paths a test put in _WATCHED.
    if event == "open" and _WATCHED and isinstance(args[0], (str, Path)) and str(args[0]) in _WATCHED:
        _OPENS.append(str(args[0]))


sys.addaudithook(_count_opens)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("records") / "data"
    synthetic.write(synthetic.generate(1500, STATES, seed=5), directory)
    return directory


def _config(directory: Path, budget: str, tau: int) -> Path:
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = STATES
    raw["privacy_budget"] = {t: {lv: budget for lv in levels} for t, levels in raw["privacy_budget"].items()}
    raw["tau"] = {t: tau for t in raw["tau"]}
    path = directory / "config.json"
    # Budgets as JSON numbers written from text: exact decimals, as in the production files.
    path.write_text(json.dumps(raw).replace(f'"{budget}"', budget))
    return path


def test_a_private_run_opens_its_config_once(tmp_path: Path, data: Path) -> None:
    config = _config(tmp_path, "0.5", 3)
    _WATCHED.add(str(config))
    _OPENS.clear()
    try:
        phsafe.run_private(config, data, tmp_path / "out", non_confidential=True)
    finally:
        _WATCHED.clear()
    assert _OPENS == [str(config)], f"the config was opened {len(_OPENS)} times"


def test_a_config_edited_during_the_run_changes_nothing(tmp_path: Path, data: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import phsafe.engine

    # No noise (Infinity, test data only): the tables are the truncated counts themselves.
    config = _config(tmp_path, "Infinity", 3)
    original = config.read_bytes()
    # Another budget and another tau: a run that read the file again would plan, truncate and
    # record differently.
    (tmp_path / "other").mkdir()
    edited = _config(tmp_path / "other", "2", 1).read_bytes()
    count = phsafe.engine.validated_counts

    def edit_then_count(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        config.write_bytes(edited)
        return count(*args, **kwargs)

    monkeypatch.setattr(phsafe.engine, "validated_counts", edit_then_count)
    ledger = tmp_path / "ledger" / "ledger.jsonl"
    result = phsafe.run_private(config, data, tmp_path / "out", ledger=ledger, non_confidential=True)
    assert config.read_bytes() == edited  # the edit did happen, during the run

    started = [e for e in read_ledger(ledger).entries if e["kind"] == "RUN_STARTED"]
    assert [e["config_digest"] for e in started] == [hashlib.sha256(original).hexdigest()]
    manifest = json.loads((result.output_dir / "manifest.json").read_text())
    assert {m["budget"] for m in manifest["measurements"]} == {"Infinity"}
    assert all(tau == 3 for tau in manifest["config"]["tau"].values()), manifest["config"]["tau"]

    # The same records, config and truncation key, untouched: the very same tables (a count
    # made under the edited tau of 1 would differ).
    monkeypatch.undo()
    config.write_bytes(original)
    again = phsafe.run_private(config, data, tmp_path / "again", non_confidential=True,
                        truncation_key=started[0]["truncation_key"])
    first, second = phsafe.read_release(result.output_dir), phsafe.read_release(again.output_dir)
    assert set(first) == set(second)
    for table in first:
        pd.testing.assert_frame_equal(first[table], second[table])
