"""The production setup for real: a Prefect server on PostgreSQL, the deployments of
deployments/prefect.yaml (deployed with ``--no-prompt``), a process worker, the US deployment
run through the API to Completed -- then what an operator sees of it: the deployments and their
schedules, the artifacts and logs through the API, and the flow run page in a real Chromium.

Everything started is stopped at the end. If the PostgreSQL server binaries are missing, the test
fails saying how to install them; if chromium is missing, likewise.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.flows.conftest import DeploymentRun, Stack, production_stack, run_deployment

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"
MEASURE_TASKS = {f"measure-{t}" for t in
                 ("PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_denom", "PH6", "PH7", "PH8_denom")}
ARTIFACT_KEYS = {"us-budget-spends", "us-input-validation", "us-output-validation", "us-output-manifest",
                 "us-ledger-checkpoint"}

pytestmark = pytest.mark.slow


def test_production_stack_on_postgresql(tmp_path_factory, tmp_path):
    """One stack, and what an operator does and sees with it, in order. One test rather than
    several sharing a fixture: pytest-xdist would start a stack for each worker that gets one."""
    with production_stack(tmp_path_factory.mktemp("stack")) as stack:
        check_deployments_schedules_and_parameter_types(stack)
        out = stack.folder / "releases"
        # The operator makes the dataset's ledger once (`phsafe ledger init`), then triggers the
        # first run saying why its records are a new version of the dataset.
        ledger = stack.folder / "enclave" / "us.jsonl"
        made = subprocess.run([str(Path(sys.executable).parent / "phsafe"), "ledger", "init", str(ledger),
                               "--lifetime-cap", "2", "--reason", "test release policy"], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        run = run_deployment(stack, "sdhc-us/us", {"output_root": str(out), "ledger": str(ledger),
                                                    "new_version_reason": "the demo's synthetic records"})
        state = run.flow_run.state
        assert state.is_completed(), (state.message, (stack.folder / "worker.log").read_text()[-4000:])
        check_us_run_on_postgresql(stack, run)
        check_flow_run_page_in_chromium(stack, run, tmp_path)


def _rows(artifact) -> list[dict]:
    return json.loads(artifact.data) if isinstance(artifact.data, str) else artifact.data


def _database_rows(stack: Stack, sql: str) -> list:
    import asyncio

    import asyncpg

    async def query():
        connection = await asyncpg.connect(stack.database.dsn)
        try:
            return await connection.fetch(sql)
        finally:
            await connection.close()

    return asyncio.run(query())


def check_us_run_on_postgresql(stack: Stack, run: DeploymentRun) -> None:
    """The US deployment, run by the process worker: Completed, its nine measure-* tasks, five
    artifacts and readable logs read back through the API, stored in PostgreSQL, no microdata."""
    assert re.fullmatch(r"us-\d{4}-\d\d-\d\dT\d\d:\d\dZ", run.flow_run.name), run.flow_run.name
    completed = {t.name for t in run.task_runs if t.state is not None and t.state.is_completed()}
    assert MEASURE_TASKS <= completed

    # The five artifacts, read back through the API; budgets as decimals.
    artifacts = {a.key: a for a in run.artifacts}
    assert set(artifacts) == ARTIFACT_KEYS
    spends = artifacts["us-budget-spends"]
    assert "planned total 1.257281" in spends.description, spends.description
    rows = _rows(spends)
    assert {r["table"] for r in rows} == {t.removeprefix("measure-") for t in MEASURE_TASKS}
    assert all("/" not in str(r["rho"]) for r in rows)
    assert any(r["rho"] == "0.002619" for r in rows)

    # The run is stored in PostgreSQL, and holds no microdata: no MAFID of the inputs anywhere
    # in the Prefect database (flow runs, task runs, parameters, artifacts, logs).
    stored = _database_rows(stack, f"SELECT name FROM flow_run WHERE id = '{run.flow_run.id}'")
    assert [r["name"] for r in stored] == [run.flow_run.name]
    dump = subprocess.run(
        [str(stack.database.bindir / "pg_dump"), "--data-only", stack.database.dsn],
        capture_output=True, text=True, timeout=120)
    assert dump.returncode == 0, dump.stderr
    assert run.flow_run.name in dump.stdout
    mafids = set(pd.read_csv(DEMO_US / "units.csv", dtype=str)["MAFID"])
    assert not mafids & set(re.findall(r"[A-Za-z0-9]+", dump.stdout))

    # Readable run logs: sentences with key fields, not JSON strings.
    messages = [entry.message for entry in run.logs]
    assert not [m for m in messages if m.lstrip().startswith("{")]
    assert any(re.fullmatch(r"measurement: table=PH\w+ level=(usa|state)_\S+ status=drawn cells=\d+", m)
               for m in messages), "\n".join(messages)
    assert any(m.startswith("plan: ") and "total=1.257281" in m for m in messages)

    published = list((stack.folder / "releases").glob("us-*/manifest.json"))
    assert len(published) == 1


def check_deployments_schedules_and_parameter_types(stack: Stack) -> None:
    """Deployed with --no-prompt: no recurring job on confidential inputs, a weekly rehearsal,
    one ledger per dataset, typed parameters, nothing pulled from remote storage."""
    import asyncio

    from prefect.client.orchestration import PrefectClient

    async def read():
        async with PrefectClient(api=stack.api) as client:
            return {name: await client.read_deployment_by_name(name)
                    for name in ("sdhc-release/release", "sdhc-us/us", "sdhc-pr/pr", "sdhc-rehearsal/rehearsal")}

    deployments = asyncio.run(read())
    # No recurring job on the confidential inputs: release, us, pr are triggered by hand.
    for name in ("sdhc-release/release", "sdhc-us/us", "sdhc-pr/pr"):
        assert deployments[name].schedules == [], name
    # The rehearsal: weekly, New York time, active.
    (weekly,) = deployments["sdhc-rehearsal/rehearsal"].schedules
    assert weekly.active and weekly.schedule.cron == "0 3 * * 0" and weekly.schedule.timezone == "America/New_York"
    # The release and the single-dataset deployments share each dataset's one ledger.
    release, us = deployments["sdhc-release/release"].parameters, deployments["sdhc-us/us"].parameters
    assert release["us_ledger"] == us["ledger"] and release["us_config"] == us["config"]
    assert deployments["sdhc-rehearsal/rehearsal"].parameters["us_config"] == us["config"]

    # Parameters typed as operators type them: numbers and choices, not JSON-quoted strings.
    properties = deployments["sdhc-us/us"].parameter_openapi_schema["properties"]
    cap = properties["lifetime_cap"]
    assert {"type": "number", "minimum": 0} in [{k: v for k, v in s.items() if k in ("type", "minimum")}
                                                 for s in cap.get("anyOf", [cap])]
    counting = json.dumps(properties["counting"])
    assert '"local"' in counting and '"dask"' in counting and "enum" in counting
    rehearsal = deployments["sdhc-rehearsal/rehearsal"].parameter_openapi_schema["properties"]
    assert rehearsal["persons"]["type"] == "integer" and rehearsal["trials"]["type"] == "integer"
    assert rehearsal["alpha"]["type"] == "number"

    # Deployed without a terminal and without prompting: nothing to pull from remote storage.
    for deployment in deployments.values():
        assert deployment.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]


def check_flow_run_page_in_chromium(stack: Stack, us_run: DeploymentRun, tmp_path: Path) -> None:
    """What the operator sees: the US flow run page, its nine measure-* task runs, the budget
    spends table; screenshots in the test's folder (flow-run.png, task-runs.png,
    measure-task-runs.png, budget-spends.png)."""
    from playwright.sync_api import expect

    from tests._browser import browser_page

    with browser_page(allow=(stack.ui,)) as page:
        page.goto(f"{stack.ui}/runs/flow-run/{us_run.flow_run.id}")
        expect(page.get_by_text(us_run.flow_run.name, exact=True).first).to_be_visible(timeout=60_000)
        expect(page.get_by_text("Completed", exact=True).first).to_be_visible()
        # The Logs tab (the default): readable lines, among them the plan with its decimal total.
        expect(page.get_by_text(re.compile(r"^private run: config=")).first).to_be_visible(timeout=30_000)
        assert not page.get_by_text(re.compile(r'^\{"')).count()
        page.screenshot(path=tmp_path / "flow-run.png", full_page=True)

        page.get_by_role("tablist").get_by_text("Task Runs", exact=True).click()
        expect(page.get_by_text("measure-PH1_num", exact=True)).to_be_visible(timeout=30_000)
        panel = page.get_by_role("tabpanel", name="Task Runs")
        # plan-budget, preflight, validate-and-count, fingerprint-inputs, open-ledger-run, the
        # nine measure-*, derive-and-write-tables, validate-outputs, publish
        expect(panel.get_by_text(re.compile(r"^17 Task runs$"))).to_be_visible()
        panel.get_by_placeholder("Search by run name").fill("measure-")
        expect(panel.get_by_text(re.compile(r"^publish-"))).to_have_count(0, timeout=30_000)
        shown = {name for name in panel.get_by_text(re.compile(r"^measure-PH\w+$")).all_inner_texts()}
        assert shown == MEASURE_TASKS, shown
        page.screenshot(path=tmp_path / "task-runs.png")  # the timeline and the filtered list
        panel.screenshot(path=tmp_path / "measure-task-runs.png")  # the nine, whole list

        page.get_by_role("tablist").get_by_text("Artifacts", exact=True).click()
        card = page.get_by_text("us-budget-spends", exact=True)
        expect(card).to_be_visible(timeout=30_000)
        expect(page.get_by_text(re.compile(r"planned total 1\.257281\.$"))).to_be_visible()
        card.click()
        table = page.get_by_role("table").first
        expect(table).to_be_visible(timeout=30_000)
        headers = {h.strip() for h in table.get_by_role("columnheader").all_inner_texts()}
        assert {"table", "level", "rho", "sensitivity", "variance", "moe90", "cells", "spends", "status"} <= headers
        expect(table.get_by_text("0.002619", exact=True).first).to_be_visible()  # rho as a decimal
        expect(table.get_by_text("PH1_num", exact=True).first).to_be_visible()
        expect(page.get_by_text("46 Items")).to_be_visible()  # 46 measurements (table x level)
        page.screenshot(path=tmp_path / "budget-spends.png", full_page=True)

        assert page.failed_requests == []  # nothing tried to leave the machine
    for shot in ("flow-run.png", "task-runs.png", "measure-task-runs.png", "budget-spends.png"):
        assert (tmp_path / shot).stat().st_size > 10_000, shot
    print(f"screenshots: {tmp_path}")
