"""The attack table of issue 35: each witness policy against each attack, as the outsider
(``phsafe audit public``) and the monitor (``phsafe audit monitor --once``) report it.

    .venv/bin/python -m tests.system._attack_table [OUT.md]

Not a test (nothing asserts here; the tests of each row are in tests/unit/test_public_monitor.py,
tests/system/test_public_log.py and tests/system/test_public_log_monitor.py): it runs the real
ledger, log and command-line code, in this process, with witnesses in memory answering the real
HTTP client through a mock transport (tests/_witnesses.py), and writes what each command printed
and its exit status. Per policy, a ledger is made, copied (the insider's second enclave), and
copy A -- pointed at the first K witnesses -- releases; copy B is pointed at the last K.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner

from phsafe.cli import main as cli
from phsafe.ledger import canonical_json
from phsafe.noise import measure
from phsafe.publog import log_key_path, log_path, open_ledger, witnesses_path
from phsafe.tlog import (
    Checkpoint,
    MemoryCheckpointStore,
    TransparencyLog,
    Witness,
    WitnessRefusal,
    format_evidence,
    read_signer_key,
    request_cosignature,
    sign_checkpoint,
    verifier_from_key,
)
from phsafe.tlog.cosignature import CosignatureSigner
from phsafe.tlog.note import NoteSignature, format_note, parse_note
from tests._ledgers import new_ledger
from tests._tlog import private_key
from tests._ledgers import start as start_run
from tests._witnesses import Witnesses
from tests.unit.test_ledger_resume import FILES, PLAN

POLICIES = [(2, 1), (2, 2), (3, 2), (5, 3)]


def run(*args: object) -> tuple[int, str]:
    """The command's exit status and its first FAILED line (or its last line)."""
    result = CliRunner().invoke(cli, [str(a) for a in args])
    failed = [line for line in result.stderr.splitlines() if line.startswith(("FAILED", "phsafe: error"))]
    shown = failed[0] if failed else (result.stdout.strip().splitlines() or [""])[-1]
    return result.exit_code, shown


def entries_of(folder: Path) -> list[bytes]:
    return (folder / "entries").read_bytes().split(b"\n")[:-1]


class World:
    def __init__(self, root: Path, n: int, k: int) -> None:
        self.root, self.n, self.k = root, n, k
        self.ws = Witnesses(n)
        made_k = k if 2 * k > n else n  # a policy of half or fewer is refused: made as n of n, rewritten below
        ledger = new_ledger(root / "a", cap=PLAN.total * 3 / 2, witnesses=self.ws.listed(), witness_quorum=made_k,
                            transport=self.ws.transport)
        self.ws.trust(ledger.state.public_log["vkey"])
        self.a = ledger.path
        ledger.close()
        shutil.copytree(root / "a", root / "b")
        self.b = root / "b" / self.a.name
        self.a_set = list(range(1, k + 1))
        self.b_set = list(range(n - k + 1, n + 1))
        self.keys = []
        for number in range(1, n + 1):
            (root / f"w{number}.vkey").write_text(self.ws[number].vkey + "\n")
            self.keys.append(root / f"w{number}.vkey")
        self.vkey = log_path(self.a) / "log.vkey"
        self.signer = read_signer_key(log_key_path(self.a))
        self.evidence: list[bytes] = []
        self.cosign_state = {n_: MemoryCheckpointStore() for n_ in range(1, n + 1)}
        if 2 * k > n:
            self._point(self.a, self.a_set)
            self._point(self.b, self.b_set)
            a = open_ledger(self.a, transport=self.ws.transport)
            rec = start_run(a, PLAN, "run-a")
            measure(PLAN.measurements[0], np.zeros(PLAN.measurements[0].n_cells, dtype=np.int64), rec)
            shutil.copytree(log_path(self.a), root / "early")
            for m in PLAN.measurements[1:]:
                measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)
            rec.record_published(FILES, root / "out-a")
            a.close()
            shutil.copytree(log_path(self.a), root / "released")
        else:
            # A log made before the rule: its policy states k of n; A got k cosignatures (of the
            # A set), B another history of the same size from the B set.
            genuine = new_ledger(root / "genuine", cap=PLAN.total * 3 / 2, witnesses=self.ws.listed(),
                                 transport=self.ws.transport)
            self.ws.trust(genuine.state.public_log["vkey"])
            rec = start_run(genuine, PLAN, "run-a")
            for m in PLAN.measurements:
                measure(m, np.zeros(m.n_cells, dtype=np.int64), rec)
            rec.record_published(FILES, root / "out-a")
            genuine.close()
            lines = entries_of(log_path(genuine.path))
            policy = json.loads(lines[0])
            policy["quorum"] = k
            lines[0] = canonical_json(policy)
            self.vkey = log_path(genuine.path) / "log.vkey"
            self.signer = read_signer_key(log_key_path(genuine.path))
            self.released_entries = lines
            self.serve("released", lines, self.a_set, real=True)
            self.serve("early", lines[:len(lines) - 3], self.a_set, real=False)

    def _point(self, ledger: Path, numbers: list[int]) -> None:
        listed = json.loads(witnesses_path(ledger).read_text())
        for index, item in enumerate(listed["witnesses"], start=1):
            if index not in numbers:
                item["url"] = "http://nowhere.test:1"
        witnesses_path(ledger).write_text(json.dumps(listed))

    def witness(self, number: int, *, real: bool, clock: int | None = None) -> Witness:
        memory = self.ws[number]
        signer = memory.signer if clock is None else CosignatureSigner(
            memory.signer.name, private_key(f"memory witness {number}"), lambda: clock)
        # real: the witness's own state (what it cosigned for copy A); a log made before the rule
        # is simulated with witnesses that saw only it
        store = (memory.store if 2 * self.k > self.n else self.cosign_state[number]) if real else MemoryCheckpointStore()
        keys = {k.name: k for k in (verifier_from_key(v) for v in [*memory.logs, self.vkey.read_text().strip()])}
        return Witness(signer, list(keys.values()), store, evidence=lambda origin, request, evidence: self.evidence.append(
                           format_evidence(evidence)) if evidence is not None else None)

    def serve(self, name: str, entries: list[bytes], cosigners: list[int], *, real: bool = False,
              clock: int | None = None, forged: bool = False) -> Path:
        folder = self.root / name
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir()
        (folder / "log.vkey").write_text(self.vkey.read_text())
        tree = TransparencyLog.of_entries(entries)
        note = sign_checkpoint(Checkpoint(self.signer.name, len(entries), tree.root()), [self.signer])
        text, signatures = parse_note(note)
        lines = []
        for number in cosigners:
            try:
                witness = self.witness(number, real=real, clock=clock)
                lines += [s for s in parse_note(request_cosignature(witness, tree, note))[1]
                          if s.name == self.ws[number].name]
            except WitnessRefusal:
                continue
        if forged:
            for number in cosigners:
                from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

                fake = CosignatureSigner(self.ws[number].name, Ed25519PrivateKey.generate())
                lines.append(NoteSignature(fake.name, self.ws[number].signer.key_id, fake.sign(text.encode())))
        (folder / "entries").write_bytes(b"".join(e + b"\n" for e in entries))
        (folder / "checkpoint").write_bytes(format_note(text, [*signatures, *lines]))
        return folder


def outsider(w: World, log: Path, state: Path, *extra: object, keys: bool = True) -> tuple[int, str]:
    args: list[object] = ["audit", "public", "--log", log, "--key", w.vkey, "--state", state]
    if keys:
        args += [a for key in w.keys for a in ("--witness-key", key)]
    return run(*args, *extra)


def monitor(w: World, log: Path, state: Path, *extra: object) -> tuple[int, str]:
    return run("audit", "monitor", log, "--key", w.vkey, "--state", state, "--once",
               *[a for key in w.keys for a in ("--witness-key", key)], *extra)


def attacks(w: World) -> dict[str, tuple[tuple[int, str], tuple[int, str]]]:
    root = w.root
    out: dict[str, Any] = {}
    genuine = root / "released"
    seen_o, seen_m = root / "outsider.json", root / "monitor.json"
    out["genuine log"] = (outsider(w, genuine, seen_o), monitor(w, genuine, seen_m))
    lines = entries_of(genuine)

    # split view: copy B's other history, of A's size, asked of B's witnesses (their real state)
    b_lines = list(lines)
    b_lines[1] = b_lines[1].replace(b'"reason":"', b'"reason":"B: ', 1)
    split = w.serve("split", b_lines, w.b_set, real=True)
    kept = root / "evidence.json"
    if w.evidence:
        kept.write_bytes(w.evidence[0])
    out["split view: B's history, to a new outsider"] = (outsider(w, split, root / "fresh-o.json"),
                                                         monitor(w, split, root / "fresh-m.json"))
    out["split view: B's history, after A's was seen"] = (outsider(w, split, seen_o), monitor(w, split, seen_m))
    if w.evidence:
        out["split view: the shared witness's evidence (--evidence)"] = (
            outsider(w, genuine, seen_o, "--evidence", kept), monitor(w, genuine, seen_m, "--evidence", kept))
    else:
        out["split view: the shared witness's evidence (--evidence)"] = ((0, "(no witness is in both sets: none)"),
                                                                         (0, "(no witness is in both sets: none)"))
    out["rollback to an older view"] = (outsider(w, root / "early", seen_o), monitor(w, root / "early", seen_m))
    forked = list(lines)
    forked[1] = forked[1].replace(b'"reason":"', b'"reason":"rewritten: ', 1)
    fork = w.serve("fork", forked, [])
    out["fork: another history signed by the log key"] = (outsider(w, fork, seen_o), monitor(w, fork, seen_m))
    stale = w.serve("stale", lines, w.a_set, clock=int(time.time()) - 8 * 86400)
    out["stale cosignatures (8 days)"] = (outsider(w, stale, seen_o), monitor(w, stale, seen_m))
    forged = w.serve("forged", lines, w.a_set, forged=True)
    shutil.copyfile(forged / "checkpoint", forged / "c")
    text, signatures = parse_note((forged / "checkpoint").read_bytes())
    (forged / "checkpoint").write_bytes(format_note(text, [signatures[0], *signatures[-w.k:]]))
    out["forged cosignatures (under the witnesses' key IDs)"] = (outsider(w, forged, seen_o),
                                                                 monitor(w, forged, seen_m))
    out["quorum lowered by the outsider (--witness-quorum K-1)"] = (
        outsider(w, genuine, seen_o, "--witness-quorum", w.k - 1),
        monitor(w, genuine, seen_m, "--witness-quorum", w.k - 1))
    out["quorum lowered to 0"] = (outsider(w, genuine, seen_o, "--witness-quorum", 0),
                                  monitor(w, genuine, seen_m, "--witness-quorum", 0))
    # the log's key rewritten in place (same name, another key): the witness refuses it; an
    # outsider holding the genuine key refuses what the other key signed
    from phsafe.tlog import format_verifier_key, generate_keys, signer_from_key

    rogue = signer_from_key(generate_keys(w.signer.name)[0])
    store = w.ws[w.a_set[0]].store if 2 * w.k > w.n else w.cosign_state[w.a_set[0]]
    witness = Witness(w.ws[w.a_set[0]].signer, [verifier_from_key(format_verifier_key(rogue))], store)
    tree = TransparencyLog.of_entries(lines + [lines[-1]])
    try:
        request_cosignature(witness, tree, sign_checkpoint(Checkpoint(rogue.name, tree.size, tree.root()), [rogue]),
                            old_size=len(lines))
        witness_line = "cosigned (not refused!)"
    except WitnessRefusal as exc:
        witness_line = f"witness {w.ws[w.a_set[0]].name}: {exc.status} {exc}"
    saved_signer, w.signer = w.signer, rogue
    rewritten = w.serve("rewritten", lines + [lines[-1]], [])
    w.signer = saved_signer
    o, m = outsider(w, rewritten, seen_o), monitor(w, rewritten, seen_m)
    out["log key rewritten in place (witness's answer)"] = ((403, witness_line), (403, witness_line))
    out["log key rewritten in place (a log signed by the other key)"] = (o, m)
    started = next(json.loads(e) for e in lines if b'"run-started"' in e)
    release = next(json.loads(e) for e in lines if b'"type":"release"' in e)
    over = w.serve("over-cap", lines + [canonical_json({**started, "run_id": "run-2", "spent_before": release["spent"],
                                                         "re_release": "again"})], w.a_set)
    out["a spend past the cap (cosigned)"] = (outsider(w, over, root / "o2.json"), monitor(w, over, root / "m2.json"))
    second = w.serve("second", lines + [canonical_json(release)], w.a_set)
    out["a second release of one run (cosigned)"] = (outsider(w, second, root / "o3.json"),
                                                     monitor(w, second, root / "m3.json"))
    return out


def second_log(w: World) -> tuple[tuple[int, str], tuple[int, str]]:
    """A fresh ledger (a new log) accounting the same dataset, cosigned by its witnesses."""
    other = new_ledger(w.root / "again", cap=PLAN.total * 3 / 2, witnesses=w.ws.listed(),
                       witness_quorum=w.k if 2 * w.k > w.n else w.n, transport=w.ws.transport)
    w.ws.trust(other.state.public_log["vkey"])
    start_run(other, PLAN, "run-again")
    log = log_path(other.path)
    o = run("audit", "public", "--log", log, "--key", log / "log.vkey", "--state", w.root / "o4.json",
            *[a for key in w.keys for a in ("--witness-key", key)])
    m = run("audit", "monitor", log, "--key", log / "log.vkey", "--state", w.root / "monitor.json", "--once",
            *[a for key in w.keys for a in ("--witness-key", key)])
    return o, m


def second_log_at_claiming_witnesses(root: Path, n: int, k: int) -> tuple[tuple[int, str], tuple[None, str]]:
    """A fresh ledger init for a dataset, with witnesses that keep one log per dataset (as the
    witness service does): the first ledger's registration is accepted, the second's refused, so
    the second ledger's run stops before its first spend."""
    from phsafe.errors import PHSafeError
    from phsafe.publog import make_log_registration

    ws = Witnesses(n, claims=True)
    quorum = k if 2 * k > n else n
    made = []
    for name in ("first", "second"):
        ledger = new_ledger(root / name, cap=PLAN.total * 3 / 2, witnesses=ws.listed(), witness_quorum=quorum,
                            transport=ws.transport, datasets=["test-data"])
        ws.trust(ledger.state.public_log["vkey"], make_log_registration(ledger.path)[0])
        made.append(ledger)
    start_run(made[0], PLAN, "run-first")
    try:
        start_run(made[1], PLAN, "run-second")
    except PHSafeError as refused:
        return (1, f"phsafe: error: {refused}"), (None, "")
    return (0, "the second ledger's run started"), (None, "")


def main(argv: list[str]) -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, k in POLICIES:
            root = Path(tmp) / f"{k}-of-{n}"
            root.mkdir()
            label = f"{k} of {n}"
            if 2 * k <= n:
                ws = Witnesses(n)
                (root / "w").mkdir()
                keys = []
                for number in range(1, n + 1):
                    (root / "w" / f"{number}.vkey").write_text(ws[number].vkey + "\n")
                    keys += ["--witness", ws[number].url, root / "w" / f"{number}.vkey"]
                status, line = run("ledger", "init", root / "refused" / "ledger.jsonl", "--lifetime-cap", "1",
                                   "--reason", "r", *keys, "--witness-quorum", k)
                rows.append((label, "ledger init", (status, line), (None, "")))
            w = World(root, n, k)
            for attack, (o, m) in attacks(w).items():
                rows.append((label, attack, o, m))
            rows.append((label, "a second log for a known dataset", *second_log(w)))
            rows.append((label, "a second log for a known dataset, at witnesses that keep one log per dataset "
                                "(the second ledger's run)", *second_log_at_claiming_witnesses(root / "claims", n, k)))
            print(f"{label}: done", file=sys.stderr)
    text = ["| policy | attack | audit public (exit: first line) | audit monitor --once (exit: first line) |",
            "|---|---|---|---|"]
    for label, attack, (os_, ol), (ms, ml) in rows:
        cut = (lambda s: s.replace("|", "\\|")[:260])  # noqa: E731
        text.append(f"| {label} | {attack} | {os_}: {cut(ol)} | {'' if ms is None else ms}: {cut(ml)} |")
    out = "\n".join(text) + "\n"
    if len(argv) > 1:
        Path(argv[1]).write_text(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
