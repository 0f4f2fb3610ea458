"""One log per dataset, against real witness services (``phsafe witness serve``, processes of their own).

The operator's side is the command line only; each witness's operator is played by
:meth:`tests.system._witness_services.Service.witness` (the log's key and its registration put in
the witness's logs folder). In order:

1. ledger A declares the dataset ``claims-test``; its registration is accepted by both witnesses,
   which cosign it; a run of another dataset on A is refused in one line, nothing spent;
2. a fresh ``ledger init`` B for the same dataset (another name, another key) gets no
   cosignature: both witnesses refuse it, with the line that says what to do;
3. a third ledger C for the dataset, pointed at a witness that does not know A, is cosigned by
   it -- a witness holds the claims it was shown -- and the monitor that follows A reports C's
   unretired claim (``dataset-claimed``, exit 11);
4. A retires the dataset publicly in favour of B (a ``dataset-retired`` entry its witnesses
   cosign); B's registration carries that retirement and is accepted: B is cosigned, the
   witnesses hold the dataset for B (``GET /claims``); ``audit public --log A`` states the
   retirement; the monitor lets B take the dataset over; a run of the dataset on A is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from phsafe import synthetic
from phsafe.publog import log_path
from tests._cli import phsafe
from tests.conftest import US_CONFIG
from tests.system._witness_services import Service

PHSAFE = Path(sys.executable).parent / "phsafe"
DATASET = "claims-test"


def cli(*args: object) -> subprocess.CompletedProcess:
    return phsafe(*args)  # in this process, as a subprocess would see it (tests/_cli.py); the witnesses are processes


def error_line(proc: subprocess.CompletedProcess) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith(("phsafe: error:", "FAILED"))]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


def init(ledger: Path, *services: Service) -> None:
    made = cli("ledger", "init", ledger, "--lifetime-cap", "3", "--reason", "one log per dataset", "--dataset", DATASET,
               *[a for s in services for a in ("--witness", s.url, s.vkey)])
    assert made.returncode == 0 and f"it accounts the dataset(s) {DATASET} and no other" in made.stdout, made.stderr


def monitor(log: Path, state: Path, *services: Service) -> subprocess.CompletedProcess:
    return cli("audit", "monitor", log, "--key", log / "log.vkey", "--state", state, "--once",
               *[a for s in services for a in ("--witness-key", s.vkey)])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("dataset-claims")
    synthetic.write(synthetic.generate(200, ["01"], seed=5), root / "data")
    for name in (DATASET, "another-dataset"):
        raw = json.loads(US_CONFIG.read_text())
        raw["state_filter"], raw["dataset"] = ["01"], name
        (root / f"{name}.json").write_text(json.dumps(raw))
    services = [Service(root, "witness1").start(), Service(root, "witness2").start(), Service(root, "witness3").start()]
    try:
        yield {"root": root, "services": services}
    finally:
        for service in services:
            service.stop()


def test_a_second_log_for_a_dataset_is_refused_until_the_first_retires_it(world: dict) -> None:
    root, (w1, w2, w3) = world["root"], world["services"]
    a, b, c = (root / name / "ledger.jsonl" for name in ("a", "b", "c"))
    state = root / "monitor.json"

    # 1. A: declared, registered, cosigned; a run of another dataset refused before any spend
    init(a, w1, w2)
    for service in (w1, w2):
        service.witness(log_path(a))
    assert cli("ledger", "cosign", a).returncode == 0
    before = a.read_bytes()
    other = cli("private", root / "another-dataset.json", root / "data", root / "out-other", "--ledger", a,
                "--no-validate", "--new-version", "synthetic records")
    line = error_line(other)
    print(f"a run of an undeclared dataset: exit {other.returncode}: {line}")
    assert other.returncode == 1 and "'another-dataset' is not one of the datasets this ledger declares" in line
    assert a.read_bytes() == before and not (root / "out-other").exists()
    first = monitor(log_path(a), state, w1, w2)
    assert first.returncode == 0, first.stderr

    # 2. B, a fresh ledger for the same dataset: no cosignature
    init(b, w1, w2)
    for service in (w1, w2):
        service.witness(log_path(b))
    refused = cli("ledger", "cosign", b)
    line = error_line(refused)
    print(f"a second log for a dataset: exit {refused.returncode}: {line}")
    assert refused.returncode == 1 and "0 of the 2 required witness cosignatures" in line
    assert line.count(f"the dataset {DATASET}, which this witness holds under another log") == 2
    assert "status 403" in line and "retire-dataset" in line

    # 3. C, pointed at a witness that never saw A: cosigned there; the monitor reports the claim
    init(c, w3)
    w3.witness(log_path(c))
    assert cli("ledger", "cosign", c).returncode == 0
    claimed = monitor(log_path(c), state, w3)
    line = error_line(claimed)
    print(f"the monitor, a third log for a dataset A accounts: exit {claimed.returncode}: {line}")
    assert claimed.returncode == 11 and line.startswith("FAILED [dataset-claimed]") and "already in the log" in line

    # 4. A retires the dataset in favour of B; B registers with the retirement and is cosigned
    retired = cli("ledger", "retire-dataset", a, "--dataset", DATASET, "--reason", "the dataset moves to ledger B",
                  "--successor", log_path(b) / "log.vkey")
    assert retired.returncode == 0, retired.stderr
    print(retired.stdout.strip())
    for service in (w1, w2):
        service.witness(log_path(b), retired_in=(log_path(a),))
    cosigned = cli("ledger", "cosign", b)
    print(cosigned.stdout.strip())
    assert cosigned.returncode == 0 and "is cosigned by witness1.test, witness2.test" in cosigned.stdout, cosigned.stderr
    origin_b = (log_path(b) / "log.vkey").read_text().split("+")[0]
    for service in (w1, w2):
        assert httpx.get(f"{service.url}/claims", timeout=60).text == f"{DATASET} {origin_b}\n"
    public = cli("audit", "public", "--log", log_path(a), "--key", log_path(a) / "log.vkey", "--state",
                 root / "outsider.json", "--witness-key", w1.vkey, "--witness-key", w2.vkey)
    print(public.stdout.strip())
    assert public.returncode == 0, public.stderr
    assert f"retired at entry 1, nothing more is spent on it in this log (its successor: the log {origin_b}" \
        in public.stdout and f"retired since: {DATASET}" in public.stdout
    assert monitor(log_path(a), state, w1, w2).returncode == 0
    taken = monitor(log_path(b), state, w1, w2)
    assert taken.returncode == 0, taken.stderr
    assert json.loads(state.read_text())["claims"][DATASET] == origin_b
    again = cli("private", root / f"{DATASET}.json", root / "data", root / "out-a", "--ledger", a, "--no-validate",
                "--new-version", "synthetic records")
    line = error_line(again)
    print(f"a run of the retired dataset on A: exit {again.returncode}: {line}")
    assert again.returncode == 1 and f"dataset '{DATASET}' was retired from this ledger (entry 1)" in line
