"""The deploy step of phsafe: per-host settings, work pool, deployments and alerts, idempotently.

Run from any directory, with the environment of /etc/phsafe loaded (docs/operations.md, "Deploy")::

    set -a; . /etc/phsafe/prefect.env; . /etc/phsafe/alerts.env; set +a
    .venv/bin/python deployments/deploy.py --set us_config=/srv/sdhc/us/config.json ...   # first time
    .venv/bin/python deployments/deploy.py                                             # after an upgrade

In order, each step timed, each refusal one line on stderr (exit 1); everything that can be
refused is checked before ``prefect deploy`` runs:

1. **Settings.** Each host's paths (every ``{{ prefect.variables.NAME }}`` of
   ``deployments/prefect.yaml``) are Prefect Variables; ``--set NAME=VALUE`` writes one (the
   ``phsafe_`` prefix may be left out), ``--demo`` fills the missing ones with the bundled demo's
   values (and makes a demo signing key pair under demo/output/). A missing or empty setting is
   refused -- ``prefect deploy`` alone would silently deploy an empty string.
2. **Alerts' settings** from the environment (``/etc/phsafe/alerts.env``):
   ``PHSAFE_ALERT_WEBHOOK_URL`` (or ``PHSAFE_ALERT_BLOCK=<block type>/<name>``, any notification
   block made in the UI) and ``PHSAFE_ALERT_RUNNING_LIMIT`` (default ``3h``). Refused when
   neither is set, except with ``--demo``, which then deploys without alerts.
3. **Work pool** ``phsafe-process`` (process type): made if missing.
4. **Alert block**: the Custom Webhook block ``phsafe-alerts`` saved (overwritten) from the URL,
   or the named block looked up; the automations of ``deployments/automations.yaml`` filled in
   and validated.
5. **Code version**: the commit the install stamp of ``make env`` names (``phsafe/provenance.py``),
   checked against the files; code whose commit is unknown, or that differs from its commit, is
   refused unless ``--allow-dirty`` (then runs record it as ``.dirty`` or ``+unknown``).
   **Deployments**: ``prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml``
   from the repository root, which stays untouched, with the code version as the deployments'
   ``version`` (``PHSAFE_CODE_VERSION``); each flow run compares it with the code it runs, and
   says so if they differ.
6. **Automations** created, or updated where they differ, by name; automations named
   ``phsafe: ...`` that the file no longer has are deleted.

Re-running it changes nothing that is already as the repository and the settings say.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
PREFECT_FILE = Path("deployments/prefect.yaml")  # relative to REPO, as prefect deploy records it
AUTOMATIONS_FILE = REPO / "deployments" / "automations.yaml"
WORK_POOL = "phsafe-process"
SETTING_PREFIX = "phsafe_"
SETTING_TAG = "phsafe-setting"
ALERT_BLOCK_NAME = "phsafe-alerts"
AUTOMATION_PREFIX = "phsafe: "
DEFAULT_RUNNING_LIMIT = "3h"
MIN_RUNNING_LIMIT_SECONDS = 10  # Prefect's minimum for a proactive trigger
HEARTBEATS_MISSED = 5  # a flow run without a heartbeat for this many periods is marked Crashed

DEMO_KEYS = Path("demo/output/prefect/keys")
DEMO_SETTINGS = {
    "us_config": "demo/data/us/config.json",
    "us_data": "demo/data/us",
    "us_ledger": "demo/output/prefect/ledgers/us-ledger.jsonl",
    "pr_config": "demo/data/pr/config.json",
    "pr_data": "demo/data/pr",
    "pr_ledger": "demo/output/prefect/ledgers/pr-ledger.jsonl",
    "output_root": "demo/output/prefect/releases",
    "signing_key": str(DEMO_KEYS / "signing-key.pem"),
    "public_key": str(DEMO_KEYS / "public-key.pem"),
    "rehearsal_root": "demo/output/prefect/rehearsals",
}
"""The bundled demo's values, relative to the repository root (where the worker runs flows)."""

_PLACEHOLDER = re.compile(r"\{\{\s*prefect\.variables\.(\w+)\s*\}\}")
_OURS = re.compile(r"\$\{(\w+)\}")
_DURATION = re.compile(r"(?:\d+[dhms])+|\d+")
_DURATION_PART = re.compile(r"(\d+)([dhms])")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class Refused(Exception):
    """Why the deploy step stops: one line for the operator."""


def say(message: str) -> None:
    print(f"deploy: {message}", flush=True)


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------


def setting_names(prefect_file: Path = REPO / PREFECT_FILE) -> list[str]:
    """The Prefect Variables the values of ``prefect.yaml`` use, in the order it first uses them."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            found.extend(_PLACEHOLDER.findall(node))

    walk(yaml.safe_load(prefect_file.read_text(encoding="utf-8")))
    return list(dict.fromkeys(found))


def parse_assignments(assignments: list[str], names: list[str]) -> dict[str, str]:
    """``--set us_config=/srv/x`` (or ``phsafe_us_config=...``) -> ``{"phsafe_us_config": "/srv/x"}``."""
    values: dict[str, str] = {}
    for item in assignments:
        name, sep, value = item.partition("=")
        name = name.strip()
        variable = name if name.startswith(SETTING_PREFIX) else SETTING_PREFIX + name
        if not sep or not name:
            raise Refused(f"--set {item!r}: give NAME=VALUE, e.g. --set us_ledger=/srv/sdhc/enclave/us/ledger.jsonl")
        if variable not in names:
            known = ", ".join(n.removeprefix(SETTING_PREFIX) for n in names)
            raise Refused(f"--set {name}: not a setting of {PREFECT_FILE} (the settings: {known})")
        if not value.strip():
            raise Refused(f"--set {name}: the value is empty")
        values[variable] = value.strip()
    return values


def check_settings(values: dict[str, Any]) -> None:
    """Refuse (one line, naming each) settings that are missing, empty or not text."""
    missing = [name for name, value in values.items() if not isinstance(value, str) or not value.strip()]
    if missing:
        example = missing[0].removeprefix(SETTING_PREFIX)
        raise Refused(f"missing setting(s), as Prefect variables: {', '.join(missing)} -- set each with "
                      f"--set NAME=VALUE (e.g. --set {example}=/srv/...), or --demo for the bundled demo's values")


def parse_duration(text: str) -> int:
    """``"3h"``, ``"1h30m"``, ``"45s"``, ``"600"`` -> seconds (at least Prefect's 10 s)."""
    cleaned = text.strip().lower()
    if not _DURATION.fullmatch(cleaned):
        raise Refused(f"PHSAFE_ALERT_RUNNING_LIMIT={text!r}: give a duration such as 3h, 1h30m or 600s")
    seconds = int(cleaned) if cleaned.isdigit() else \
        sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(cleaned))
    if seconds < MIN_RUNNING_LIMIT_SECONDS:
        raise Refused(f"PHSAFE_ALERT_RUNNING_LIMIT={text!r}: at least {MIN_RUNNING_LIMIT_SECONDS} s")
    return seconds


def duration_text(seconds: int) -> str:
    """``9000`` -> ``"2h30m"``, ``150`` -> ``"2m30s"``."""
    parts = []
    for unit in ("d", "h", "m", "s"):
        count, seconds = divmod(seconds, _UNIT_SECONDS[unit])
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


@dataclass
class AlertSettings:
    webhook_url: str | None
    block: str | None
    running_limit_seconds: int

    @classmethod
    def from_environment(cls, environ: dict[str, str], *, demo: bool) -> "AlertSettings | None":
        url = environ.get("PHSAFE_ALERT_WEBHOOK_URL", "").strip() or None
        block = environ.get("PHSAFE_ALERT_BLOCK", "").strip() or None
        limit = parse_duration(environ.get("PHSAFE_ALERT_RUNNING_LIMIT", "").strip() or DEFAULT_RUNNING_LIMIT)
        if url and block:
            raise Refused("set PHSAFE_ALERT_WEBHOOK_URL or PHSAFE_ALERT_BLOCK, not both")
        if url is None and block is None:
            if demo:
                return None
            raise Refused("no alert destination: set PHSAFE_ALERT_WEBHOOK_URL (or PHSAFE_ALERT_BLOCK) in "
                          "/etc/phsafe/alerts.env and load it (set -a; . /etc/phsafe/alerts.env; set +a)")
        if url is not None and not re.match(r"^https?://[^\s/]+", url):
            raise Refused("PHSAFE_ALERT_WEBHOOK_URL must be an http:// or https:// URL")
        if block is not None and block.count("/") != 1:
            raise Refused(f"PHSAFE_ALERT_BLOCK={block!r}: give <block type slug>/<block name>, e.g. slack-webhook/ops")
        return cls(url, block, limit)


def automations_from_file(path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The automations of ``path`` with the deploy step's ``${name}`` values filled in."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: fill(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v) for v in node]
        if isinstance(node, str):
            whole = _OURS.fullmatch(node)
            if whole:
                return values[whole.group(1)]  # typed: a number stays a number
            return _OURS.sub(lambda m: str(values[m.group(1)]), node)
        return node

    return [fill(a) for a in document["automations"]]


# --------------------------------------------------------------------------------------------
# The steps
# --------------------------------------------------------------------------------------------


def _checkout_files() -> dict[str, tuple[int, int]]:
    """Every file of the checkout (but .git and the venv) with its size and modification time:
    what ``prefect deploy`` must leave as it found it. Read without git, which the services'
    user may not be allowed to run on a checkout root owns."""
    found: dict[str, tuple[int, int]] = {}
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [d for d in subfolders if d not in (".git", ".venv", "__pycache__")]
        for name in files:
            path = Path(folder) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            found[str(path.relative_to(REPO))] = (st.st_size, st.st_mtime_ns)
    return found


async def settings_step(client: Any, assignments: dict[str, str], demo: bool) -> dict[str, str]:
    from prefect.variables import Variable

    names = setting_names()
    for name, value in assignments.items():
        await Variable.aset(name, value, tags=[SETTING_TAG], overwrite=True)
    current = {name: (await client.read_variable_by_name(name)) for name in names}
    values = {name: v.value if v is not None else None for name, v in current.items()}
    if demo:
        made = []
        for name, value in values.items():
            if value in (None, ""):
                demo_value = DEMO_SETTINGS[name.removeprefix(SETTING_PREFIX)]
                await Variable.aset(name, demo_value, tags=[SETTING_TAG], overwrite=True)
                values[name] = demo_value
                made.append(name)
        if made:
            say(f"demo values for {len(made)} unset setting(s): {', '.join(made)}")
        if values.get(SETTING_PREFIX + "signing_key") == DEMO_SETTINGS["signing_key"] and \
                not (REPO / DEMO_SETTINGS["signing_key"]).exists():
            from phsafe.signing import generate_signing_key

            pair = generate_signing_key(REPO / DEMO_KEYS)
            say(f"made the demo's signing key pair in {pair.private_key.parent} (throwaway, never for production)")
    check_settings(values)
    for name, value in values.items():
        path = Path(value) if Path(value).is_absolute() else REPO / value
        if not path.exists() and not name.endswith(("_root",)):
            say(f"note: {name} = {value}, which does not exist on this host (yet)")
    return values


async def work_pool_step(client: Any) -> str:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    try:
        pool = await client.read_work_pool(WORK_POOL)
    except ObjectNotFound:
        await client.create_work_pool(WorkPoolCreate(name=WORK_POOL, type="process"))
        return f"work pool {WORK_POOL} (process) created"
    if pool.type != "process":
        raise Refused(f"the work pool {WORK_POOL} exists with type {pool.type!r}; the phsafe worker needs 'process'")
    return f"work pool {WORK_POOL} (process) already there"


def code_step(allow_dirty: bool) -> str:
    """The code version runs will record, from the install stamp; refused when it is unknown or
    not a clean commit, unless ``allow_dirty``."""
    from phsafe.provenance import provenance

    found = provenance()
    if found.commit is None or not found.clean:
        why = found.note or f"the code is {found.code_version}"
        if not allow_dirty:
            raise Refused(f"{why}. Deploy a clean checkout of a commit, stamped by `make env` as its owner "
                          f"(git checkout <tag> && make env), or give --allow-dirty to deploy it anyway as "
                          f"{found.code_version}")
        say(f"warning (--allow-dirty): {why}")
    return found.code_version


def deployments_step(version: str) -> str:
    prefect = Path(sys.executable).parent / "prefect"
    args = [str(prefect), "--no-prompt", "deploy", "--all", "--prefect-file", str(PREFECT_FILE)]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PHSAFE_CODE_VERSION=version))  # prefect.yaml's `version:`
    if done.returncode != 0:
        tail = " | ".join(line.strip() for line in (done.stdout + done.stderr).splitlines()[-8:] if line.strip())
        raise Refused(f"`prefect deploy` failed: {tail}")
    deployed = re.findall(r"Deployment '([^']+)' successfully created", done.stdout)
    return f"deployed {', '.join(deployed) or 'the deployments'} (prefect --no-prompt deploy --all)"


async def alert_block_step(client: Any, alerts: AlertSettings) -> tuple[Any, str]:
    """The notification block the automations send through; its id and a description."""
    if alerts.block is not None:
        slug, name = alerts.block.split("/")
        from prefect.exceptions import ObjectNotFound

        try:
            document = await client.read_block_document_by_name(name, block_type_slug=slug)
        except ObjectNotFound:
            raise Refused(f"PHSAFE_ALERT_BLOCK={alerts.block}: no such block; make it in the UI (Blocks) first") from None
        if "notify" not in (document.block_schema.capabilities if document.block_schema else []):
            raise Refused(f"PHSAFE_ALERT_BLOCK={alerts.block} is not a notification block")
        return document.id, f"the existing block {alerts.block}"

    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    # The URL is kept as a secret value of the block (it may hold a token): the UI shows it masked.
    block = CustomWebhookNotificationBlock(
        name=ALERT_BLOCK_NAME,
        url="{{alert_url}}",
        secrets={"alert_url": alerts.webhook_url},
        method="POST",
        # {"text": ...} is what Slack, Mattermost and Teams incoming webhooks read.
        json_data={"subject": "{{subject}}", "body": "{{body}}", "text": "{{subject}}\n{{body}}"},
        timeout=15,
    )
    block_id = await block.save(ALERT_BLOCK_NAME, overwrite=True)
    return block_id, f"the Custom Webhook block {ALERT_BLOCK_NAME} (URL from PHSAFE_ALERT_WEBHOOK_URL)"


def heartbeat_seconds() -> int:
    from prefect.settings import get_current_settings

    return get_current_settings().flows.heartbeat_frequency or 180


def wanted_automations(block_id: Any, alerts: AlertSettings) -> list[Any]:
    """The automations of the file, filled in and validated as Prefect's AutomationCore."""
    from prefect.events.schemas.automations import AutomationCore

    heartbeat = heartbeat_seconds()
    wanted = [AutomationCore.model_validate(a) for a in automations_from_file(AUTOMATIONS_FILE, {
        "alert_block_id": str(block_id),
        "running_limit_seconds": alerts.running_limit_seconds,
        "running_limit": duration_text(alerts.running_limit_seconds),
        "heartbeat_timeout_seconds": HEARTBEATS_MISSED * heartbeat,
        "heartbeat_timeout": duration_text(HEARTBEATS_MISSED * heartbeat),
    })]
    if len({a.name for a in wanted}) != len(wanted) or not all(a.name.startswith(AUTOMATION_PREFIX) for a in wanted):
        raise Refused(f"{AUTOMATIONS_FILE.name}: each automation needs a unique name starting {AUTOMATION_PREFIX!r}")
    return wanted


async def automations_step(client: Any, wanted: list[Any], alerts: AlertSettings) -> str:
    """Create what is missing, update what differs, delete stale ``phsafe: ...`` automations."""
    heartbeat = heartbeat_seconds()
    existing: dict[str, list[Any]] = {}
    for automation in await client.read_automations():
        if automation.name.startswith(AUTOMATION_PREFIX):
            existing.setdefault(automation.name, []).append(automation)
    created = updated = unchanged = deleted = 0
    for automation in wanted:
        found = existing.pop(automation.name, [])
        if not found:
            await client.create_automation(automation)
            created += 1
        elif _comparable(found[0]) == _comparable(automation):
            # Left alone: updating an automation restarts its triggers, which would forget the
            # runs a proactive alert is timing (a re-deploy during a release).
            unchanged += 1
        else:
            await client.update_automation(found[0].id, automation)
            updated += 1
        for duplicate in found[1:]:  # e.g. from a `prefect automation create` by hand
            await client.delete_automation(duplicate.id)
            deleted += 1
    for stale in existing.values():
        for automation in stale:
            await client.delete_automation(automation.id)
            deleted += 1
    return (f"automations: {created} created, {updated} updated, {unchanged} unchanged, {deleted} deleted "
            f"(failed or crashed runs; running past {duration_text(alerts.running_limit_seconds)}; "
            f"no heartbeat for {duration_text(HEARTBEATS_MISSED * heartbeat)})")


def _comparable(automation: Any) -> dict[str, Any]:
    """An automation as the file defines it, without the ids the server gives it."""
    from prefect.events.schemas.automations import AutomationCore

    core = AutomationCore.model_validate(automation.model_dump(include=set(AutomationCore.model_fields)))
    dumped = core.model_dump(mode="json")
    dumped["trigger"].pop("id", None)
    for key in ("after", "expect", "for_each"):  # sets: their JSON order is arbitrary
        if key in dumped["trigger"]:
            dumped["trigger"][key] = sorted(dumped["trigger"][key])
    return dumped


async def deploy(assignments: list[str], demo: bool, allow_dirty: bool = False) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:
        raise Refused("PREFECT_API_URL is not set: load the environment first (set -a; . /etc/phsafe/prefect.env; set +a)")
    alerts = AlertSettings.from_environment(dict(os.environ), demo=demo)
    names = setting_names()
    values = parse_assignments(assignments, names)
    version = code_step(allow_dirty)
    total = time.perf_counter()
    async with get_client() as client:
        clock = time.perf_counter()
        if await client.api_healthcheck() is not None:  # the exception, if the server cannot be reached
            raise Refused(f"cannot reach the Prefect server at {api} (is prefect-server running?)")

        settings = await settings_step(client, values, demo)
        say(f"settings: {len(settings)} Prefect variables set ({time.perf_counter() - clock:.1f} s)")

        clock = time.perf_counter()
        say(f"{await work_pool_step(client)} ({time.perf_counter() - clock:.1f} s)")

        # The alert block and the automations are checked before anything is deployed.
        if alerts is not None:
            clock = time.perf_counter()
            block_id, block = await alert_block_step(client, alerts)
            wanted = wanted_automations(block_id, alerts)
            alert_seconds = time.perf_counter() - clock

        before = _checkout_files()
        clock = time.perf_counter()
        say(f"{deployments_step(version)} ({time.perf_counter() - clock:.1f} s)")
        if _checkout_files() != before:
            say("warning: `prefect deploy` changed files in the checkout")

        if alerts is None:
            say("alerts: none (--demo without PHSAFE_ALERT_WEBHOOK_URL): no one is notified of a failed run")
        else:
            clock = time.perf_counter()
            summary = await automations_step(client, wanted, alerts)
            say(f"{summary}, through {block} ({alert_seconds + time.perf_counter() - clock:.1f} s)")
    say(f"done in {time.perf_counter() - total:.1f} s; runs will record code version {version}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="deployments/deploy.py",
        description="Deploy phsafe to the Prefect server of PREFECT_API_URL: settings, work pool, deployments, "
                    "alerts. Idempotent: re-run it after an upgrade or a change of settings.")
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="NAME=VALUE",
                        help="Set a per-host setting (a Prefect variable phsafe_NAME), e.g. "
                             "--set us_ledger=/srv/sdhc/enclave/us/ledger.jsonl; repeatable.")
    parser.add_argument("--demo", action="store_true",
                        help="Fill unset settings with the bundled demo's values (a first look, the tests); "
                             "alerts are then optional.")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="Deploy code whose commit is unknown or that differs from its commit (runs record "
                             "it as +unknown or .dirty); refused without this.")
    args = parser.parse_args(argv)
    try:
        asyncio.run(deploy(args.assignments, args.demo, args.allow_dirty))
    except Refused as refusal:
        print(f"deploy: refused: {refusal}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
