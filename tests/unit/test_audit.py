"""``phsafe audit verify`` and ``phsafe audit report``.

A real ledger is made by ``init_ledger`` (policy: one release of ``CONFIG_A`` per dataset) and
built through the API with real noise: a zCDP run on dataset ``cef-a`` that publishes outputs; a
second run on the same records (a recorded cap raise) that fails after an INTENT without
COMMITTED; a torn write repaired by ``repair_ledger`` (TAIL_REPAIRED); a resumed run on ``cef-c``
(it fails with one measurement committed and one INTENT without COMMITTED, is resumed with a
raised cap, spends the uncommitted one again, reuses the committed one, and publishes); and a
pure-DP run on ``cef-b`` (a raised cap), interleaved with it. Every release is published the way
the engine does it: the manifest (signed checkpoint covering every spend, keyed lineage
commitment) is written, then OUTPUTS_PUBLISHED (the files' digests, the manifest's included, and
where the release went) and RUN_FINISHED are recorded. Checkpoints are signed with a generated
Ed25519 key. The outputs are written by a small fixture writer in the documented layout (the
engine's writer is not under test here). Then hundreds of mutants of the ledger, the checkpoint and
the outputs are generated and ``audit verify`` must reject every one, naming the first failing
entry or file.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import json
import math
import re
import shutil
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from phsafe.accounting import RunPlan, plan_run
from phsafe.cli.audit import audit
from phsafe.audit.report import epsilon_analytic, epsilon_renyi, renyi_epsilon_at
from phsafe.config import PHSafeConfig, load_config, parse_config
from phsafe.domain import measurement_domain
from phsafe.ledger import (
    Ledger,
    RunRecorder,
    canonical_json,
    checkpoint_message,
    entry_hash,
    format_exact,
    lineage_commitment,
    migrate_ledger,
)
from phsafe.publog import repair_ledger, write_release_log_files
from phsafe.noise import measure
from phsafe.tables import DERIVED_TABLES, OUTPUT_TABLES, TABLES, output_spec

from tests._ledgers import FirstFormatLedger, craft, new_ledger, start
from tests.conftest import PR_CONFIG, US_CONFIG

DIGESTS_A = {"persons.csv": "1" * 64, "units.csv": "2" * 64, "geo.csv": "3" * 64}
DIGESTS_B = {"persons.parquet": "4" * 64, "units.parquet": "5" * 64, "geo.parquet": "6" * 64}
DIGESTS_C = {"persons.csv": "7" * 64, "units.csv": "8" * 64, "geo.csv": "9" * 64}
FP_A, FP_B, FP_C = "a1" * 32, "b2" * 32, "c3" * 32
MANIFEST = "manifest.json"


def make_config(defn: str, budgets: dict[str, dict[str, str]]) -> PHSafeConfig:
    raw = json.loads(US_CONFIG.read_text())
    for levels in raw["privacy_budget"].values():
        for level in levels:
            levels[level] = 0
    for table, levels in budgets.items():
        raw["privacy_budget"][table].update({k: Decimal(v) for k, v in levels.items()})
    raw["state_filter"] = ["02", "01"]
    raw["privacy_defn"] = defn
    return parse_config(raw)


CONFIG_A = make_config(
    "zcdp",
    {
        "PH1_num": {"state_*": "0.25", "usa_*": "0.125"},
        "PH2": {"usa_*": "0.002619"},  # sigma^2 = 92401.680030546...: needs all its digits
        "PH4": {"state_A-G": "0.03125"},  # PH5_num derived
        "PH6": {"state_*": "0.0625"},
        "PH7": {"usa_H,I": "0.0625"},  # PH8_num derived
        "PH8_denom": {"state_H,I": "0.015625"},
    },
)
CONFIG_B = make_config("puredp", {"PH1_denom": {"usa_*": "0.5"}, "PH3": {"state_H,I": "1.5"}})
POLICY_CAP = plan_run(CONFIG_A).total  # the world's policy: one release of CONFIG_A per dataset
# run-a2 failed after two INTENTs: dataset cef-a's odometer is one plan plus those two budgets.
FAILED_A2 = sum((Fraction(m.budget) for m in plan_run(CONFIG_A).measurements[:2]), Fraction(0))
SPENT_A = POLICY_CAP + FAILED_A2
PURE_IN_RHO = Fraction(1, 2) ** 2 / 2 + Fraction(3, 2) ** 2 / 2  # CONFIG_B's charge in a zCDP ledger


# --------------------------------------------------------------------------------------------
# Fixture writer: the documented output layout
# --------------------------------------------------------------------------------------------


def write_outputs(config: PHSafeConfig, plan: RunPlan, noisy: dict[str, np.ndarray], outdir: Path) -> dict[str, str]:
    """Write DIR/<T>/<T>.csv and DIR/parquet/<T>.parquet; return relative path -> SHA-256."""
    frames: dict[str, list[pd.DataFrame]] = {}
    for m in plan.measurements:
        spec = TABLES[m.table]
        domain = measurement_domain(spec, m.level, config)
        frame = domain.frame()
        frame["COUNT"] = noisy[m.key]
        frame["NOISE_DISTRIBUTION"] = m.distribution.value
        frame["VARIANCE"] = m.variance
        frames.setdefault(m.table, []).append(frame)
        for name, derived in DERIVED_TABLES.items():
            if derived.source != m.table:
                continue
            cube = noisy[m.key].reshape(domain.shape)
            pos = {n: i for i, n in enumerate(spec.basis_numbers)}
            out_cells = tuple(n for n, _ in derived.cells)
            dcube = np.stack([cube[..., [pos[p] for p in parts]].sum(-1) for _, parts in derived.cells], -1)
            dframe = measurement_domain(spec, m.level, config, cells=out_cells).frame()
            dframe["COUNT"] = dcube.ravel()
            dframe["NOISE_DISTRIBUTION"] = m.distribution.value
            dframe["VARIANCE"] = np.repeat(
                np.array([[len(parts) * m.variance for _, parts in derived.cells]]), len(dframe) // len(out_cells), 0
            ).ravel()
            frames.setdefault(name, []).append(dframe)
    for table in OUTPUT_TABLES:
        if table not in frames:
            continue
        frame = pd.concat(frames[table]).rename(columns={"CELL": f"{table.upper()}_DATA_CELL"})
        if not output_spec(table).has_iteration_column:
            frame = frame.drop(columns="ITERATION_CODE")
        csv_path = outdir / table / f"{table}.csv"
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(csv_path, sep="|", index=False, lineterminator="\n")
        pq_path = outdir / "parquet" / f"{table}.parquet"
        pq_path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(pq_path, index=False)
    return file_digests(outdir)


def file_digests(outdir: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file under ``outdir``."""
    return {p.relative_to(outdir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(outdir.rglob("*")) if p.is_file()}


def release(ledger: Ledger, rec: RunRecorder, outdir: Path, files: dict[str, str], key: Path | None,
            *, record_manifest: bool = True) -> dict[str, Any]:
    """Publish, then record, as the engine does: the manifest (a checkpoint covering every spend,
    signed with ``key``, and the keyed lineage commitment) goes into the release, then
    OUTPUTS_PUBLISHED (every file's digest, the manifest's too) and RUN_FINISHED are recorded."""
    run = ledger.run(rec.run_id)
    assert run is not None
    manifest = {"run_id": rec.run_id, "files": files, "checkpoint": rec.checkpoint(key),
                "lineage": {"commitment": lineage_commitment(ledger.lineage_key(), run)}}
    path = outdir / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    recorded = dict(files)
    if record_manifest:
        recorded[MANIFEST] = hashlib.sha256(path.read_bytes()).hexdigest()
    rec.record_published(recorded, outdir)
    write_release_log_files(ledger, rec.run_id, outdir)  # as the engine does: its public log files
    return manifest


def publish_run(ledger: Ledger, config: PHSafeConfig, run_id: str, dataset: str, fingerprint: str,
                digests: dict[str, str], outdir: Path, key: Path | None,
                tamper: Callable[[Path], None] | None = None, **kw: Any) -> None:
    plan = plan_run(config)
    rec = start(ledger, plan, run_id, dataset=dataset, fingerprint=fingerprint, digests=digests, **kw)
    rng = np.random.default_rng(7)  # exact counts of a fake dataset (not the noise)
    noisy = {m.key: measure(m, rng.integers(0, 50, m.n_cells), rec) for m in plan.measurements}
    outdir.mkdir(parents=True)
    write_outputs(config, plan, noisy, outdir)
    if tamper is not None:
        tamper(outdir)  # an engine bug: wrong files recorded honestly
    release(ledger, rec, outdir, file_digests(outdir), key)


def write_key(path: Path) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key


@dataclass
class World:
    """The ledger (with its lineage key), checkpoint and keys under ``root``; the outputs under
    ``outputs_root``."""

    root: Path
    outputs_root: Path | None = None

    ledger = property(lambda self: self.root / "ledger.jsonl")
    lineage_key = property(lambda self: self.root / "ledger.jsonl.key")
    checkpoint = property(lambda self: self.root / "checkpoint.json")
    public_key = property(lambda self: self.root / "operator.pub")
    out_a = property(lambda self: (self.outputs_root or self.root) / "out-a1")
    out_b = property(lambda self: (self.outputs_root or self.root) / "out-b1")
    out_c = property(lambda self: (self.outputs_root or self.root) / "out-c1")

    def copy(self, root: Path, *, with_outputs: bool) -> "World":
        """A copy to mutate; outputs are shared (read only) unless the mutant changes them."""
        root.mkdir()
        for p in self.root.iterdir():
            if p.is_file():
                shutil.copy(p, root / p.name)
            elif p.name.endswith(".public-log"):  # the ledger's public log goes with it
                shutil.copytree(p, root / p.name)
        if with_outputs:
            shutil.copytree(self.out_a, root / "out-a1")
            return World(root)
        return World(root, outputs_root=self.outputs_root or self.root)

    def args(self) -> list[str]:
        return ["verify", str(self.ledger), "--checkpoint", str(self.checkpoint),
                "--public-key", str(self.public_key), "--outputs", str(self.out_a)]

    def lines(self) -> list[bytes]:
        return self.ledger.read_bytes().split(b"\n")[:-1]

    def write_lines(self, lines: list[bytes]) -> None:
        self.ledger.write_bytes(b"".join(line + b"\n" for line in lines))


TORN = b'{"budget":"0.25","hash":"5e'  # what a killed writer left of its next line


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    w = World(tmp_path_factory.mktemp("world"))
    key_path = w.root / "operator.pem"
    write_key(key_path)
    write_key(w.root / "attacker.pem")
    ledger = new_ledger(w.root, cap=POLICY_CAP)
    publish_run(ledger, CONFIG_A, "run-a1", "cef-a", FP_A, DIGESTS_A, w.out_a, key_path)
    plan = plan_run(CONFIG_A)
    rec = start(ledger, plan, "run-a2", dataset="cef-a", fingerprint=FP_A, digests=DIGESTS_A,
                cap_raise=(2 * plan.total, "approved second release"))
    measure(plan.measurements[0], np.zeros(plan.measurements[0].n_cells, dtype=np.int64), rec)
    rec.record_intent(plan.measurements[1])  # the worker died while sampling
    rec.fail("worker lost")
    # A writer killed in the middle of its line; the operator repairs the ledger.
    with open(w.ledger, "ab") as f:
        f.write(TORN)
    repair_ledger(w.ledger, reason="writer killed; tail dropped by the operator")
    # A run that fails, and is resumed after another run (interleaved in the ledger).
    rec = start(ledger, plan, "run-c1", dataset="cef-c", fingerprint=FP_C, digests=DIGESTS_C,
                new_version="the 2020 CEF for the test of resumes")
    rng = np.random.default_rng(11)  # exact counts of a fake dataset (not the noise)
    exact = {m.key: rng.integers(0, 50, m.n_cells) for m in plan.measurements}
    stored = {plan.measurements[0].key: measure(plan.measurements[0], exact[plan.measurements[0].key], rec)}
    rec.record_intent(plan.measurements[1])  # its noise may have been drawn, then lost
    rec.fail("worker lost during sampling")
    publish_run(ledger, CONFIG_B, "run-b1", "cef-b", FP_B, DIGESTS_B, w.out_b, key_path,
                cap_raise=(PURE_IN_RHO, "pure-DP analysis approved"))
    respend = Fraction(plan.measurements[1].budget)
    rec = ledger.resume_run("run-c1", config_digest="c" * 64, dataset="cef-c", fingerprint=FP_C,
                            code_version="test-2", reason="flow retry after worker loss",
                            cap_raise=(plan.total + respend, "re-spend of one lost measurement approved"), plan=plan)
    reusable = ledger.run("run-c1").reusable
    noisy = {m.key: stored[m.key] if m.key in reusable else measure(m, exact[m.key], rec) for m in plan.measurements}
    w.out_c.mkdir()
    release(ledger, rec, w.out_c, write_outputs(CONFIG_A, plan, noisy, w.out_c), key_path)
    w.checkpoint.write_text(json.dumps(ledger.checkpoint(key_path)))
    return w


def invoke(args: list[str]):
    return CliRunner().invoke(audit, args)


def names_failure(output: str, where: str) -> bool:
    """The output's FAILED line names ``where`` (``entry 1`` does not match ``entry 12``)."""
    failed = [line for line in output.splitlines() if line.startswith("FAILED: ")]
    return len(failed) == 1 and re.search(re.escape(where) + r"(?![0-9])", failed[0]) is not None


def test_the_real_ledger_verifies(world: World) -> None:
    result = invoke(world.args())
    assert result.exit_code == 0, result.output
    assert "OK" in result.output and "signature verified with the trusted public key" in result.output
    # The policy, its datasets, raises and versions, the repair and the run that spent for nothing.
    assert "policy: confidential ledger" in result.output and "lineage key checked" in result.output
    assert f"every dataset's cap {format_exact(POLICY_CAP)} (rho)" in result.output
    assert (f"dataset cef-a: 2 run(s), lifetime spend {format_exact(SPENT_A)} "
            f"(rho), 1 content version(s), cap {format_exact(2 * POLICY_CAP)} after 1 recorded raise(s)") in result.output
    assert f"dataset cef-b: 1 run(s), lifetime spend {format_exact(PURE_IN_RHO)} (rho)" in result.output
    assert (f"an interrupted write of {len(TORN)} bytes was dropped (TAIL_REPAIRED, SHA-256 "
            f"{hashlib.sha256(TORN).hexdigest()[:16]}") in result.output
    assert (f"run run-a2 spent {format_exact(FAILED_A2)} and published nothing (failed); complete it without new "
            "noise: phsafe private ... --resume run-a2") in result.output
    # Every release the ledger recorded is checked where it went, the lineage commitment too.
    assert "lineage: the manifest's commitment matches run run-a1's" in result.output
    for run_id, out in (("run-b1", world.out_b), ("run-c1", world.out_c)):
        assert f"run {run_id}: its release at {out} matches the ledger" in result.output
    result = invoke(["verify", str(world.ledger), "--outputs", str(world.out_b), "--public-key", str(world.public_key),
                     "--lineage-key", str(world.lineage_key)])
    assert result.exit_code == 0, result.output
    # The resumed run's outputs: the reused measurement hashes to attempt 1's COMMITTED digest.
    result = invoke(["verify", str(world.ledger), "--outputs", str(world.out_c), "--public-key", str(world.public_key)])
    assert result.exit_code == 0, result.output
    assert "run run-c1: 2 attempts (1 failed or crashed), 1 measurement(s) spent more than once" in result.output
    assert invoke(["verify", str(world.ledger)]).exit_code == 0
    # A manifest is accepted as a checkpoint file too.
    result = invoke(["verify", str(world.ledger), "--checkpoint", str(world.out_a / MANIFEST),
                     "--checkpoint", str(world.out_b / MANIFEST), "--checkpoint", str(world.out_c / MANIFEST),
                     "--checkpoint", str(world.checkpoint)])
    assert result.exit_code == 0 and result.output.count("embedded key") == 4
    # Nothing of the confidential zone is in a release: no input digest, fingerprint or key.
    secrets = [*DIGESTS_A.values(), *DIGESTS_B.values(), *DIGESTS_C.values(), FP_A, FP_B, FP_C,
               world.lineage_key.read_text().strip()]
    for out in (world.out_a, world.out_b, world.out_c):
        text = (out / MANIFEST).read_text()
        assert not [s for s in secrets if s in text]


# --------------------------------------------------------------------------------------------
# Mutation corpus
# --------------------------------------------------------------------------------------------

Mutant = tuple[str, Callable[[World], None], str]  # name, mutate the copy, expected location
OUTPUT_MUTANT = "outputs: "  # name prefix of mutants that change the output directory


def _flip(line: bytes, pos: int) -> bytes:
    return line[:pos] + bytes([line[pos] ^ 0x01]) + line[pos + 1:]


def _value_span(line: bytes, entry: dict[str, Any], field: str) -> tuple[int, int]:
    start = line.index(b'"' + field.encode() + b'":') + len(field) + 3
    return start, len(canonical_json(entry[field]))


def _rehash(lines: list[bytes], edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> list[bytes]:
    """An attacker who rewrites entries and recomputes every hash after them."""
    entries = edit([json.loads(x) for x in lines])
    prev = "0" * 64
    out = []
    renamed: dict[str, str] = {}
    for seq, e in enumerate(entries):
        old = e["hash"]
        if e["kind"] == "COMMITTED":
            e["intent_hash"] = renamed.get(e["intent_hash"], e["intent_hash"])
            e["intent_seq"] = next(i for i, x in enumerate(entries) if x["hash"] == e["intent_hash"])
        e["seq"], e["prev"] = seq, prev
        e["hash"] = entry_hash(e)
        renamed[old] = e["hash"]
        prev = e["hash"]
        out.append(canonical_json(e))
    return out


def _edit_lines(fn: Callable[[list[bytes]], list[bytes]]) -> Callable[[World], None]:
    return lambda w: w.write_lines(fn(w.lines()))


def _edit_checkpoint(fn: Callable[[dict[str, Any], World], None]) -> Callable[[World], None]:
    def apply(w: World) -> None:
        cp = json.loads(w.checkpoint.read_text())
        fn(cp, w)
        w.checkpoint.write_text(json.dumps(cp))
    return apply


def _edit_manifest(fn: Callable[[dict[str, Any], World], None]) -> Callable[[World], None]:
    def apply(w: World) -> None:
        path = w.out_a / "manifest.json"
        manifest = json.loads(path.read_text())
        fn(manifest, w)
        path.write_text(json.dumps(manifest))
    return apply


def _attacker_signature(cp: dict[str, Any], w: World) -> None:
    from phsafe.ledger import checkpoint_message

    key = serialization.load_pem_private_key((w.root / "attacker.pem").read_bytes(), None)
    cp["signature"] = base64.b64encode(key.sign(checkpoint_message(cp["ledger_size"], cp["head_hash"]))).decode()
    cp["public_key"] = (w.root / "attacker.pub").read_text()


def _set(entries: list[dict[str, Any]], run: str | None, kind: str, field: str, value: Any) -> list[dict[str, Any]]:
    for e in entries:
        if e["run_id"] == run and e["kind"] == kind:
            e[field] = value
            return entries
    raise AssertionError((run, kind))


def _index(entries: list[dict[str, Any]], run: str | None, kind: str, key: str | None = None, nth: int = 0) -> int:
    """Index of the ``nth`` entry of ``run`` of ``kind`` (and ``key``)."""
    found = [i for i, e in enumerate(entries)
             if e["run_id"] == run and e["kind"] == kind and (key is None or e.get("key") == key)]
    return found[nth]


def _insert_copy(entries: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    return entries[:i + 1] + [json.loads(json.dumps(entries[i]))] + entries[i + 1:]


def resume_mutants(parsed: list[dict[str, Any]]) -> list[Mutant]:
    """Rewrites of the resumed run (run-c1) and its cap raise, with every hash recomputed."""
    started = parsed[_index(parsed, "run-c1", "RUN_STARTED")]
    raised = parsed[_index(parsed, None, "CAP_RAISED", nth=2)]
    assert raised["dataset"] == "cef-c" and raised["seq"] == _index(parsed, "run-c1", "RUN_RESUMED") - 1
    respent_key = started["planned"][1]["key"]
    n = len(parsed)

    def rehash(edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Callable[[World], None]:
        return _edit_lines(lambda ls: _rehash(ls, edit))

    def set_resumed(field: str, value: Any) -> Callable[[World], None]:
        return rehash(lambda es: _set(es, "run-c1", "RUN_RESUMED", field, value))

    def set_raise(field: str, value: Any) -> Callable[[World], None]:
        return rehash(lambda es: (es[raised["seq"]].update({field: value}), es)[1])

    def retarget_commit(es: list[dict[str, Any]]) -> list[dict[str, Any]]:
        old_intent = es[_index(es, "run-c1", "INTENT", respent_key, 0)]
        commit = es[_index(es, "run-c1", "COMMITTED", respent_key)]
        commit["intent_hash"] = old_intent["hash"]  # _rehash then points intent_seq at it
        return es

    def resume_finished(es: list[dict[str, Any]]) -> list[dict[str, Any]]:
        e = es[_index(es, "run-c1", "RUN_RESUMED")]
        e["run_id"] = "run-a1"
        return es

    assert raised["reason"] and raised["lifetime_cap"] != started["lifetime_cap"]
    return [
        ("resume with another config, rehash", set_resumed("config_digest", "d" * 64), "config_digest differs"),
        ("resume on other records, rehash", set_resumed("fingerprint", FP_A), "fingerprint differs"),
        ("resume as another dataset, rehash", set_resumed("dataset", "cef-a"), "dataset differs"),
        ("resume without a reason, rehash", set_resumed("reason", ""), "reason"),
        ("resume with a blank reason, rehash", set_resumed("reason", "   "), "reason"),
        ("resume with a lowered cap, rehash", set_raise("lifetime_cap", "0.001"), "only ever raised"),
        ("resume raising the cap without a reason, rehash", set_raise("reason", ""), "a cap raise needs a reason"),
        ("resume raising the cap with a blank reason, rehash", set_raise("reason", "  "), "a cap raise needs a reason"),
        ("resume with an Infinity cap, rehash", set_raise("lifetime_cap", "Infinity"), "Infinity lifetime cap"),
        ("resume with a cap too low for the re-spend, rehash",
         rehash(lambda es: [e for e in es if e["hash"] != raised["hash"]]), "exceeds the lifetime cap"),
        ("resume with a non-canonical cap, rehash", set_raise("lifetime_cap", raised["lifetime_cap"] + "0"),
         "lifetime_cap is not a canonical"),
        ("raise another dataset's cap at the resume, rehash", set_raise("dataset", "cef-x"), "exceeds the lifetime cap"),
        ("resume a finished run, rehash", rehash(resume_finished), "a finished run cannot be resumed"),
        ("resume a run never started, rehash", set_resumed("run_id", "run-zz"), "never started"),
        ("resumed with another code version, rehash", set_resumed("code_version", "other"), f"entry {n - 1}"),
        ("drop the resume, rehash",
         rehash(lambda es: [e for e in es if e["kind"] != "RUN_RESUMED"]), "already ended"),
        ("re-spend twice in one attempt, rehash",
         rehash(lambda es: _insert_copy(es, _index(es, "run-c1", "INTENT", respent_key, 1))), "already spent"),
        ("re-spend a committed key without resuming, rehash",
         rehash(lambda es: _insert_copy(es, _index(es, "run-c1", "INTENT", started["planned"][0]["key"], 0))),
         "already spent"),
        ("commit the superseded INTENT, rehash", rehash(retarget_commit), "latest INTENT"),
        ("finish the resumed run without its re-spend charge, rehash",
         rehash(lambda es: _set(es, "run-c1", "RUN_FINISHED", "spent", started["planned_total"])),
         "differs from the run's charge"),
        ("under-report the resumed run's failure, rehash",
         rehash(lambda es: _set(es, "run-c1", "RUN_FAILED", "spent", started["planned"][0]["budget"])),
         "spent"),
    ]


def policy_mutants(parsed: list[dict[str, Any]]) -> list[Mutant]:
    """Rewrites of the policy, the declared datasets and versions, the cap raises, the repair and the
    publications, with every hash recomputed: each breaks a rule of format 2."""

    def rehash(edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Callable[[World], None]:
        return _edit_lines(lambda ls: _rehash(ls, edit))

    def set_at(i: int, **changes: Any) -> Callable[[World], None]:
        return rehash(lambda es: (es[i].update(changes), es)[1])

    def drop(i: int) -> Callable[[World], None]:
        return rehash(lambda es: es[:i] + es[i + 1:])

    raise_a = _index(parsed, None, "CAP_RAISED")
    version_c = next(i for i, e in enumerate(parsed) if e["kind"] == "DATASET_VERSION" and e["dataset"] == "cef-c")
    started_a2 = _index(parsed, "run-a2", "RUN_STARTED")
    published_a1 = _index(parsed, "run-a1", "OUTPUTS_PUBLISHED")
    repaired = _index(parsed, None, "TAIL_REPAIRED")
    budget_line = parsed[_index(parsed, "run-a1", "RUN_STARTED")]["planned"][0]["budget"]
    assert Fraction(budget_line) < POLICY_CAP
    return [
        ("drop the policy, rehash", drop(0), "a ledger starts with LEDGER_INIT"),
        ("policy without a cap limit on confidential data, rehash", set_at(0, lifetime_cap="Infinity"),
         "Infinity lifetime cap"),
        ("policy raised after the fact, rehash", set_at(0, lifetime_cap="1000"), "is not dataset cef-a's cap"),
        ("policy lowered after the fact, rehash", set_at(0, lifetime_cap=budget_line), "is not dataset cef-a's cap"),
        ("policy made non-confidential, rehash", set_at(0, non_confidential=True),
         "confidential ledger takes only confidential runs"),
        ("policy without a reason, rehash", set_at(0, reason=""), "reason"),
        ("policy of another format, rehash", set_at(0, format=1), "format must be 3"),
        ("policy unbound from its log, rehash", set_at(0, format=2), "public_log is bound by LEDGER_INIT of format 3 only"),
        ("policy names another lineage key, rehash", set_at(0, key_id="0" * 32), "ledger.jsonl.key"),
        ("a second policy, rehash", rehash(lambda es: _insert_copy(es, 0)), "LEDGER_INIT can only be the first entry"),
        ("lower the raised cap, rehash", set_at(raise_a, lifetime_cap=budget_line), "only ever raised"),
        ("raise the cap without a reason, rehash", set_at(raise_a, reason=""), "a cap raise needs a reason"),
        ("drop the cap raise, rehash", drop(raise_a), "is not dataset cef-a's cap"),
        ("spend above the policy cap, rehash",
         rehash(lambda es: (es[started_a2].update(lifetime_cap=format_exact(POLICY_CAP)), es[:raise_a] + es[raise_a + 1:])[1]),
         "run exceeds dataset cef-a's lifetime cap"),
        ("a cap raise of a run, rehash", set_at(raise_a, run_id="run-a2"), "run_id must be null"),
        ("declare a version under a second name, rehash", set_at(version_c, fingerprint=FP_A),
         "already declared under dataset 'cef-a'"),
        ("declare a version without a reason, rehash", set_at(version_c, reason=""), "needs a reason"),
        ("run a version never declared, rehash", drop(version_c), "never declared under dataset 'cef-c'"),
        ("run other records under a name, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(
            es, "run-a1", "RUN_STARTED", "fingerprint", FP_C))), "never declared under dataset 'cef-a'"),
        ("declare a run non-confidential, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(
            es, "run-a1", "RUN_STARTED", "non_confidential", True))), "confidential ledger takes only confidential runs"),
        ("say the inputs were validated when they were not, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(
            es, "run-a1", "RUN_STARTED", "validated", "yes"))), "validated must be true or false"),
        ("publish to a relative path, rehash", set_at(published_a1, output="out-a1"), "absolute path"),
        ("publish elsewhere, rehash", set_at(published_a1, output="/elsewhere/out-a1"), f"entry {len(parsed) - 1}"),
        ("finish without publishing, rehash", drop(published_a1), "without OUTPUTS_PUBLISHED"),
        ("publish twice, rehash", rehash(lambda es: _insert_copy(es, published_a1)), "already published"),
        ("repair of nothing, rehash", set_at(repaired, dropped_bytes=0), "dropped_bytes must be a positive integer"),
        ("repair without a digest, rehash", set_at(repaired, dropped_sha256="x"), "dropped_sha256"),
        ("hide the repair, rehash", drop(repaired), f"entry {len(parsed) - 1}"),
    ]


def mutants(w: World) -> list[Mutant]:
    lines = w.lines()
    parsed = [json.loads(x) for x in lines]
    n = len(lines)
    out: list[Mutant] = []

    # A byte flipped in the value of every field of every entry, and in the name of every
    # field of the first entry of each kind.
    named: set[str] = set()
    for i, (line, entry) in enumerate(zip(lines, parsed)):
        for field in sorted(entry):
            start, length = _value_span(line, entry, field)
            spots = [(start + length // 2, "value")]
            if entry["kind"] not in named:
                spots.append((start - 3 - len(field) + 1, "name"))
            for pos, what in spots:
                out.append((f"flip {what} of {entry['kind']}.{field} in entry {i}",
                            _edit_lines(lambda ls, i=i, pos=pos: ls[:i] + [_flip(ls[i], pos)] + ls[i + 1:]),
                            f"entry {i}"))
        named.add(entry["kind"])
    # Nested fields: every planned budget, input digest, output digest and migrated dataset name.
    for i, (line, entry) in enumerate(zip(lines, parsed)):
        nested: list[bytes] = []
        if entry["kind"] == "RUN_STARTED":
            nested += [b'"' + k.encode() + b'":"' + v.encode() + b'"' for k, v in entry["input_digests"].items()]
            nested += [b'"budget":"' + p["budget"].encode() + b'"' for p in entry["planned"]]
        if entry["kind"] == "OUTPUTS_PUBLISHED":
            nested += [b'"' + k.encode() + b'":"' + v.encode() + b'"' for k, v in entry["files"].items()]
        cursor = 0
        for text in nested:  # in serialization order; equal texts are found one after another
            cursor = line.index(text, cursor) + len(text)
            pos = cursor - 3
            out.append((f"flip nested byte {pos} ({text[:24]!r}) in entry {i}",
                        _edit_lines(lambda ls, i=i, pos=pos: ls[:i] + [_flip(ls[i], pos)] + ls[i + 1:]),
                        f"entry {i}"))
    # Structural: delete, duplicate, reorder, truncate.
    for i in range(n):
        out.append((f"delete entry {i}", _edit_lines(lambda ls, i=i: ls[:i] + ls[i + 1:]),
                    f"entry {i}" if i < n - 1 else f"entry {n - 1}: missing"))
        out.append((f"duplicate entry {i}", _edit_lines(lambda ls, i=i: ls[:i + 1] + ls[i:]), f"entry {i + 1}"))
        if i < n - 1:
            out.append((f"swap entries {i},{i + 1}",
                        _edit_lines(lambda ls, i=i: ls[:i] + [ls[i + 1], ls[i]] + ls[i + 2:]), f"entry {i}"))
        out.append((f"truncate to {i} entries", _edit_lines(lambda ls, i=i: ls[:i]), f"entry {i}: missing"))
        out.append((f"truncate inside entry {i}",
                    lambda w, i=i: w.ledger.write_bytes(b"".join(x + b"\n" for x in w.lines()[:i]) + w.lines()[i][:40]),
                    f"entry {i}"))
    out.append(("append a copy of the head", _edit_lines(lambda ls: ls + [ls[-1]]), f"entry {n}"))
    out.append(("empty ledger", lambda w: w.ledger.write_bytes(b""), "entry 0: missing"))
    # The lineage key.
    out += [
        ("lineage key of another ledger", lambda w: w.lineage_key.write_text("ab" * 32 + "\n"), "ledger.jsonl.key"),
        ("lineage key unreadable", lambda w: w.lineage_key.write_text("not hex"), "ledger.jsonl.key"),
    ]
    # Checkpoint and signature.
    out += [
        ("random signature", _edit_checkpoint(lambda cp, w: cp.update(signature=base64.b64encode(bytes(64)).decode())), "checkpoint"),
        ("signature of another size",
         _edit_checkpoint(lambda cp, w: cp.update(signature=base64.b64encode(b"x" * 63).decode())), "checkpoint"),
        ("flipped signature", _edit_checkpoint(
            lambda cp, w: cp.update(signature=base64.b64encode(_flip(base64.b64decode(cp["signature"]), 5)).decode())), "checkpoint"),
        ("attacker re-signs", _edit_checkpoint(_attacker_signature), "checkpoint"),
        ("attacker key, old signature",
         _edit_checkpoint(lambda cp, w: cp.update(public_key=(w.root / "attacker.pub").read_text())), "checkpoint"),
        ("signature removed", _edit_checkpoint(lambda cp, w: cp.update(signature=None, public_key=None)), "checkpoint"),
        ("not base64", _edit_checkpoint(lambda cp, w: cp.update(signature="***")), "checkpoint"),
        ("size - 1 under the old signature", _edit_checkpoint(lambda cp, w: cp.update(ledger_size=cp["ledger_size"] - 1)), "entry"),
        ("size + 1", _edit_checkpoint(lambda cp, w: cp.update(ledger_size=cp["ledger_size"] + 1)), f"entry {n}: missing"),
        ("head of another entry", _edit_checkpoint(lambda cp, w: cp.update(head_hash=parsed[3]["hash"])), f"entry {n - 1}"),
        ("extra checkpoint field", _edit_checkpoint(lambda cp, w: cp.update(note="x")), "checkpoint"),
        ("size as a string", _edit_checkpoint(lambda cp, w: cp.update(ledger_size=str(cp["ledger_size"]))), "checkpoint"),
    ]
    # Rewrites with every hash recomputed: caught by the rules or by the signed checkpoint.
    started_a1 = _index(parsed, "run-a1", "RUN_STARTED")
    out += [
        ("change a planned budget, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: (
            es[started_a1]["planned"][0].update(budget="0.5"), es)[1])), f"entry {started_a1} (RUN_STARTED)"),
        ("change an output digest, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: (
            next(e for e in es if e["kind"] == "OUTPUTS_PUBLISHED")["files"].update({"PH2/PH2.csv": "0" * 64}), es)[1])),
         f"entry {n - 1}"),
        ("change a noisy digest, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(es, "run-a1", "COMMITTED", "noisy_digest", "0" * 64))),
         f"entry {n - 1}"),
        ("change the cap reason, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(es, None, "CAP_RAISED", "reason", "x"))),
         f"entry {n - 1}"),
        ("drop the failure, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: [e for e in es if e["kind"] != "RUN_FAILED"])),
         "entry"),
        ("hide earlier spends, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(es, "run-a2", "RUN_STARTED", "spent_before", "0"))),
         "spent_before"),
        ("change an INTENT budget, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(es, "run-a1", "INTENT", "budget", "0.001"))),
         "differs from the plan"),
        ("under-report a finished run, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(es, "run-a1", "RUN_FINISHED", "spent", "0.1"))),
         "spent"),
        ("under-report a failed run, rehash", _edit_lines(lambda ls: _rehash(ls, lambda es: _set(es, "run-a2", "RUN_FAILED", "spent", "0"))),
         "spent"),
        *resume_mutants(parsed),
        *policy_mutants(parsed),
        ("float budget, rehash", _edit_lines(lambda ls: ls[:started_a1] + [ls[started_a1].replace(
            b'"planned_total":"', b'"planned_total":').replace(b'","privacy_defn"', b',"privacy_defn"')] + ls[started_a1 + 1:]),
         f"entry {started_a1}"),
    ]
    # Outputs.
    csv_rel = "PH1_num/PH1_num.csv"
    manifest_c = w.out_c / MANIFEST  # the resumed run's release, left as it is

    def bump_count(w: World, fix_manifest: bool = False) -> None:
        path = w.out_a / csv_rel
        rows = path.read_text().splitlines()
        fields = rows[1].split("|")
        fields[4] = str(int(fields[4]) + 1)
        rows[1] = "|".join(fields)
        path.write_text("\n".join(rows) + "\n")
        if fix_manifest:
            _edit_manifest(lambda m, w: m["files"].update({csv_rel: hashlib.sha256(path.read_bytes()).hexdigest()}))(w)

    out += [(OUTPUT_MUTANT + name, fn, where) for name, fn, where in [
        ("change a released count", bump_count, csv_rel),
        ("change a count and the manifest", lambda w: bump_count(w, True), "OUTPUTS_PUBLISHED"),
        ("change a manifest digest", _edit_manifest(lambda m, w: m["files"].update({csv_rel: "0" * 64})), "OUTPUTS_PUBLISHED"),
        ("drop a manifest file", _edit_manifest(lambda m, w: m["files"].pop(csv_rel)), "OUTPUTS_PUBLISHED"),
        ("extra file in outputs", lambda w: (w.out_a / "PH2" / "extra.csv").write_text("x"), "PH2/extra.csv"),
        ("file removed from outputs", lambda w: (w.out_a / "parquet" / "PH2.parquet").unlink(), "parquet/PH2.parquet"),
        ("manifest names another run", _edit_manifest(lambda m, w: m.update(run_id="run-a2")), "manifest.json"),
        ("manifest names no run", _edit_manifest(lambda m, w: m.update(run_id="nope")), "manifest.json"),
        ("manifest checkpoint re-signed", _edit_manifest(lambda m, w: _attacker_signature(m["checkpoint"], w)), "checkpoint (manifest.json)"),
        ("manifest checkpoint head", _edit_manifest(lambda m, w: m["checkpoint"].update(head_hash="0" * 64)), "entry"),
        ("manifest missing", lambda w: (w.out_a / "manifest.json").unlink(), "manifest.json"),
        ("parquet swapped for another table's", lambda w: shutil.copy(w.out_a / "parquet" / "PH4.parquet", w.out_a / "parquet" / "PH5_num.parquet"),
         "parquet/PH5_num.parquet"),
        # The manifest's own digest is in OUTPUTS_PUBLISHED; its lineage commitment is keyed.
        ("manifest rewritten with the same content", _edit_manifest(lambda m, w: None),
         "manifest.json: SHA-256 differs from the digest logged in entry"),
        ("manifest of another release", lambda w: shutil.copy(manifest_c, w.out_a / MANIFEST),
         "SHA-256 differs from the digest logged in entry"),
        ("manifest lineage commitment changed", _edit_manifest(lambda m, w: m["lineage"].update(commitment="0" * 64)),
         "lineage commitment"),
        ("manifest lineage of another run", _edit_manifest(
            lambda m, w: m.update(lineage=json.loads(manifest_c.read_text())["lineage"])), "lineage commitment"),
        ("manifest lineage removed", _edit_manifest(lambda m, w: m.pop("lineage")), "lineage commitment"),
    ]]
    return out


def test_mutation_corpus_every_mutant_is_rejected(world: World, tmp_path: Path) -> None:
    corpus = mutants(world)
    assert len(corpus) >= 200
    names = [name for name, _, _ in corpus]
    assert len(names) == len(set(names))
    survivors = []
    for k, (name, mutate, where) in enumerate(corpus):
        copy = world.copy(tmp_path / f"m{k}", with_outputs=name.startswith(OUTPUT_MUTANT))
        mutate(copy)
        # Paths differ per copy; the arguments are the same.
        result = invoke(copy.args())
        if result.exit_code != 1 or not names_failure(result.output, where):
            survivors.append(f"{name}: exit {result.exit_code}: {result.output.strip()[:300]}")
    assert not survivors, "\n".join(survivors)


def test_mutants_without_checkpoint_fail_on_the_entry_itself(world: World, tmp_path: Path) -> None:
    """Without any checkpoint the chain and rules alone still name the first failing entry."""
    lines = world.lines()
    for i in (0, 5, len(lines) - 1):
        copy = world.copy(tmp_path / f"c{i}", with_outputs=False)
        copy.write_lines(lines[:i] + [_flip(lines[i], 30)] + lines[i + 1:])
        result = invoke(["verify", str(copy.ledger)])
        assert result.exit_code == 1 and names_failure(result.output, f"entry {i}")


# --------------------------------------------------------------------------------------------
# Output content: an engine that writes wrong tables but records them honestly is caught
# --------------------------------------------------------------------------------------------


def _rewrite_csv(table: str, fn: Callable[[list[list[str]]], list[list[str]]]) -> Callable[[Path], None]:
    def tamper(outdir: Path) -> None:
        path = outdir / table / f"{table}.csv"
        with open(path, newline="") as f:
            rows = list(csv.reader(f, delimiter="|"))
        rows = fn(rows)
        path.write_text("\n".join("|".join(r) for r in rows) + "\n")
    return tamper


def _set_field(row: int, col: int, value: Callable[[str], str]):
    def fn(rows: list[list[str]]) -> list[list[str]]:
        rows[row][col] = value(rows[row][col])
        return rows
    return fn


def _swap_counts(rows: list[list[str]], col: int) -> list[list[str]]:
    i = next(i for i in range(2, len(rows)) if rows[i][col] != rows[1][col])
    rows[1][col], rows[i][col] = rows[i][col], rows[1][col]
    return rows


CONTENT_MUTANTS = {
    "variance of a measured cell": (_rewrite_csv("PH2", _set_field(1, 5, lambda v: repr(float(v) * 1.01))), "VARIANCE"),
    "variance written with few digits": (_rewrite_csv("PH2", _set_field(2, 5, lambda v: f"{float(v):.12g}")), "VARIANCE"),
    "derived variance not doubled": (_rewrite_csv("PH8_num", _set_field(1, 6, lambda v: repr(float(v) / 2))), "VARIANCE"),
    "count changed after the commit": (_rewrite_csv("PH6", _set_field(2, 3, lambda v: str(int(v) + 1))), "noisy digest"),
    # two rows whose noisy counts differ (equal ones, about 1 in 300 at this sigma, would swap nothing)
    "two counts swapped": (_rewrite_csv("PH4", lambda r: _swap_counts(r, 4)), "PH4/PH4.csv"),
    "derived count not the sum": (_rewrite_csv("PH5_num", _set_field(1, 4, lambda v: str(int(v) + 3))), "not the sum"),
    "row dropped": (_rewrite_csv("PH8_denom", lambda r: r[:-1]), "PH8_denom/PH8_denom.csv"),
    "row of an unmeasured level": (_rewrite_csv("PH2", lambda r: r + [["01", "STATE", "3", "5", "Discrete Gaussian", r[1][5]]]), "no measured level"),
    "extra cell number": (_rewrite_csv("PH2", lambda r: r + [["1", "USA", "99", "5", "Discrete Gaussian", r[1][5]]]), "PH2/PH2.csv"),
    "wrong distribution": (_rewrite_csv("PH6", _set_field(1, 4, lambda v: "Two-Sided Geometric")), "NOISE_DISTRIBUTION"),
    "wrong header": (_rewrite_csv("PH7", _set_field(0, 3, lambda v: "CELL")), "header"),
    "table missing": (lambda d: (shutil.rmtree(d / "PH5_num")), "PH5_num/PH5_num.csv"),
    "unmeasured table released": (lambda d: shutil.copytree(d / "PH4", d / "PH3_x"), "PH3_x"),
}


@pytest.mark.parametrize("name", sorted(CONTENT_MUTANTS))
def test_output_content_mutants(name: str, tmp_path: Path) -> None:
    tamper, where = CONTENT_MUTANTS[name]
    key = tmp_path / "k.pem"
    write_key(key)
    if name == "unmeasured table released":
        def tamper(d: Path) -> None:  # a table folder the run never measured
            (d / "PH3").mkdir()
            shutil.copy(d / "PH4" / "PH4.csv", d / "PH3" / "PH3.csv")
        where = "PH3"
    ledger = new_ledger(tmp_path, cap=1, name="l.jsonl")
    publish_run(ledger, CONFIG_A, "r", "cef-a", FP_A, DIGESTS_A, tmp_path / "out", key, tamper=tamper)
    result = invoke(["verify", str(tmp_path / "l.jsonl"), "--outputs", str(tmp_path / "out"),
                     "--public-key", str(key.with_suffix(".pub"))])
    assert result.exit_code == 1, result.output
    assert where in result.output, result.output


def test_infinity_budget_outputs_verify(tmp_path: Path) -> None:
    """Infinity budgets are for non-confidential runs, which only a non-confidential ledger takes."""
    base = plan_run(CONFIG_A)
    plan = RunPlan(base.privacy_defn, (dataclasses.replace(base.measurements[0], budget=Decimal("Infinity")),)
                   + base.measurements[1:])
    ledger = new_ledger(tmp_path, cap="inf", non_confidential=True, name="l.jsonl")
    rec = start(ledger, plan, "t", non_confidential=True)
    noisy = {m.key: measure(m, np.arange(m.n_cells, dtype=np.int64), rec) for m in plan.measurements}
    out = tmp_path / "out"
    out.mkdir()
    release(ledger, rec, out, write_outputs(CONFIG_A, plan, noisy, out), None)
    result = invoke(["verify", str(ledger.path), "--outputs", str(out)])
    assert result.exit_code == 0, result.output
    assert "policy: non-confidential (throwaway) ledger" in result.output and "cap Infinity" in result.output
    assert "note: the ledger holds runs declared non-confidential (cap not enforced)" in result.output


# --------------------------------------------------------------------------------------------
# Policy, lineage and publication rules, through `phsafe audit verify`
# --------------------------------------------------------------------------------------------


def test_a_crafted_spend_above_the_cap_or_unreasoned_raise_is_rejected_by_verify(world: World, tmp_path: Path) -> None:
    """Entries forced past the API with a correct hash chain: verify names them and the rule."""
    lines = world.lines()
    n = len(lines)
    entries = [json.loads(x) for x in lines]
    started = entries[_index(entries, "run-a1", "RUN_STARTED")]
    body = {k: v for k, v in started.items() if k not in ("seq", "prev", "kind", "time", "run_id", "hash")}
    # The odometer and cap the entry must state: correct, so that only the cap rule can reject it.
    body.update(spent_before=format_exact(SPENT_A), lifetime_cap=format_exact(2 * POLICY_CAP),
                re_release="a second release of cef-a's records, crafted")
    cases = [
        ("spend above the cap", [("RUN_STARTED", "run-a3", body)], f"entry {n} (RUN_STARTED)",
         "run exceeds dataset cef-a's lifetime cap"),
        ("raise without a reason", [("CAP_RAISED", None, {"dataset": "cef-a", "lifetime_cap": "10", "reason": ""})],
         f"entry {n} (CAP_RAISED)", "a cap raise needs a reason"),
        ("raise that lowers", [("CAP_RAISED", None, {"dataset": "cef-a", "lifetime_cap": format_exact(POLICY_CAP),
                                                     "reason": "lower"})], f"entry {n} (CAP_RAISED)", "only ever raised"),
        ("records never declared", [("RUN_STARTED", "run-a3", {**body, "dataset": "cef-d", "fingerprint": "d4" * 32})],
         f"entry {n} (RUN_STARTED)", "never declared under dataset 'cef-d'"),
    ]
    for k, (name, crafted, where, rule) in enumerate(cases):
        copy = world.copy(tmp_path / f"c{k}", with_outputs=False)
        for kind, run_id, entry_body in crafted:
            craft(copy.ledger, kind, run_id, entry_body)
        result = invoke(["verify", str(copy.ledger)])
        assert result.exit_code == 1 and names_failure(result.output, where), (name, result.output)
        assert rule in result.output, (name, result.output)
    # Control: the spend, after a recorded raise with a reason, verifies.
    copy = world.copy(tmp_path / "ok", with_outputs=False)
    craft(copy.ledger, "CAP_RAISED", None, {"dataset": "cef-a", "lifetime_cap": "10", "reason": "approved"})
    craft(copy.ledger, "RUN_STARTED", "run-a3", {**body, "lifetime_cap": "10"})
    result = invoke(["verify", str(copy.ledger)])
    assert result.exit_code == 3 and "public log" in result.output and "is behind the ledger" in result.output
    repair_ledger(copy.ledger)  # the crafted entries were written past the log: catch it up
    result = invoke(["verify", str(copy.ledger)])
    assert result.exit_code == 0, result.output
    assert "cap 10 after 2 recorded raise(s)" in result.output


def _small_release(tmp_path: Path, **kw: Any) -> tuple[Ledger, Path, Path]:
    """A ledger with one published run of CONFIG_A; its key pair."""
    key = tmp_path / "k.pem"
    write_key(key)
    ledger = new_ledger(tmp_path, cap=1, name="l.jsonl")
    out = tmp_path / "out"
    plan = plan_run(CONFIG_A)
    rec = start(ledger, plan, "r", dataset="cef-a")
    noisy = {m.key: measure(m, np.zeros(m.n_cells, dtype=np.int64), rec) for m in plan.measurements}
    out.mkdir()
    release(ledger, rec, out, write_outputs(CONFIG_A, plan, noisy, out), key, **kw)
    return ledger, out, key


def test_the_manifests_digest_must_be_in_the_ledger(tmp_path: Path) -> None:
    """New rule: OUTPUTS_PUBLISHED records the manifest's digest too, so the published manifest (its
    checkpoint and lineage commitment) is vouched for by the ledger."""
    ledger, out, key = _small_release(tmp_path, record_manifest=False)
    result = invoke(["verify", str(ledger.path), "--outputs", str(out), "--public-key", str(key.with_suffix(".pub"))])
    assert result.exit_code == 1
    assert names_failure(result.output, "(OUTPUTS_PUBLISHED): does not record the manifest's digest"), result.output


def test_verify_checks_every_release_where_the_ledger_says_it_went(tmp_path: Path) -> None:
    """New: OUTPUTS_PUBLISHED records the release's place; verify checks it there without --outputs,
    and says when it cannot reach it."""
    ledger, out, key = _small_release(tmp_path)
    result = invoke(["verify", str(ledger.path)])
    assert result.exit_code == 0, result.output
    assert f"run r: its release at {out} matches the ledger" in result.output
    # Tampered where it was published: found without being pointed at it.
    path = out / "PH2" / "PH2.csv"
    original = path.read_bytes()
    path.write_bytes(original.replace(b"|Discrete Gaussian|", b"|Discrete Gaussian |", 1))
    result = invoke(["verify", str(ledger.path)])
    assert result.exit_code == 1 and names_failure(result.output, "PH2/PH2.csv: SHA-256 differs"), result.output
    path.write_bytes(original)
    # Another run's release in its place.
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({**manifest, "run_id": "other"}))
    result = invoke(["verify", str(ledger.path)])
    assert result.exit_code == 1 and "holds run 'other', but the ledger recorded run r as published here" in result.output
    # Moved away: not reachable from here, said so (checked with --outputs where it is now).
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    moved = tmp_path / "moved"
    out.rename(moved)
    result = invoke(["verify", str(ledger.path)])
    assert result.exit_code == 0, result.output
    assert f"run r: published to {out}, not reachable from here (check it with --outputs)" in result.output
    assert invoke(["verify", str(ledger.path), "--outputs", str(moved)]).exit_code == 0


def test_verify_checks_lineage_with_the_ledgers_key_only(tmp_path: Path) -> None:
    """The lineage commitment is checked with the ledger's key (beside it, or --lineage-key); another
    ledger's key is refused; without the key, verify says lineage was not checked."""
    ledger, out, key = _small_release(tmp_path)
    other = new_ledger(tmp_path, name="other.jsonl")
    args = ["verify", str(ledger.path), "--outputs", str(out)]
    result = invoke(args + ["--lineage-key", str(tmp_path / "l.jsonl.key")])
    assert result.exit_code == 0 and "lineage: the manifest's commitment matches run r's" in result.output
    result = invoke(args + ["--lineage-key", str(tmp_path / "other.jsonl.key")])
    assert result.exit_code == 1 and names_failure(result.output, "other.jsonl.key: is not this ledger's lineage key")
    moved = tmp_path / "vault"
    moved.mkdir()
    (tmp_path / "l.jsonl.key").rename(moved / "l.jsonl.key")
    result = invoke(args)
    assert result.exit_code == 0 and "lineage key not available here (lineage not checked)" in result.output
    assert "lineage: the manifest's commitment" not in result.output
    result = invoke(args + ["--lineage-key", str(moved / "l.jsonl.key")])
    assert result.exit_code == 0 and "lineage: the manifest's commitment matches" in result.output
    assert other.path.exists()


def test_a_first_format_ledger_and_its_release_still_verify(tmp_path: Path) -> None:
    """Ledgers written before LEDGER_INIT verify under their own rules, with their releases; after
    `phsafe ledger migrate` the old history and release still verify, and a new run appends."""
    key = tmp_path / "k.pem"
    signer = write_key(key)
    plan = plan_run(CONFIG_A)
    old = FirstFormatLedger(tmp_path / "old.jsonl")
    old.start("old-1", plan, DIGESTS_A)
    rng = np.random.default_rng(5)
    noisy = {m.key: rng.integers(-3, 60, m.n_cells) for m in plan.measurements}
    for m in plan.measurements:
        old.spend("old-1", m, noisy[m.key])
    out = tmp_path / "out-old"
    out.mkdir()
    files = write_outputs(CONFIG_A, plan, noisy, out)
    old.publish("old-1", files)
    old.finish("old-1", plan.total)
    old.start("old-2", plan, DIGESTS_B)
    old.intent("old-2", plan.measurements[0])
    old.fail("old-2", Fraction(plan.measurements[0].budget), "worker lost")
    size, head = len(old.entries), old.entries[-1]["hash"]
    checkpoint = {"ledger_size": size, "head_hash": head, "public_key": signer.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(),
        "signature": base64.b64encode(signer.sign(checkpoint_message(size, head))).decode()}
    (out / MANIFEST).write_text(json.dumps({"run_id": "old-1", "files": files, "checkpoint": checkpoint}))
    args = ["verify", str(old.path), "--outputs", str(out), "--public-key", str(key.with_suffix(".pub"))]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    assert "format: written before ledgers had a policy (verified under its own rules)" in result.output
    assert "outputs: " in result.output and "match the logged variances and noisy digests" in result.output
    assert "run old-2 spent" in result.output and "published nothing (failed)" in result.output
    # Tampered: still caught under the first format's rules.
    lines = old.path.read_bytes().split(b"\n")
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_bytes(b"\n".join(lines[:3] + [_flip(lines[3], 40)] + lines[4:]))
    result = invoke(["verify", str(tampered)])
    assert result.exit_code == 1 and names_failure(result.output, "entry 3")
    result = invoke(["verify", str(old.path), "--lineage-key", str(key)])
    assert result.exit_code == 1 and "the ledger has no policy, so no lineage key" in result.output
    # Migrated in place: the old release still verifies, the new policy is reported.
    migrated = migrate_ledger(old.path, lifetime_cap=3 * plan.total, reason="migration to format 2",
                              names={next(iter(old.entries))["dataset_id"]: "cef-a",
                                     old.entries[-3]["dataset_id"]: "cef-b"})
    result = invoke(args)
    assert result.exit_code == 0, result.output
    assert "policy: confidential ledger" in result.output and "lineage key checked" in result.output
    assert f"dataset cef-a: 1 run(s), lifetime spend {format_exact(plan.total)}" in result.output
    # A new run on the migrated ledger publishes and verifies with its lineage, next to the old one.
    publish_run(migrated, CONFIG_A, "new-1", "cef-a", FP_A, DIGESTS_A, tmp_path / "out-new", key)
    result = invoke(args)
    assert result.exit_code == 0, result.output
    assert f"run new-1: its release at {tmp_path / 'out-new'} matches the ledger" in result.output
    assert f"dataset cef-a: 2 run(s), lifetime spend {format_exact(2 * plan.total)}" in result.output
    result = invoke(["verify", str(old.path), "--outputs", str(tmp_path / "out-new")])
    assert result.exit_code == 0 and "lineage: the manifest's commitment matches run new-1's" in result.output


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def hand_analytic(rho: float) -> float:
    return rho + 2 * math.sqrt(rho * math.log(1e10))


def hand_renyi(rho: float) -> float:
    """Brute force over a fine grid of alpha, then scipy, independent of the report's search."""
    from scipy.optimize import minimize_scalar

    def f(a: float) -> float:
        return rho * a + (math.log(1e10) + (a - 1) * math.log(1 - 1 / a) - math.log(a)) / (a - 1)

    a = np.exp(np.linspace(np.log(1.0001), np.log(1e6), 200001))
    values = rho * a + (math.log(1e10) + (a - 1) * np.log(1 - 1 / a) - np.log(a)) / (a - 1)
    best = float(a[np.argmin(values)])
    res = minimize_scalar(f, bounds=(best / 1.01, best * 1.01), method="bounded", options={"xatol": 1e-12})
    return min(f(best), res.fun)


def test_conversions_match_hand_computations() -> None:
    for rho in (1.257281, 1.226649, 2.514562, 0.01, 1.41, 10.0):
        assert epsilon_analytic(rho) == pytest.approx(hand_analytic(rho), rel=1e-12)
        eps, alpha = epsilon_renyi(rho)
        assert eps == pytest.approx(hand_renyi(rho), abs=1e-9)
        assert eps == pytest.approx(renyi_epsilon_at(alpha, rho), rel=1e-12)  # valid at the reported alpha
        assert eps < epsilon_analytic(rho)
    # SafeTab paper, Table 2: rho = 1.41 gives 12.8 (analytic) and 12.2 (experimental).
    assert round(epsilon_analytic(1.41), 1) == 12.8
    assert round(epsilon_renyi(1.41)[0], 1) == 12.2
    assert epsilon_renyi(0.0)[0] == 0.0 and epsilon_analytic(0.0) == 0.0


def test_report_of_the_production_plans(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path, cap=2, name="l.jsonl")
    for name, path, fingerprint, digests in (("us", US_CONFIG, FP_A, DIGESTS_A), ("pr", PR_CONFIG, FP_B, DIGESTS_B)):
        plan = plan_run(load_config(path))
        start(ledger, plan, name, dataset=f"cef2020-{name}", fingerprint=fingerprint, digests=digests)
    result = invoke(["report", str(tmp_path / "l.jsonl"), "--out", str(tmp_path / "rep")])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    md = (tmp_path / "rep" / "audit_report.md").read_text()
    page = (tmp_path / "rep" / "audit_report.html").read_text()
    for rho_text, bounded_text in (("1.257281", "2.514562"), ("1.226649", "2.453298")):
        rho, bounded = float(rho_text), float(bounded_text)
        figures = [rho_text, bounded_text, f"{hand_analytic(rho):.6f}", f"{hand_analytic(bounded):.6f}",
                   f"{hand_renyi(rho):.6f}", f"{hand_renyi(bounded):.6f}"]
        for text in figures:
            assert text in md and text in page, text
    # Hand values, written out: US rho 1.257281 -> analytic 12.018315, Renyi 11.412372.
    assert "12.018315" in md and "11.412372" in md
    assert md.count("reserved (no terminal entry)") == 46 + 23  # started, never finished
    # Per table x level: budget, Delta, sigma^2, MOE and cells of PH3 state A-G (MOE target 20).
    assert "| PH3 | state\\_A-G | 0.662976 | 14 | 6 | 147.8183222 | 20.00000189 | 2499 |" in md.replace("_", "\\_")
    assert "<table>" in page and "&lt;" not in md


def test_report_of_the_world(world: World, tmp_path: Path) -> None:
    """Datasets are named; a cap's reason is its CAP_RAISED's (shown with the attempt it served)."""
    result = invoke(["report", str(world.ledger), "--out", str(tmp_path)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    md = (tmp_path / "audit_report.md").read_text()
    plan_a = plan_run(CONFIG_A)
    first = Fraction(plan_a.measurements[0].budget) + Fraction(plan_a.measurements[1].budget)
    # Dataset A: the finished run's plan plus the failed run's two INTENTs (one never committed).
    lifetime_a = plan_a.total + first
    assert lifetime_a == SPENT_A
    assert f"(2 runs) | rho (zCDP) | {format_exact(lifetime_a)} | {format_exact(2 * lifetime_a)} |" in md
    for name in ("cef-a", "cef-b", "cef-c"):
        assert f"| Dataset | {name} |" in md
    assert "failed: worker lost" in md and "approved second release" in md
    assert "INTENT only (counts as spent)" in md and "not spent (released)" in md
    # Pure DP: epsilon reported directly, total 0.5 + 1.5 = 2, bounded 4.
    assert "| epsilon (pure DP, delta = 0) | 2 | 4 |" in md
    assert "persons.parquet" in md and "PH1\\_denom/PH1\\_denom.csv" not in md and "PH1_denom/PH1_denom.csv" in md
    # The resumed run: its attempts with their reasons, the measurement spent twice, and its
    # charge with the re-spend (its plan plus the lost measurement's budget, exactly).
    page = (tmp_path / "audit_report.html").read_text()
    respent = plan_a.measurements[1]
    charge_c = plan_a.total + Fraction(respent.budget)
    run_c = md[md.index("## Run run-c1"):md.index("## Run", md.index("## Run run-c1") + 1)]
    assert "| Attempts | 2 (1 resume, 1 failed or crashed) |" in run_c
    assert f"| Charged to the dataset (re-spends included) | {format_exact(charge_c)} |" in run_c
    assert f"| of which re-spends | {format_exact(Fraction(respent.budget))} |" in run_c
    assert "failed (entry " in run_c and "): worker lost during sampling |" in run_c
    assert "| flow retry after worker loss |" in run_c and "| re-spend of one lost measurement approved |" in run_c
    assert "| test-2 |" in run_c and "finished (entry " in run_c
    key = respent.key
    assert re.search(rf"\| {re.escape(key)} \| \d+, \d+ \| {respent.budget} \| 2 \| {format_exact(2 * Fraction(respent.budget))} \|", run_c)
    assert f"(1 runs) | rho (zCDP) | {format_exact(charge_c)} |" in md
    assert "Measurements spent more than once" in page and "flow retry after worker loss" in page
    assert md.count("None: every measurement was spent at most once.") == 3


def test_the_report_says_it_is_confidential(world: World, tmp_path: Path) -> None:
    """Issue 12: the audit report holds confidential lineage (input digests, the truncation key) and
    says so on it."""
    result = invoke(["report", str(world.ledger), "--out", str(tmp_path)])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    for name in ("audit_report.md", "audit_report.html"):
        head = (tmp_path / name).read_text()[:2000]
        assert "CONFIDENTIAL" in head.upper() and "never publish" in head.lower(), name


def test_report_refuses_a_broken_ledger(world: World, tmp_path: Path) -> None:
    broken = tmp_path / "l.jsonl"
    lines = world.lines()
    broken.write_bytes(b"\n".join(lines[:2] + lines[3:]) + b"\n")
    result = invoke(["report", str(broken), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 1 and "entry 2" in result.output
    assert not (tmp_path / "rep").exists()


def test_public_key_needs_something_to_check(world: World) -> None:
    result = invoke(["verify", str(world.ledger), "--public-key", str(world.public_key)])
    assert result.exit_code == 1 and "--public-key" in result.output


def test_cells_are_checked_in_the_vector_order_of_the_domain() -> None:
    """The verifier walks each domain in the order of its vector (Domain.frame), at every
    geography, for a person table iterated by race and a unit table."""
    from phsafe.audit.tables import _cells_in_order

    for config in (CONFIG_A, load_config(PR_CONFIG)):
        for table in ("PH1_num", "PH8_denom", "PH2"):
            for level in TABLES[table].levels:
                domain = measurement_domain(TABLES[table], level, config)
                frame = domain.frame()
                want = [(str(rt), str(rid), str(code), int(cell)) for rt, rid, code, cell in
                        zip(frame["REGION_TYPE"], frame["REGION_ID"], frame["ITERATION_CODE"], frame["CELL"])]
                assert list(_cells_in_order(domain)) == want, (table, level)


def test_a_parquet_copy_with_a_missing_count_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from phsafe.audit.tables import _Cell, _check_parquet
    from phsafe.errors import VerificationFailure

    csv_cells = {("State", "01", "*", 1): _Cell(5, 2.0, "Gaussian"), ("State", "02", "*", 1): _Cell(7, 2.0, "Gaussian")}
    path = tmp_path / "PH2.parquet"
    good = {"REGION_ID": ["01", "02"], "ITERATION_CODE": ["*", "*"], "PH2_DATA_CELL": [1, 1], "COUNT": [5, 7]}
    pq.write_table(pa.table(good), path)
    _check_parquet(path, "parquet/PH2.parquet", csv_cells)
    for column, values, why in (("COUNT", [5, None], "counts differ"), ("PH2_DATA_CELL", [1, None], "counts differ"),
                                ("COUNT", [5, 8], "counts differ")):
        pq.write_table(pa.table({**good, column: values}), path)
        with pytest.raises(VerificationFailure, match=why):
            _check_parquet(path, "parquet/PH2.parquet", csv_cells)
    pq.write_table(pa.table({k: v for k, v in good.items() if k != "COUNT"}), path)
    with pytest.raises(VerificationFailure, match="columns differ"):
        _check_parquet(path, "parquet/PH2.parquet", csv_cells)
    path.write_bytes(b"not parquet")
    with pytest.raises(VerificationFailure, match="cannot be read as Parquet"):
        _check_parquet(path, "parquet/PH2.parquet", csv_cells)
