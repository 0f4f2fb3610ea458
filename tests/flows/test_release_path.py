"""The production path (issue 19): the release flow runs the library's one release sequence, a
content version is released once, a retry resumes, and what the operator reads is one message.

Retries are made as the UI makes them: the flow run is set AwaitingRetry and run again with the
same flow run id (``tests.flows.test_flows.retry``), as the worker does. The same on a real
server, worker and browser: ``tests/flows/test_server_e2e.py``.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from phsafe.tables import TABLES
from tests.flows.test_flows import DEMO, _flow_run_id, _ledger_entries, _log_messages, _verify, retry

pytestmark = pytest.mark.usefixtures("prefect_server")

NEW = "the demo's synthetic records"


def _enclaves(tmp_path: Path, us_cap: str = "10", pr_cap: str = "10") -> dict[str, Path]:
    """Each dataset's ledger in a folder of its own, as production keeps them."""
    from tests._ledgers import new_ledger

    ledgers = {}
    for label, cap in (("us", us_cap), ("pr", pr_cap)):
        folder = tmp_path / "enclave" / label
        folder.mkdir(parents=True)
        ledgers[label] = new_ledger(folder, cap=cap).path
    return ledgers


def _release(tmp_path: Path, ledgers: dict[str, Path], **kw) -> dict:
    params = dict(us_config=str(DEMO / "us" / "config.json"), us_data=str(DEMO / "us"), us_ledger=str(ledgers["us"]),
                  pr_config=str(DEMO / "pr" / "config.json"), pr_data=str(DEMO / "pr"), pr_ledger=str(ledgers["pr"]),
                  output_root=str(tmp_path / "releases"), validate_private_output=False)
    params.update(kw)
    return params


@dataclass(frozen=True)
class Published:
    """A release of both datasets, completed on fresh ledgers: its flow run's final state, its
    ledgers, and as the release left them: each dataset's confidential log, the flow run's
    artifacts and log lines (a retry of the run adds its own)."""

    ledgers: dict[str, Path]
    state: Any
    log_events: dict[str, list[dict]]
    artifacts: list
    log_messages: list[str]


@pytest.fixture(scope="module")
def published(tmp_path_factory, prefect_server) -> Published:  # noqa: ANN001
    """One first release for the tests that start from a published release (a release run is
    the module's costliest step). The tests leave its ledgers as they found them -- a refused
    trigger and a retry of a completed release record nothing, as they assert -- and what changes
    them (a declared re-release) runs on a copy."""
    from flows.sdhc import release_flow

    root = tmp_path_factory.mktemp("published")
    ledgers = _enclaves(root)
    state = release_flow(**_release(root, ledgers, new_version=NEW), return_state=True)
    assert state.is_completed(), state.message
    from tests.flows.test_flows import _artifacts

    events = {label: [json.loads(line) for line in (ledger.parent / "phsafe-log.jsonl").read_text().splitlines()]
              for label, ledger in ledgers.items()}
    return Published(ledgers, state, events, _artifacts(_flow_run_id(state)), _log_messages(_flow_run_id(state)))


def _kinds(ledger: Path) -> Counter:
    return Counter(e["kind"] for e in _ledger_entries(ledger))


def _intents(ledgers: dict[str, Path]) -> dict[str, int]:
    return {label: _kinds(path)["INTENT"] for label, path in ledgers.items()}


def _normalized(entries: list[dict]) -> list[str]:
    """The ledger's entry kinds in order, with each run's measurement block in one canonical order:
    the flow measures the nine tables concurrently, so its INTENT/COMMITTED pairs interleave."""
    out: list[str] = []
    block: list[tuple[str, str]] = []
    for e in entries:
        if e["kind"] in ("INTENT", "COMMITTED"):
            block.append((e["key"], e["kind"]))
            continue
        if block:
            pending: dict[str, list[str]] = {}
            for key, kind in block:
                pending.setdefault(key, []).append(kind)
            assert all(kinds == ["INTENT", "COMMITTED"] for kinds in pending.values()), pending  # spend, then draw
            out += [f"{kind} {key}" for key in sorted(pending) for kind in pending[key]]
            block = []
        out.append(e["kind"])
    return out


def test_the_cli_and_the_flow_run_the_same_sequence(tmp_path):
    """One release sequence: the command line and the flow leave the same ledger entries, in the
    same order (up to the concurrency of the nine measurement tasks), for the same inputs -- and
    the flow's tasks start in the sequence's order."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.sdhc import us_flow
    from phsafe import run_private
    from phsafe.sequence import SEQUENCE
    from tests._ledgers import new_ledger

    (tmp_path / "cli").mkdir()
    (tmp_path / "flow").mkdir()
    cli_ledger = new_ledger(tmp_path / "cli", cap="10").path
    flow_ledger = new_ledger(tmp_path / "flow", cap="10").path
    run_private(DEMO / "us" / "config.json", DEMO / "us", tmp_path / "cli" / "out", ledger=cli_ledger, new_version=NEW,
                validate_private_output=True)
    state = us_flow(config=str(DEMO / "us" / "config.json"), data=str(DEMO / "us"), ledger=str(flow_ledger),
                    output_root=str(tmp_path / "flow" / "out"), new_version=NEW, return_state=True)
    assert state.is_completed(), state.message
    cli, flow = _ledger_entries(cli_ledger), _ledger_entries(flow_ledger)
    assert _normalized(cli) == _normalized(flow)
    assert [e["kind"] for e in cli][:3] == ["LEDGER_INIT", "DATASET_VERSION", "RUN_STARTED"]
    assert "orchestration" not in cli[2]
    assert flow[2]["orchestration"] == {"system": "prefect", "flow_run_id": str(_flow_run_id(state))}

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[_flow_run_id(state)])))
    started = [r.name.rsplit("-", 1)[0] if not r.name.startswith("measure-") else "measure"
               for r in sorted(runs, key=lambda r: r.start_time)]
    order = [s.name for s in SEQUENCE]
    positions = [order.index(name) for name in started]
    assert positions == sorted(positions), started  # never out of the sequence's order
    assert set(started) == set(order)


def test_a_second_trigger_of_the_release_is_refused_before_any_spend(tmp_path, published):
    from flows.sdhc import release_flow

    ledgers = published.ledgers
    first = published.state
    published = first.result()
    before = {label: path.read_bytes() for label, path in ledgers.items()}

    again = release_flow(**_release(tmp_path, ledgers, new_version=NEW), return_state=True)
    assert again.is_failed()
    message = again.message
    for label in ("us", "pr"):
        assert f"run {published[label]['run_id']} published them to {published[label]['outputs']}" in message
        assert ledgers[label].read_bytes() == before[label]  # not one entry: nothing spent
    assert message.count("No privacy-loss budget was spent.") == 2
    assert "the flow parameter re_release" in message and "--re-release" not in message
    from tests.flows.test_flows import _task_run_names

    for sub in _subflow_runs(again):
        assert not [m for m in _log_messages(sub) if "Traceback" in m]  # a refusal is not a bug
        # The very files of the release: refused in preflight, before any input was read.
        assert "validate-and-count" not in " ".join(_task_run_names(sub))

    # A declared re-release goes through, recorded; the cap still applies. (On a copy of the
    # enclave: the published release is the module's.)
    enclave = next(iter(ledgers.values())).parent.parent
    shutil.copytree(enclave, tmp_path / "enclave")
    ledgers = {label: tmp_path / "enclave" / path.relative_to(enclave) for label, path in ledgers.items()}
    third = release_flow(**_release(tmp_path, ledgers, re_release="a second release, for the test"),
                         return_state=True)
    assert third.is_completed(), third.message
    for label, path in ledgers.items():
        started = [e for e in _ledger_entries(path) if e["kind"] == "RUN_STARTED"]
        assert [e.get("re_release") for e in started] == [None, "a second release, for the test"]
        _verify(path, Path(third.result()[label]["outputs"]))


def _subflow_runs(state) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[_flow_run_id(state)])))
    return [r.id for r in runs]


def test_a_retry_of_a_completed_release_does_nothing_and_says_where_it_is(published):
    from flows.sdhc import release_flow

    ledgers, first = published.ledgers, published.state
    before = {label: path.read_bytes() for label, path in ledgers.items()}
    again = retry(release_flow, first)
    assert again.is_completed(), again.message
    for label, summary in again.result().items():
        assert summary["already_published"] and summary["outputs"] == first.result()[label]["outputs"]
        assert ledgers[label].read_bytes() == before[label]
    assert any("already published" in m for sub in _subflow_runs(again) for m in _log_messages(sub))


def test_a_retry_of_the_release_resumes_a_dataset_that_failed_after_spending(tmp_path, monkeypatch):
    """US fails at publish, after every spend; Puerto Rico publishes. The release's retry resumes
    the US run (no new INTENT, its committed measurements reused) and leaves Puerto Rico alone."""
    from flows.sdhc import release_flow
    from phsafe import engine
    from phsafe.errors import PHSafeError

    ledgers = _enclaves(tmp_path)
    original = engine.publish_private_run

    def unavailable_for_us(run, *args):  # noqa: ANN001
        if run.dataset == "demo-us":
            raise PHSafeError("the release area is unavailable (injected)")
        return original(run, *args)

    monkeypatch.setattr(engine, "publish_private_run", unavailable_for_us)
    first = release_flow(**_release(tmp_path, ledgers, new_version=NEW), return_state=True)
    assert first.is_failed()
    assert "us: the release area is unavailable (injected)" in first.message
    assert "spend(s) of run us-" in first.message and "Retry this flow run to resume it" in first.message
    assert "resume=" not in first.message  # the release deployment has no such parameter
    spent = _intents(ledgers)
    assert spent["us"] > 0 and spent["pr"] > 0

    monkeypatch.undo()  # the operator fixes the cause, then clicks Retry on the release
    again = retry(release_flow, first)
    assert again.is_completed(), again.message
    assert _intents(ledgers) == spent  # nothing drawn again
    result = again.result()
    assert result["us"]["measurements"] == {"drawn": 0, "reused": spent["us"], "noiseless": 0}
    assert result["us"]["attempt"] == 2 and result["pr"]["already_published"]
    (us_run,) = {e["run_id"] for e in _ledger_entries(ledgers["us"]) if e["kind"] == "RUN_STARTED"}
    resumed = [e for e in _ledger_entries(ledgers["us"]) if e["kind"] == "RUN_RESUMED"]
    assert [e["run_id"] for e in resumed] == [us_run]
    assert resumed[0]["orchestration"]["parent_flow_run_id"] == str(_flow_run_id(first))
    _verify(ledgers["us"], Path(result["us"]["outputs"]))


def test_each_dataset_logs_beside_its_own_ledger_and_the_release_shows_a_summary(published):
    state = published.state
    for label in published.ledgers:
        events = published.log_events[label]  # each log as the release left it
        assert events and {e["dataset"] for e in events if "dataset" in e} <= {label, f"demo-{label}"}
        assert {e["run_id"] for e in events if "run_id" in e} == {state.result()[label]["run_id"]}
    (summary,) = [a for a in published.artifacts if a.key == "release-summary"]
    for label, o in state.result().items():
        assert o["outputs"] in summary.data and o["checkpoint_head"] in summary.data
        assert f"| {o['run_charge']} | {o['dataset_spent']} | 10 (rho) | {o['left']} |" in summary.data
    logs = published.log_messages
    assert any(m.startswith("us: run us-") and "published to" in m and "left" in m for m in logs)


def test_release_refusals_name_what_the_release_deployment_can_do(tmp_path):
    """A cap too low for the US: the release deployment has no lifetime_cap parameter, so the
    refusal names the command that raises a cap; the US deployment's own run names its parameter."""
    from flows.sdhc import release_flow, us_flow

    ledgers = _enclaves(tmp_path, us_cap="1")
    state = release_flow(**_release(tmp_path, ledgers, new_version=NEW), return_state=True)
    assert state.is_failed()
    assert "phsafe ledger raise-cap LEDGER --dataset NAME --to CAP" in state.message
    assert "the flow parameter lifetime_cap" not in state.message
    assert _intents(ledgers)["us"] == 0
    alone = us_flow(config=str(DEMO / "us" / "config.json"), data=str(DEMO / "us"), ledger=str(ledgers["us"]),
                    output_root=str(tmp_path / "out"), new_version=NEW, return_state=True)
    assert alone.is_failed() and "the flow parameter lifetime_cap" in alone.message


def test_a_first_run_without_a_declared_version_is_refused_in_preflight(tmp_path):
    from flows.sdhc import us_flow
    from tests.flows.test_flows import _task_run_names

    ledgers = _enclaves(tmp_path)
    state = us_flow(config=str(DEMO / "us" / "config.json"), data=str(DEMO / "us"), ledger=str(ledgers["us"]),
                    output_root=str(tmp_path / "out"), return_state=True)
    assert state.is_failed()
    assert "no declared content version" in state.message and "the flow parameter new_version" in state.message
    assert "validate-and-count" not in " ".join(_task_run_names(_flow_run_id(state)))  # refused before reading
    assert [e["kind"] for e in _ledger_entries(ledgers["us"])] == ["LEDGER_INIT"]


def test_nothing_is_persisted_after_a_failed_and_a_successful_run(tmp_path):
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings

    from flows.sdhc import us_flow

    storage = tmp_path / "prefect-storage"
    ledgers = _enclaves(tmp_path)
    common = dict(config=str(DEMO / "us" / "config.json"), ledger=str(ledgers["us"]), output_root=str(tmp_path / "out"))
    with temporary_settings({PREFECT_LOCAL_STORAGE_PATH: storage}):
        refused = us_flow(**common, data=str(DEMO / "us"), return_state=True)  # no declared version
        missing = us_flow(**common, data=str(tmp_path / "missing"), new_version=NEW, return_state=True)
        done = us_flow(**common, data=str(DEMO / "us"), new_version=NEW, return_state=True)
    assert refused.is_failed() and missing.is_failed() and done.is_completed(), done.message
    assert not storage.exists() or not any(storage.rglob("*"))
    assert set(TABLES) <= {p.name for p in Path(done.result()["outputs"]).iterdir()}
