"""Power cuts at every file operation of a release, a resume and a repair -- data and metadata.

The file operations of three real phases are recorded in this process
(:mod:`tests.system._crash_model`): a whole private release, the resume of a failed run, and
the repair of a torn ledger tail. After every operation, the states a power cut may leave are
taken: ``synced`` (only fsynced data, and only names whose folder was fsynced after them,
survive), ``everything`` (every operation survived) and ``torn`` (everything, with the last write
cut in half); identical states are explored once. Each state is written back in place, then:

1. ``audit verify`` must never fail (exit 1): a power cut is not tampering. It exits 0 or 3 (an
   action needed), and never 0 while a repair is unfinished or a torn tail is there;
2. ``ledger repair`` must leave a ledger that verifies with no repair pending;
3. the run is completed -- resumed if the ledger says it did not finish, its leftovers removed
   (``clean-finished``) if it did -- and ``audit verify`` then exits 0. The resume is run once per
   class of states (what the ledger says of the run, which vectors are there, the output folder,
   the log), since states of one class differ only in how many measurements came before.

And in every state, as the promises say:

* no spend lost: every noise draw that happened before the cut has its ``INTENT`` in the state's
  ledger (a spend is durable before its noise is drawn);
* none unrecorded and none drawn twice: after the resume, a measurement whose ``COMMITTED`` and
  noisy vector survived is reused, never spent again; every other one is spent once more;
* nothing published that the ledger does not record: an output folder is either absent or a
  whole release, and a ledger that records a publication has it in place; a release in place
  that the ledger does not record is recorded by the resume, never replaced.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

import phsafe
import phsafe.noise
from phsafe.audit.verify import verify
from phsafe.engine import clean_finished_runs
from phsafe.errors import VerificationFailure
from phsafe.ledger import RunStatus, read_ledger
from phsafe.measurements import MeasurementStore
from phsafe.noise import vector_digest
from phsafe.private_run import forget_ledgers
from phsafe.publog import RELEASE_LOG_FILES, repair_ledger
from tests._ledgers import new_ledger
from tests.system._crash_model import DIR, CrashState, Recorder, materialize

REPO = Path(__file__).resolve().parents[2]
DATASET = "crash-states"
TORN = b'{"budget":"0.0163'  # the first bytes of an entry, cut by a power cut


@dataclass
class Phase:
    """One recorded phase and what its states are checked against."""

    name: str
    recorder: Recorder
    run_id: str
    out: Path
    ledger: Path
    intents_before: Counter  # INTENTs of the run per key before the phase
    release_keys: set[str]  # the run's planned measurements
    release_files: set[str]  # the files of a whole release
    ledger_before: bytes  # the ledger when the phase began (its torn tail included)
    outcomes: Counter = field(default_factory=Counter)
    classes: dict[tuple, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny input and a config measuring one level of each table (9 measurements)."""
    from phsafe.synthetic import synthesize

    base = tmp_path_factory.mktemp("crash-inputs")
    synthesize(base / "data", 200, "01", seed=11)
    config = json.loads((REPO / "demo" / "data" / "us" / "config.json").read_text())
    config.update(state_filter=["01"], dataset=DATASET)
    for levels in config["privacy_budget"].values():
        for level in levels:
            if level != "state_*":
                levels[level] = 0
    (base / "config.json").write_text(json.dumps(config))
    return {"data": base / "data", "config": base / "config.json"}


def _run(inputs: dict[str, Path], ledger: Path, out: Path, **kw: Any):  # noqa: ANN202
    return phsafe.run_private(inputs["config"], inputs["data"], out, ledger=ledger, validate=False, **kw)


def _entries(ledger: Path) -> list[dict]:
    try:
        data = ledger.read_bytes()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]


def _intents(entries: list[dict], run_id: str) -> Counter:
    return Counter(e["key"] for e in entries if e["kind"] == "INTENT" and e["run_id"] == run_id)


@pytest.fixture()
def draws(monkeypatch: pytest.MonkeyPatch) -> Callable[[Recorder], None]:
    """Noise draws become events of the recorder that is watching."""
    original = phsafe.noise._build_mechanism
    watching: list[Recorder] = []

    def build(m):  # noqa: ANN001, ANN202
        mechanism, *rest = original(m)

        def draw(values):  # noqa: ANN001, ANN202
            if watching:
                watching[-1].event("draw", m.key)
            return mechanism(values)

        return (draw, *rest)

    monkeypatch.setattr(phsafe.noise, "_build_mechanism", build)
    return watching.append


def _record(phase_name: str, root: Path, action: Callable[[], Any], watch: Callable[[Recorder], None]) -> Recorder:
    recorder = Recorder(root)
    watch(recorder)
    forget_ledgers()
    with recorder.recording():
        action()
    forget_ledgers()
    return recorder


# --------------------------------------------------------------------------------------------
# What each state must satisfy
# --------------------------------------------------------------------------------------------


def _verify(ledger: Path) -> tuple[str, list[str]]:
    forget_ledgers()
    try:
        result = verify(ledger)
    except VerificationFailure as exc:
        return "failed", [str(exc)]
    return ("action" if result.actions else "ok"), result.actions


def _out_state(phase: Phase, files: dict[str, str | None]) -> str:
    rel = phase.out.relative_to(phase.recorder.root).as_posix()
    held = {k[len(rel) + 1:] for k, v in files.items() if k.startswith(rel + "/") and v is not DIR}
    if rel not in files:
        return "absent"
    tables = phase.release_files - set(RELEASE_LOG_FILES)
    if not tables <= held:
        return f"partial({len(held)})"
    logs = sorted(held - tables)
    return "release" + (f"+{','.join(logs)}" if logs else "")


def _vectors(phase: Phase, files: dict[str, str | None], entries: list[dict]) -> tuple[set[str], set[str]]:
    """Keys whose latest INTENT is committed, and those of them whose vector is in the state."""
    store = MeasurementStore(Path("runs") / phase.run_id / "measurements")
    committed: dict[str, str] = {}
    for e in entries:
        if e["run_id"] != phase.run_id:
            continue
        if e["kind"] == "INTENT":
            committed.pop(e["key"], None)
        elif e["kind"] == "COMMITTED":
            committed[e["key"]] = e["noisy_digest"]
    kept = set()
    enclave = phase.ledger.parent.relative_to(phase.recorder.root).as_posix()
    for key, digest in committed.items():
        rel = f"{enclave}/{store.path(key).as_posix()}"
        blob = files.get(rel)
        if blob is not None and _vector_digest(phase.recorder.model.blobs[blob]) == digest:
            kept.add(key)
    return set(committed), kept


def _vector_digest(data: bytes) -> str | None:
    import io

    import numpy as np

    try:
        return vector_digest(np.load(io.BytesIO(data), allow_pickle=False))
    except (ValueError, OSError):
        return None


def _class(phase: Phase, state: CrashState, entries: list[dict], committed: set[str], kept: set[str]) -> tuple:
    """What decides how a resume goes: the run's last entry, an uncommitted spend, lost vectors,
    the output folder and its log files, the work folder and the public log."""
    mine = [e for e in entries if e["run_id"] == phase.run_id]
    last = mine[-1]["kind"] if mine else None
    files = state.files
    enclave = phase.ledger.parent.relative_to(phase.recorder.root).as_posix()
    work = f"{enclave}/runs/{phase.run_id}"
    dangling = bool(mine) and mine[-1]["kind"] == "INTENT"
    return (last, dangling, len(committed - kept) > 0, _out_state(phase, files), work in files,
            f"{work}/release" in files, f"{work}/measurements" in files,
            any(".partial-" in k for k in files), any(k.endswith(".tmp") for k in files),
            f"{phase.ledger.relative_to(phase.recorder.root).as_posix()}.repair" in files)


def _explore(phase: Phase, state: CrashState, inputs: dict[str, Path]) -> None:
    label = f"{phase.name} state after op {state.at} ({state.op}; {state.view})"
    model = phase.recorder.model
    materialize(model, state.files)
    entries = _entries(phase.ledger)
    torn = phase.ledger.is_file() and not phase.ledger.read_bytes().endswith(b"\n")

    # No spend lost: every draw before the cut has its INTENT in the ledger the cut left.
    drawn = Counter(detail for kind, detail in state.events if kind == "draw")
    recorded = _intents(entries, phase.run_id) - phase.intents_before
    for key, n in drawn.items():
        assert recorded[key] >= n, f"{label}: noise of {key} drawn {n} time(s), {recorded[key]} INTENT(s) survive"

    # Nothing the ledger held is lost, and an interrupted write is dropped only with its record
    # (TAIL_REPAIRED, or the repair's record written ahead of the cut).
    now = phase.ledger.read_bytes() if phase.ledger.is_file() else b""
    kept = phase.ledger_before[: phase.ledger_before.rfind(b"\n") + 1]
    assert now.startswith(kept), f"{label}: the ledger lost entries it held before the phase"
    tail = phase.ledger_before[len(kept):]
    if tail and not now[len(kept):].startswith(tail):
        digest = hashlib.sha256(tail).hexdigest()
        record = phase.ledger.with_name(phase.ledger.name + ".repair")
        stated = record.is_file() and digest in record.read_text(errors="replace")
        assert stated or any(e["kind"] == "TAIL_REPAIRED" and e["dropped_sha256"] == digest for e in entries), \
            f"{label}: the interrupted write was dropped and nothing records it"

    # Nothing published that the ledger does not record, and nothing recorded that is not there.
    out = _out_state(phase, state.files)
    assert not out.startswith("partial"), f"{label}: the output folder is a part of a release ({out})"
    published = [e for e in entries if e["kind"] == "OUTPUTS_PUBLISHED" and e["run_id"] == phase.run_id]
    if published:
        assert out.startswith("release"), f"{label}: the ledger records a release that is not in place ({out})"
    elif "privacy-loss" in out:
        pytest.fail(f"{label}: the release has public log files of a publication the ledger does not record")

    # 1. audit verify: never a failure, never OK while something is left to do.
    outcome, actions = _verify(phase.ledger)
    assert outcome != "failed", f"{label}: audit verify failed: {actions}"
    pending = (phase.ledger.with_name(phase.ledger.name + ".repair")).exists()
    if torn or pending:
        assert outcome == "action" and any("ledger repair" in a for a in actions), f"{label}: {outcome} {actions}"
    phase.outcomes[f"verify {outcome}"] += 1

    # 2. repair: a ledger that verifies, no repair pending.
    forget_ledgers()
    repaired = repair_ledger(phase.ledger)
    if torn or pending:
        assert repaired is not None, label
        phase.outcomes["repaired"] += 1
    after, actions = _verify(phase.ledger)
    assert after != "failed" and not any("ledger repair" in a for a in actions), f"{label}: after repair: {actions}"
    entries = _entries(phase.ledger)
    repairs = [e for e in entries if e["kind"] == "TAIL_REPAIRED"]
    assert len({(e["dropped_bytes"], e["dropped_sha256"]) for e in repairs}) == len(repairs), \
        f"{label}: one interrupted write recorded twice"

    # A COMMITTED is recorded only once its noisy vector is durable: it survives with it.
    committed, kept = _vectors(phase, state.files, entries)
    if not any(e["kind"] == "RUN_FINISHED" and e["run_id"] == phase.run_id for e in entries):
        assert committed == kept, f"{label}: COMMITTED survived without its noisy vector: {sorted(committed - kept)}"

    # 3. complete the run (once per class of states).
    key = _class(phase, state, entries, committed, kept)
    if key in phase.classes:
        phase.outcomes["resume: same class as an earlier state"] += 1
        return
    mine = [e for e in entries if e["run_id"] == phase.run_id]
    if not mine:
        assert out == "absent", f"{label}: a release of a run the ledger does not know"
        phase.classes[key] = "not started: nothing spent, nothing to resume"
    elif any(e["kind"] == "RUN_FINISHED" for e in mine):
        forget_ledgers()
        clean_finished_runs(phase.ledger, [phase.run_id])
        phase.classes[key] = "finished: leftovers cleaned"
    else:
        before = _intents(entries, phase.run_id)
        forget_ledgers()
        result = _run(inputs, phase.ledger, phase.out, resume=phase.run_id, resume_reason="crash-state test")
        assert result.run_id == phase.run_id
        spent = _intents(_entries(phase.ledger), phase.run_id) - before
        expected = Counter({k: 1 for k in phase.release_keys - kept})
        assert spent == expected, f"{label}: the resume spent {dict(spent)}, expected {dict(expected)} (reusable {kept})"
        phase.classes[key] = f"resumed: {sum(spent.values())} re-spent, {len(kept)} reused"
    final, actions = _verify(phase.ledger)
    assert final == "ok", f"{label}: after completing the run: {final} {actions}"
    phase.outcomes["completed, then verify OK"] += 1


# --------------------------------------------------------------------------------------------
# The three phases
# --------------------------------------------------------------------------------------------


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "root"
    ledger = new_ledger(root / "enclave", cap="100").path
    (root / "releases").mkdir()
    return root, ledger, root / "releases" / "out"


def _phase(name: str, recorder: Recorder, ledger: Path, out: Path, run_id: str, before: list[dict],
           inputs: dict[str, Path], ledger_before: bytes) -> Phase:
    from phsafe.accounting import plan_run
    from phsafe.config import load_config
    from phsafe.outputs import OUTPUT_TABLES
    from phsafe.publog import RELEASE_LOG_FILES

    keys = {m.key for m in plan_run(load_config(inputs["config"])).measurements}
    files = ({f"{t}/{t}.csv" for t in OUTPUT_TABLES} | {f"parquet/{t}.parquet" for t in OUTPUT_TABLES}
             | {"datapackage.json", "manifest.json", *RELEASE_LOG_FILES})
    return Phase(name, recorder, run_id, out, ledger, _intents(before, run_id), keys, files, ledger_before)


def _explore_all(phase: Phase, inputs: dict[str, Path]) -> None:
    start = time.process_time()
    for state in phase.recorder.states:
        try:
            _explore(phase, state, inputs)
        except Exception as exc:  # noqa: BLE001 -- which state, then the error
            raise AssertionError(f"{phase.name} state after op {state.at} ({state.op}; {state.view}): "
                                 f"{type(exc).__name__}: {exc}") from exc
    views = Counter(s.view for s in phase.recorder.states)
    print(f"\n{phase.name}: {len(phase.recorder.ops)} file operations, {phase.recorder.taken} crash states taken, "
          f"{len(phase.recorder.states)} distinct ({', '.join(f'{n} first seen {v}' for v, n in sorted(views.items()))}), "
          f"explored in {time.process_time() - start:.1f} CPU-s")
    for what, n in sorted(phase.outcomes.items()):
        print(f"  {n:4d}  {what}")
    for cls, how in Counter(phase.classes.values()).items():
        print(f"  {how:4d}  resume class: {cls}")


def _failed_run(inputs: dict[str, Path], ledger: Path, out: Path, monkeypatch: pytest.MonkeyPatch,
                saves: int) -> str:
    """A release whose ``saves``-th measurement save finds the disk full: the run fails after its
    spends. Returns its run id."""
    original, calls = MeasurementStore.save, []

    def save(store, key, vector):  # noqa: ANN001, ANN202
        calls.append(key)
        if len(calls) == saves:
            raise OSError(28, "No space left on device")
        return original(store, key, vector)

    monkeypatch.setattr(MeasurementStore, "save", save)
    with pytest.raises(OSError):
        _run(inputs, ledger, out, new_version="v1")
    monkeypatch.setattr(MeasurementStore, "save", original)
    (run_id, _), = read_ledger(ledger).runs.items()
    return run_id


def test_every_crash_state_of_a_release(inputs: dict[str, Path], tmp_path: Path, draws) -> None:
    root, ledger, out = _setup(tmp_path)
    ran: list[str] = []
    before = ledger.read_bytes()
    recorder = _record("release", root, lambda: ran.append(_run(inputs, ledger, out, new_version="v1").run_id), draws)
    phase = _phase("release", recorder, ledger, out, ran[0], [], inputs, before)
    _explore_all(phase, inputs)


def test_every_crash_state_of_a_resume(inputs: dict[str, Path], tmp_path: Path, draws,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root, ledger, out = _setup(tmp_path)
    run_id = _failed_run(inputs, ledger, out, monkeypatch, saves=5)
    assert read_ledger(ledger).runs[run_id].status is RunStatus.FAILED
    before, held = _entries(ledger), ledger.read_bytes()
    recorder = _record("resume", root, lambda: _run(inputs, ledger, out, resume=run_id, resume_reason="r"), draws)
    phase = _phase("resume", recorder, ledger, out, run_id, before, inputs, held)
    _explore_all(phase, inputs)


def test_every_crash_state_of_a_repair(inputs: dict[str, Path], tmp_path: Path, draws,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root, ledger, out = _setup(tmp_path)
    run_id = _failed_run(inputs, ledger, out, monkeypatch, saves=3)
    with open(ledger, "ab") as f:  # an append torn by a power cut
        f.write(TORN)
    before, held = _entries(ledger), ledger.read_bytes()
    recorder = _record("repair", root, lambda: repair_ledger(ledger), draws)
    phase = _phase("repair", recorder, ledger, out, run_id, before, inputs, held)
    _explore_all(phase, inputs)
