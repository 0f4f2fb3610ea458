"""Governance (issue 12): nothing confidential leaves with the tables, and the lifetime cap cannot be
sidestepped.

The digest attack: an intruder who knows every record but one person's QAGE, CENHISP and CENRACE
enumerates all 14,616 candidate persons files, computes every plain function of them this project
could publish (the file's SHA-256, the dataset id over the file digests, the unkeyed content
digest), and looks for any of them -- whole, or as a 16-digit prefix -- among the strings of the
public zone: every file of the release. A control publishes what the old manifest published (the
plain digests) and the same attack must find the hidden person: the test can fail.

The bypasses: after one release at the full cap, the same records are offered again from another
working directory, shuffled, with a blank line appended, with CRLF line endings and as Parquet,
under the same dataset name and under a new one. Each is refused with a clear line, nothing is
published and nothing spent. One changed record is a new content version: refused unless
declared, and its spends count against the same dataset.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from phsafe import synthetic
from phsafe.fingerprint import PERSON_FIELDS, _PERSON_TAG, _lane_sums, _pack
from phsafe.ledger import dataset_id, read_ledger
from phsafe.reader import file_digest
from tests._cli import phsafe
from tests._ledgers import new_ledger
from tests.conftest import US_CONFIG

PHSAFE = Path(sys.executable).parent / "phsafe"
STATES = ["01", "02"]
HEX = re.compile(rb"[0-9a-fA-F]{16,}")


def cli(*args: object, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", **kw.pop("env", {})}
    return phsafe(*args, env=env, **kw)  # in this process, as a subprocess would see it (tests/_cli.py)


def error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("phsafe: error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def intents(ledger: Path) -> int:
    return sum(1 for line in ledger.read_text().splitlines() if '"kind":"INTENT"' in line)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("governance")
    data = root / "data"
    synthetic.write(synthetic.generate(1500, STATES, seed=1207), data)
    raw = json.loads(US_CONFIG.read_text())
    raw["state_filter"] = STATES
    raw["dataset"] = "cef-test"
    config = root / "config.json"
    config.write_text(json.dumps(raw))
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = root / "signing.pem"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    from phsafe.accounting import plan_run
    from phsafe.config import load_config
    from phsafe.ledger import format_exact

    total = format_exact(plan_run(load_config(config)).total)
    ledger = new_ledger(root / "enclave", cap=total).path
    out = root / "release"
    proc = cli("private", config, data, out, "--ledger", ledger, "--new-version", "the test extract",
               "--signing-key", key)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = cli("audit", "report", ledger, "--out", root / "enclave" / "audit-report")
    assert report.returncode == 0, report.stderr
    return {"root": root, "data": data, "config": config, "ledger": ledger, "out": out, "total": total}


# --------------------------------------------------------------------------------------------
# The digest attack
# --------------------------------------------------------------------------------------------


def _public_tokens(folder: Path) -> set[bytes]:
    """Every hex string of 16+ digits in every file of ``folder`` (text or binary), lowercased,
    with its 16-digit prefix: what an intruder could match a digest against."""
    tokens: set[bytes] = set()
    for path in folder.rglob("*"):
        if path.is_file():
            for token in HEX.findall(path.read_bytes()):
                token = token.lower()
                tokens.update((token, token[:16]))
    return tokens


class Attack:
    """The intruder's enumeration of one hidden person's QAGE, CENHISP and CENRACE."""

    def __init__(self, data: Path, states: list[str], config: Path) -> None:
        self.lines = (data / "persons.csv").read_bytes().split(b"\n")
        self._head: hashlib._Hash | None = None
        self._tail = b""
        self._all: list[tuple[tuple[str, str, str], list[bytes]]] | None = None
        persons = pd.read_csv(data / "persons.csv", dtype=str)
        geo = pd.read_csv(data / "geo.csv", dtype=str)
        housing = geo.loc[(geo["RTYPE"] == "2") & geo["TABBLKST"].isin(states), "MAFID"]
        candidates = persons.index[(persons["RTYPE"] == "3") & persons["MAFID"].isin(housing)]
        self.row = int(candidates[len(candidates) // 2])
        self.person = persons.loc[self.row].to_dict()
        self.truth = (self.person["QAGE"], self.person["CENHISP"], self.person["CENRACE"])
        self.others = {s: file_digest(data / f"{s}.csv") for s in ("units", "geo")}
        self.header = self.lines[0].decode().split(",")
        self.state = states.index(geo.set_index("MAFID").loc[self.person["MAFID"], "TABBLKST"])
        # The unkeyed content digest of everything the intruder knows: all records but this one.
        # (Computed here from the whole data minus the hidden record's share: the same numbers.)
        from phsafe.config import load_config
        from phsafe.intake import exact_counts
        from phsafe.tables import TABLES

        whole = exact_counts(load_config(config), data, [TABLES["PH1_denom"]], key=bytes(16)).content
        self.rest = [(w - h) % 2**64 for w, h in zip(whole.lanes, self._lanes(*self.truth))]

    def candidates(self):
        for age, hisp, race in itertools.product(range(116), ("1", "2"), (f"{r:02d}" for r in range(1, 64))):
            yield str(age), hisp, race

    def _line(self, age: str, hisp: str, race: str) -> bytes:
        values = dict(self.person, QAGE=age, CENHISP=hisp, CENRACE=race)
        return ",".join(values[c] for c in self.header).encode()

    def _lanes(self, age: str, hisp: str, race: str) -> list[int]:
        cols = {c: np.array([int(self.person[c] if c not in ("QAGE", "CENHISP", "CENRACE") else v)])
                for c, v in (("RTYPE", None), ("MAFID", None), ("QAGE", age), ("CENHISP", hisp), ("CENRACE", race),
                             ("RELSHIP", None))}
        state = np.array([int(["01", "02"][self.state])], dtype=np.uint64)
        return _lane_sums(_PERSON_TAG, [_pack(cols, slice(None), PERSON_FIELDS, state)])

    def digests(self, age: str, hisp: str, race: str) -> list[str]:
        """Every plain function of the candidate dataset the project could publish."""
        if self._head is None:  # the file's bytes before and after the hidden line never change
            self._head = hashlib.sha256(b"\n".join(self.lines[:self.row + 1]) + b"\n")
            self._tail = b"\n" + b"\n".join(self.lines[self.row + 2:]) if self.row + 2 < len(self.lines) else b""
        sha = self._head.copy()  # = SHA-256 of the whole file with the candidate's line in place
        sha.update(self._line(age, hisp, race) + self._tail)
        persons = sha.hexdigest()
        out = [persons, dataset_id({"persons.csv": persons, "units.csv": self.others["units"],
                                    "geo.csv": self.others["geo"]})]
        # The unkeyed content digest: the known records' lanes plus the candidate record's.
        out.extend(f"{(r + h) % 2**64:016x}" for r, h in zip(self.rest, self._lanes(age, hisp, race)))
        return out

    def matches(self, tokens: set[bytes]) -> list[tuple[str, str, str]]:
        if self._all is None:  # every candidate's digests, computed once for all the searches
            self._all = [(candidate, [d.encode() for d in self.digests(*candidate)])
                         for candidate in self.candidates()]
        found = []
        for candidate, digests in self._all:
            for d in digests:
                if d in tokens or d[:16] in tokens:
                    found.append(candidate)
                    break
        return found


def test_the_digest_attack_finds_nothing_in_the_public_zone(world: dict, tmp_path: Path) -> None:
    attack = Attack(world["data"], STATES, world["config"])
    public = _public_tokens(world["out"])
    assert public, "the release holds hex strings (file digests, the checkpoint): the attack has material"
    assert attack.matches(public) == []
    # The public privacy-loss log (every file of its folder, hashes included) and the release's
    # log entry and proof are public too: the same attack finds nothing in them either.
    from phsafe.publog import ENTRY_FILE, PROOF_FILE, log_path

    assert (world["out"] / ENTRY_FILE).is_file() and (world["out"] / PROOF_FILE).is_file()
    log_tokens = _public_tokens(log_path(world["ledger"]))
    assert log_tokens, "the log names the manifest's SHA-256: the attack has material"
    assert attack.matches(log_tokens) == []
    assert attack.matches(public | log_tokens) == []

    # Control: publish what the old manifest published -- the plain input digests -- and the very
    # same attack recovers the hidden person.
    leaky = tmp_path / "leaky-release"
    leaky.mkdir()
    (leaky / "manifest.json").write_text(json.dumps(
        {"inputs": {s: file_digest(world["data"] / f"{s}.csv") for s in ("persons", "units", "geo")}}))
    assert attack.matches(_public_tokens(leaky)) == [attack.truth]
    # ... and publishing the unkeyed content digest would leak as well.
    from phsafe.config import load_config
    from phsafe.intake import exact_counts
    from phsafe.tables import TABLES

    content = exact_counts(load_config(world["config"]), world["data"], [TABLES["PH1_denom"]], key=bytes(16)).content
    (leaky / "manifest.json").write_text(json.dumps({"content": [f"{lane:016x}" for lane in content.lanes]}))
    assert attack.matches(_public_tokens(leaky)) == [attack.truth]
    # The intruder's arithmetic is the fingerprint's own: another candidate's lanes are exactly
    # those of the data with that candidate in place.
    other = tmp_path / "other"
    other.mkdir()
    for stem in ("units", "geo"):
        (other / f"{stem}.csv").write_bytes((world["data"] / f"{stem}.csv").read_bytes())
    lines = list(attack.lines)
    lines[attack.row + 1] = attack._line("44", "2", "07")
    (other / "persons.csv").write_bytes(b"\n".join(lines))
    moved = exact_counts(load_config(world["config"]), other, [TABLES["PH1_denom"]], key=bytes(16)).content
    assert [f"{lane:016x}" for lane in moved.lanes] == attack.digests("44", "2", "07")[2:]


def test_the_release_holds_only_public_facts(world: dict) -> None:
    manifest = json.loads((world["out"] / "manifest.json").read_text())
    assert set(manifest) >= {"run_id", "dataset", "files", "checkpoint", "lineage", "measurements"}
    assert "inputs" not in manifest and "ledger" not in manifest
    text = json.dumps(manifest)
    assert str(world["ledger"].parent) not in text  # no path of the confidential zone
    run = read_ledger(world["ledger"]).runs[manifest["run_id"]]
    for digest in [*run.input_digests.values(), run.fingerprint, run.truncation_key, run.config_digest]:
        assert digest not in text and digest[:16] not in text
    files = {p.relative_to(world["out"]).as_posix() for p in world["out"].rglob("*") if p.is_file()}
    assert not {f for f in files if "valid" in f or f.endswith((".jsonl", ".key", ".npy", ".log"))}
    # The public log and the release's copy of its entry hold no confidential fact either.
    from phsafe.publog import ENTRY_FILE, log_path

    published = b"".join(p.read_bytes() for p in log_path(world["ledger"]).iterdir()) + \
        (world["out"] / ENTRY_FILE).read_bytes()
    for digest in [*run.input_digests.values(), run.fingerprint, run.truncation_key, run.config_digest]:
        assert digest.encode() not in published and digest[:16].encode() not in published
    assert str(world["ledger"].parent).encode() not in published
    # The audit report is confidential and says so; it lives beside the ledger.
    report = (world["root"] / "enclave" / "audit-report" / "audit_report.md").read_text()
    assert "CONFIDENTIAL" in report


# --------------------------------------------------------------------------------------------
# The cap cannot be sidestepped
# --------------------------------------------------------------------------------------------


def _variant(world: dict, name: str, edit) -> Path:  # noqa: ANN001
    folder = world["root"] / "variants" / name
    folder.mkdir(parents=True)
    edit(world["data"], folder)
    return folder


def _copy(src: Path, dst: Path, transform=lambda stem, text: text) -> None:  # noqa: ANN001
    for stem in ("persons", "units", "geo"):
        (dst / f"{stem}.csv").write_text(transform(stem, (src / f"{stem}.csv").read_text()), newline="")


def _shuffled(src: Path, dst: Path) -> None:
    def shuffle(stem: str, text: str) -> str:
        header, *rows = text.rstrip("\n").split("\n")
        order = np.random.default_rng(99).permutation(len(rows))
        return "\n".join([header, *(rows[i] for i in order)]) + "\n"
    _copy(src, dst, shuffle)


def _blank_line(src: Path, dst: Path) -> None:
    _copy(src, dst, lambda stem, text: text + "\n" if stem == "geo" else text)


def _crlf(src: Path, dst: Path) -> None:
    _copy(src, dst, lambda stem, text: text.replace("\n", "\r\n"))


def _parquet(src: Path, dst: Path) -> None:
    import pyarrow as pa

    for stem in ("persons", "units", "geo"):
        table = pacsv.read_csv(src / f"{stem}.csv", convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in pd.read_csv(src / f"{stem}.csv", nrows=0).columns}))
        pq.write_table(table, dst / f"{stem}.parquet")


BYPASSES = [("shuffled", _shuffled), ("blank-line", _blank_line), ("crlf", _crlf), ("parquet", _parquet)]


def test_the_same_records_cannot_be_released_again(world: dict, tmp_path: Path) -> None:
    ledger, config = world["ledger"], world["config"]
    spent = intents(ledger)

    # Another working directory: there is no default ledger to start afresh in.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    line = error_line(cli("private", config, world["data"], elsewhere / "out", cwd=elsewhere,
                          env={"PHSAFE_LEDGER": ""}))
    assert "name the audit ledger" in line and "phsafe ledger init" in line
    line = error_line(cli("private", config, world["data"], elsewhere / "out", "--ledger",
                          elsewhere / "ledger.jsonl", cwd=elsewhere))
    assert "does not exist" in line
    assert list(elsewhere.iterdir()) == []

    for name, edit in BYPASSES:
        data = _variant(world, name, edit)
        out = tmp_path / f"out-{name}"
        # Under the same name: the dataset's cap is spent.
        line = error_line(cli("private", config, data, out, "--ledger", ledger, "--no-validate"))
        assert "privacy-loss budget refused for dataset 'cef-test'" in line and "already spent" in line, name
        # Under a new name: these are the same records, already declared as cef-test.
        line = error_line(cli("private", _renamed(config, tmp_path, f"cef-{name}"), data, out, "--ledger", ledger,
                              "--new-version", "looks new", "--no-validate"))
        assert "already declared as dataset 'cef-test'" in line and "second name" in line, name
        assert not out.exists() and intents(ledger) == spent, name
    verified = cli("audit", "verify", ledger, "--outputs", world["out"])
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _renamed(config: Path, folder: Path, name: str) -> Path:
    raw = json.loads(config.read_text())
    raw["dataset"] = name
    path = folder / f"config-{name}.json"
    path.write_text(json.dumps(raw))
    return path


def test_a_changed_record_is_a_new_version_of_the_same_dataset(world: dict, tmp_path: Path) -> None:
    # On a copy of the ledger (its cap is raised below; the other tests need it as it is).
    ledger = tmp_path / "enclave" / "ledger.jsonl"
    ledger.parent.mkdir()
    for suffix in ("", ".key", ".log.key"):
        Path(f"{ledger}{suffix}").write_bytes(Path(f"{world['ledger']}{suffix}").read_bytes())
        Path(f"{ledger}{suffix}").chmod(0o600)  # confidential: a copy stays private to its owner
    shutil.copytree(f"{world['ledger']}.public-log", f"{ledger}.public-log")  # the ledger's public log goes with it
    spent = intents(ledger)
    changed = tmp_path / "changed"
    changed.mkdir()
    persons = pd.read_csv(world["data"] / "persons.csv", dtype=str)
    persons.loc[persons.index[persons["RTYPE"] == "3"][0], "QAGE"] = "77"
    persons.to_csv(changed / "persons.csv", index=False)
    for stem in ("units", "geo"):
        (changed / f"{stem}.csv").write_bytes((world["data"] / f"{stem}.csv").read_bytes())
    out = tmp_path / "out"
    # The dataset's cap still holds whatever the version...
    line = error_line(cli("private", world["config"], changed, out, "--ledger", ledger, "--no-validate",
                          "--new-version", "corrected extract"))
    assert "already spent" in line
    # ... and with the cap raised (recorded, with its reason), an undeclared version is refused.
    raised = cli("ledger", "raise-cap", ledger, "--dataset", "cef-test", "--to", "3", "--reason", "second release")
    assert raised.returncode == 0, raised.stderr
    line = error_line(cli("private", world["config"], changed, out, "--ledger", ledger, "--no-validate"))
    assert "never been run on these records" in line and "--new-version" in line
    assert intents(ledger) == spent and not out.exists()
    ran = cli("private", world["config"], changed, out, "--ledger", ledger, "--no-validate",
              "--new-version", "corrected extract")
    assert ran.returncode == 0, ran.stderr[-2000:]
    state = read_ledger(ledger)
    ds = state.dataset_states["cef-test"]
    assert [v.reason for v in ds.versions] == ["the test extract", "corrected extract"]
    assert [r.reason for r in ds.raises] == ["second release"]
    runs = [r for r in state.runs.values() if r.dataset == "cef-test"]
    assert len({r.fingerprint for r in runs}) == 2 and len(runs) == 2
    verified = cli("audit", "verify", ledger)
    assert verified.returncode == 0 and "2 content version(s)" in verified.stdout, verified.stdout
