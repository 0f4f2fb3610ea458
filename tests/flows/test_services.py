"""The service definitions in deployments/systemd and the deploy step's pure parts, checked as far
as a machine without a running systemd allows: ``systemd-analyze verify`` on the units installed
into the layout docs/operations.md describes (``/opt/phsafe`` = this repository with its .venv,
``/etc/phsafe`` = the environment files), and what the units promise: restart policies, every
ExecStart binary, WorkingDirectory and EnvironmentFile present, telemetry off, the database
password for the server only, the worker's stop sequence; the document's install and deploy
commands; the deploy step's settings, refusals and automations (the whole step runs for real in
test_server_e2e.py)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from deployments import deploy
from tests.flows._systemd_files import read_env_file, read_unit

REPO = Path(__file__).resolve().parents[2]
SYSTEMD = REPO / "deployments" / "systemd"
UNITS = ("prefect-server.service", "prefect-worker.service")
INSTALL_ROOT = Path("/opt/phsafe")  # docs/operations.md: the repository, built with `make env`
CONFIG_DIR = Path("/etc/phsafe")  # docs/operations.md: deployments/systemd/*.env installed here


def _installed(path: str, env_dir: Path) -> Path:
    """Where a path named in a unit is in this test's copy of the operator's document's layout."""
    p = Path(path.lstrip("-"))
    if p.is_relative_to(INSTALL_ROOT):
        return REPO / p.relative_to(INSTALL_ROOT)
    if p.is_relative_to(CONFIG_DIR):
        return env_dir / p.relative_to(CONFIG_DIR)
    return p


@pytest.fixture
def env_dir(tmp_path) -> Path:
    """/etc/phsafe as docs/operations.md installs it: the environment files from deployments/systemd."""
    target = tmp_path / "etc-phsafe"
    target.mkdir()
    for env_file in SYSTEMD.glob("*.env"):
        shutil.copy(env_file, target / env_file.name)
    return target


@pytest.mark.parametrize("name", UNITS)
def test_unit_names_only_what_the_layout_holds(name, env_dir):
    unit = read_unit(SYSTEMD / name)
    service = unit["Service"]
    assert service["Restart"][0] in ("on-failure", "always"), "a service must restart"
    assert service["User"] == ["phsafe"] and service["Group"] == ["phsafe"]
    assert _installed(service["WorkingDirectory"][0], env_dir) == REPO
    executable = _installed(shlex.split(service["ExecStart"][0])[0], env_dir)
    assert executable.is_file() and os.access(executable, os.X_OK), executable
    env_files = [_installed(p, env_dir) for p in service["EnvironmentFile"]]
    assert all(p.is_file() for p in env_files), env_files
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    env = {k: v for p in env_files for k, v in read_env_file(p).items()}
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" and env["DO_NOT_TRACK"] == "1"
    assert env["PREFECT_API_URL"].startswith("http://127.0.0.1:")
    # Only the server holds the database password; the worker and its flow runs never see it.
    holds_database = "PREFECT_API_DATABASE_CONNECTION_URL" in env
    assert holds_database is (name == "prefect-server.service")


def test_server_and_worker_agree_with_each_other_and_with_the_deployments(env_dir):
    shared = read_env_file(SYSTEMD / "prefect.env")
    server = read_env_file(SYSTEMD / "prefect-server.env")
    assert server["PREFECT_API_DATABASE_CONNECTION_URL"].startswith("postgresql+asyncpg://prefect:")
    assert shared["PREFECT_API_URL"] == (f"http://{server['PREFECT_SERVER_API_HOST']}:"
                                         f"{server['PREFECT_SERVER_API_PORT']}/api")
    worker = shlex.split(read_unit(SYSTEMD / "prefect-worker.service")["Service"]["ExecStart"][0])
    pool = worker[worker.index("--pool") + 1]
    deployments = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())["deployments"]
    assert {d["work_pool"]["name"] for d in deployments} == {pool}
    assert worker[worker.index("--type") + 1] == "process"
    # The environment files read the same in a shell (operators: set -a; . /etc/phsafe/prefect.env).
    for name, pairs in (("prefect.env", shared), ("prefect-server.env", server)):
        shell = subprocess.run(["bash", "-c", f"set -a; . {env_dir / name}; env -0"], capture_output=True,
                               env={"PATH": os.environ["PATH"]}, check=True).stdout.decode()
        exported = dict(item.split("=", 1) for item in shell.split("\0") if "=" in item)
        assert {k: exported.get(k) for k in pairs} == pairs


def test_systemd_analyze_verify(tmp_path, env_dir):
    """The units, with the document's paths mapped onto this checkout, pass `systemd-analyze verify`
    without a warning (syntax, unknown keys, executables)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing: `apt-get install -y systemd` (Debian) to check the units")
    rendered = tmp_path / "units"
    rendered.mkdir()
    for name in UNITS:
        text = (SYSTEMD / name).read_text()
        text = text.replace(str(INSTALL_ROOT), str(REPO)).replace(str(CONFIG_DIR), str(env_dir))
        (rendered / name).write_text(text)
    result = subprocess.run([analyze, "verify", "--man=no", *(str(rendered / n) for n in UNITS)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and not result.stderr.strip() and not result.stdout.strip(), \
        result.stdout + result.stderr

    drop_in = read_unit(SYSTEMD / "postgresql@.service.d" / "phsafe-restart.conf")
    assert drop_in["Service"]["Restart"] == ["on-failure"]


def _production_section() -> str:
    """The operator's document: installation, deploy step, operations."""
    return (REPO / "docs" / "operations.md").read_text()


def test_the_operations_doc_installs_every_file_and_orders_keys_deploy_worker():
    section = _production_section()
    for path in sorted(SYSTEMD.rglob("*")):
        if path.is_file():
            assert f"deployments/systemd/{path.relative_to(SYSTEMD)}" in section, path.name
    keys = section.index("phsafe keys generate /srv/sdhc/enclave/keys")
    deploy_step = section.index(". /etc/phsafe/alerts.env; set +a\n  .venv/bin/python deployments/deploy.py")
    worker = section.index("systemctl enable --now prefect-worker")
    assert section.index("phsafe ledger init") < keys < deploy_step < worker
    # Nobody edits the tracked deployments/prefect.yaml: the document never asks to.
    assert "Edit** the `inputs:` block" not in section and "edit the parameters" not in section.lower()
    # The layout a service user can run: the system's python; the UI written where phsafe may write.
    assert "make env PYTHON=/usr/bin/python3" in section and "PREFECT_UI_STATIC_DIRECTORY" in section
    assert section.index("make env PYTHON=/usr/bin/python3") < section.index("useradd --system")
    # Every worker an operator is told to start is deployments/worker.py (its stop is safe).
    commands = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()]
    assert any("deployments/worker.py --pool phsafe-process" in line for line in commands)
    assert not [line for line in commands if "prefect worker start" in line and not line.lstrip().startswith("#")]


def test_the_operations_doc_deploy_command_sets_every_setting_and_the_keys_it_made():
    """The first deploy in the operator's document gives every setting prefect.yaml uses, once, and the signing
    key pair is the one `phsafe keys generate` made."""
    section = _production_section()
    command = section[section.index(".venv/bin/python deployments/deploy.py \\"):]
    command = command[:command.index("'")]
    given = re.findall(r"--set (\w+)=(\S+)", command)
    names = [name for name, _ in given]
    assert sorted(names) == sorted(n.removeprefix("phsafe_") for n in deploy.setting_names())
    assert len(names) == len(set(names))
    values = dict(given)
    assert values["signing_key"] == "/srv/sdhc/enclave/keys/signing-key.pem"
    assert values["public_key"] == "/srv/sdhc/enclave/keys/public-key.pem"
    assert values["us_ledger"] == "/srv/sdhc/enclave/us/ledger.jsonl" in section  # made by `phsafe ledger init`
    assert values["pr_ledger"] == "/srv/sdhc/enclave/pr/ledger.jsonl" in section


def test_the_operations_doc_cap_guidance_is_the_policy_limit_not_a_re_spend_margin():
    section = _production_section()
    assert "and one re-spend margin" not in section and "planned 1.257281, and one" not in section
    assert "refused by each dataset's lifetime cap" not in section
    assert "policy limit" in section


def test_worker_unit_stops_through_the_phsafe_worker():
    """The unit runs deployments/worker.py, which on SIGTERM kills the Prefect worker and sends
    SIGTERM to each flow run (the flows stop at their next safe point); systemd signals it alone
    (KillMode=mixed) and SIGKILLs what is left only after TimeoutStopSec, beyond the worker's
    own grace (the end-to-end test stops it and counts the INTENTs)."""
    from deployments import worker

    service = read_unit(SYSTEMD / "prefect-worker.service")["Service"]
    command = shlex.split(service["ExecStart"][0])
    assert command[:2] == ["/opt/phsafe/.venv/bin/python", "/opt/phsafe/deployments/worker.py"]
    assert (REPO / "deployments" / "worker.py").is_file()
    assert command[2:] == ["--pool", "phsafe-process", "--type", "process", "--limit", "1"]
    assert "ExecStop" not in service and "SuccessExitStatus" not in service
    assert service["KillMode"] == ["mixed"] and service["KillSignal"] == ["SIGTERM"]
    timeout = service["TimeoutStopSec"][0]
    assert timeout.endswith("s") and worker.DEFAULT_GRACE + 5 <= int(timeout[:-1]) <= 300
    # Heartbeats every 30 s, so that a run whose process died is marked Crashed (five missed).
    shared = read_env_file(SYSTEMD / "prefect.env")
    assert shared["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"


def test_the_server_writes_its_ui_where_its_user_may_write():
    """The venv is root's; the server, as phsafe, writes its copy of the UI into its own folder."""
    server = read_env_file(SYSTEMD / "prefect-server.env")
    home = Path(read_env_file(SYSTEMD / "prefect.env")["PREFECT_HOME"])
    assert Path(server["PREFECT_UI_STATIC_DIRECTORY"]).is_relative_to(home)


def test_the_deploy_step_refuses_code_that_is_not_a_clean_commit(monkeypatch, capsys):
    from phsafe import provenance

    for found, why in (
            (provenance.Provenance("0.1.0", None, None, "none", "the code's commit cannot be known: no install stamp"),
             "the code's commit cannot be known"),
            (provenance.Provenance("0.1.0", "a" * 40, False, "stamp", "2 file(s) of the code changed since it was "
                                                                       "installed"), "2 file(s) of the code changed")):
        monkeypatch.setattr(provenance, "provenance", lambda found=found: found)
        with pytest.raises(deploy.Refused) as refused:
            deploy.code_step(allow_dirty=False)
        assert str(refused.value).startswith(why) and "--allow-dirty" in str(refused.value), refused.value
        assert "\n" not in str(refused.value)
        assert deploy.code_step(allow_dirty=True) == found.code_version
        assert f"warning (--allow-dirty): {why}" in capsys.readouterr().out
    clean = provenance.Provenance("0.1.0", "b" * 40, True, "stamp")
    monkeypatch.setattr(provenance, "provenance", lambda: clean)
    assert deploy.code_step(allow_dirty=False) == "0.1.0+gbbbbbbbbbbbb"


def test_alerts_env_is_for_the_deploy_step_only():
    alerts = read_env_file(SYSTEMD / "alerts.env")
    assert set(alerts) == {"PHSAFE_ALERT_WEBHOOK_URL", "PHSAFE_ALERT_RUNNING_LIMIT"}
    assert alerts["PHSAFE_ALERT_WEBHOOK_URL"].startswith("https://")
    assert deploy.parse_duration(alerts["PHSAFE_ALERT_RUNNING_LIMIT"]) == 3 * 3600
    settings = deploy.AlertSettings.from_environment(alerts, demo=False)
    assert settings is not None and settings.block is None
    for name in UNITS:  # neither service reads it: the server gets the URL from the block
        assert not any("alerts.env" in f for f in read_unit(SYSTEMD / name)["Service"]["EnvironmentFile"])


# --------------------------------------------------------------------------------------------
# The deploy step (deployments/deploy.py), its pure parts
# --------------------------------------------------------------------------------------------


def test_the_settings_are_every_prefect_variable_of_prefect_yaml_and_nothing_else_is_per_host():
    text = (REPO / "deployments" / "prefect.yaml").read_text()
    names = deploy.setting_names()
    assert names == ["phsafe_us_config", "phsafe_us_data", "phsafe_us_ledger", "phsafe_pr_config", "phsafe_pr_data",
                     "phsafe_pr_ledger", "phsafe_output_root", "phsafe_signing_key", "phsafe_public_key",
                     "phsafe_rehearsal_root"]
    assert sorted(deploy.DEMO_SETTINGS) == sorted(n.removeprefix("phsafe_") for n in names)
    # No host path is left in the tracked file's values: every input is a setting.
    config = yaml.safe_load(text)
    for d in config["deployments"]:
        for key, value in d["parameters"].items():
            if key in ("config", "data", "ledger", "output_root", "signing_key", "public_key", "work_root") \
                    or key.endswith(("_config", "_data", "_ledger")):
                assert re.fullmatch(r"\{\{ prefect\.variables\.phsafe_\w+ \}\}", value), (d["name"], key, value)


def test_the_spending_deployments_run_one_at_a_time_and_cancel_a_colliding_trigger():
    config = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    limits = {d["name"]: d.get("concurrency_limit") for d in config["deployments"]}
    for name in ("release", "us", "pr"):
        assert limits[name] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}, name
    assert limits["rehearsal"] is None


@pytest.mark.parametrize(("given", "reason"), [
    (["nope=1"], "--set nope: not a setting of deployments/prefect.yaml"),
    (["us_ledger"], "--set 'us_ledger': give NAME=VALUE"),
    (["us_ledger= "], "--set us_ledger: the value is empty"),
])
def test_set_refuses_what_is_not_a_setting(given, reason):
    with pytest.raises(deploy.Refused, match=re.escape(reason)):
        deploy.parse_assignments(given, deploy.setting_names())


def test_set_takes_names_with_or_without_the_prefix_and_values_with_equals_signs():
    values = deploy.parse_assignments(["us_ledger=/srv/a=b.jsonl", "phsafe_pr_data=/srv/pr"], deploy.setting_names())
    assert values == {"phsafe_us_ledger": "/srv/a=b.jsonl", "phsafe_pr_data": "/srv/pr"}


def test_a_missing_setting_is_refused_in_one_line_naming_each():
    values = {name: "/srv/x" for name in deploy.setting_names()} | {"phsafe_pr_ledger": None,
                                                                    "phsafe_signing_key": " "}
    with pytest.raises(deploy.Refused) as refused:
        deploy.check_settings(values)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("missing setting(s), as Prefect variables: phsafe_pr_ledger, phsafe_signing_key --")
    assert "--set pr_ledger=/srv/..." in message and "--demo" in message
    deploy.check_settings({name: "/srv/x" for name in deploy.setting_names()})  # all given: no refusal


@pytest.mark.parametrize(("text", "seconds"), [("3h", 10800), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("600", 600), ("1d", 86400)])
def test_running_limit_durations(text, seconds):
    assert deploy.parse_duration(text) == seconds
    assert deploy.parse_duration(deploy.duration_text(seconds)) == seconds


@pytest.mark.parametrize("text", ["5s", "3 hours", "", "-1h"])
def test_running_limit_refuses_what_prefect_cannot_time(text):
    with pytest.raises(deploy.Refused, match="PHSAFE_ALERT_RUNNING_LIMIT"):
        deploy.parse_duration(text)


def test_alert_settings_refuse_a_missing_destination_unless_demo():
    with pytest.raises(deploy.Refused, match="no alert destination: set PHSAFE_ALERT_WEBHOOK_URL"):
        deploy.AlertSettings.from_environment({}, demo=False)
    assert deploy.AlertSettings.from_environment({}, demo=True) is None
    with pytest.raises(deploy.Refused, match="must be an http:// or https:// URL"):
        deploy.AlertSettings.from_environment({"PHSAFE_ALERT_WEBHOOK_URL": "ftp://x"}, demo=False)
    with pytest.raises(deploy.Refused, match="not both"):
        deploy.AlertSettings.from_environment({"PHSAFE_ALERT_WEBHOOK_URL": "https://x", "PHSAFE_ALERT_BLOCK": "a/b"},
                                              demo=False)
    block = deploy.AlertSettings.from_environment({"PHSAFE_ALERT_BLOCK": "slack-webhook/ops"}, demo=False)
    assert block.block == "slack-webhook/ops" and block.webhook_url is None


def test_the_automations_file_is_prefect_s_format_once_the_deploy_step_fills_it():
    from prefect.events.actions import ChangeFlowRunState, SendNotification
    from prefect.events.schemas.automations import AutomationCore, Posture

    filled = deploy.automations_from_file(deploy.AUTOMATIONS_FILE, {
        "alert_block_id": "00000000-0000-0000-0000-000000000001", "running_limit_seconds": 10800,
        "running_limit": "3h", "heartbeat_timeout_seconds": 150, "heartbeat_timeout": "2m30s"})
    automations = {a.name: a for a in (AutomationCore.model_validate(x) for x in filled)}
    assert all(name.startswith(deploy.AUTOMATION_PREFIX) for name in automations)
    failed = automations["phsafe: a run failed or crashed"]
    assert failed.trigger.expect == {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}
    (notify,) = failed.actions
    assert isinstance(notify, SendNotification) and str(notify.block_document_id).endswith("1")
    for field in ("{{ deployment.name }}", "{{ flow_run.name }}", "{{ flow_run.state.name }}",
                  "{{ flow_run.state.message"):
        assert field in notify.body
    running = automations["phsafe: a run is still running past its time limit"]
    assert running.trigger.posture is Posture.Proactive and running.trigger.within.total_seconds() == 10800
    assert "past the time limit of 3h" in running.actions[0].body
    died = automations["phsafe: a run whose process died is marked Crashed"]
    assert died.trigger.within.total_seconds() == 150 and "prefect.flow-run.heartbeat" in died.trigger.expect
    # The flows' last event (after their final state) ends the wait: a final run is never marked.
    from flows._ended import ENDED

    assert ENDED in died.trigger.expect
    (crash,) = died.actions
    assert isinstance(crash, ChangeFlowRunState) and crash.state.value == "CRASHED" and "2m30s" in crash.message
    assert "${" not in str(filled)  # every value filled


def test_the_deploy_step_refuses_without_a_server_address(monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert deploy.main([]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "deploy: refused: PREFECT_API_URL is not set: load the environment first "
        "(set -a; . /etc/phsafe/prefect.env; set +a)"]


def test_missing_postgresql_fails_saying_how_to_install_it(monkeypatch):
    """The PostgreSQL test installs nothing and never skips: without the binaries it fails, with
    the command that installs them."""
    from tests.flows import conftest

    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    monkeypatch.setattr(conftest.glob, "glob", lambda pattern: [])
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y postgresql"):
        conftest.postgres_bindir()
