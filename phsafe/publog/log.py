"""The public log beside a ledger, kept in step with it under the ledger's lock.

Files, beside the ledger ``<ledger>`` (the layout of the published folder is
:mod:`phsafe.tlog.layout`'s)::

    <ledger>.public-log/           the public log: publish this folder as it is
        checkpoint                 the latest signed checkpoint (with witness cosignatures)
        entries                    the public entries, one per line (:mod:`.projection`)
        log.vkey                   the log's verifier key (also give it to auditors out of band)
        hashes                     the writer's stored Merkle hashes (need not be published)
    <ledger>.log.key               the log's signer key: CONFIDENTIAL, mode 0600, kept with the ledger
    <ledger>.witnesses.json        the witnesses the ledger requires (optional, :mod:`.witness`)

In step: every append to the ledger is followed, under the same lock, by the append of its
projection to ``entries`` (then its hashes) and a new checkpoint signed with the log key. The
ledger is written first, so a process killed in between leaves the log *behind* the ledger,
never ahead of it; the next process that takes the ledger's lock (any run, ``ledger repair``)
finds the log shorter than the projection, repairs a torn log append
(:meth:`phsafe.tlog.LogDirectory.recover`), checks that what the log holds is a prefix of the
projection, and appends the rest. A log that is not a prefix of the projection is never
"repaired": the ledger refuses to be used until someone looks.

Witnesses: with ``<ledger>.witnesses.json``, each new checkpoint is sent to the witnesses and
published with their cosignatures. Where it matters -- after a run's RUN_STARTED or RUN_RESUMED
and before each INTENT -- the cosignatures are *required* (:meth:`PublicLog.require_witnesses`):
fewer than the quorum refuse the run before it spends (:class:`~phsafe.errors.ForkRefused`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from phsafe.errors import ForkRefused, LedgerError, MalformedError, StoreError, TlogError, WitnessRefusal
from phsafe.publog.projection import Projector, release_entry_index
from phsafe.publog.witness import WitnessPolicy, read_witness_policy
from phsafe.tlog import LogDirectory, generate_keys, parse_checkpoint, parse_note, read_signer_key, request_cosignature
from phsafe.tlog.files import write_signer_key
from phsafe.tlog.layout import CHECKPOINT_FILE, ENTRIES_FILE, HASHES_FILE, VERIFIER_KEY_FILE, decode_entries
from phsafe.tlog.merkle import HASH_SIZE, tree_size_for_stored_count
from phsafe.tlog.note import ALG_ED25519, Ed25519Signer, check_key_name
from phsafe.tlog.proof import format_tlog_proof

LOG_SUFFIX = ".public-log"
LOG_KEY_SUFFIX = ".log.key"
PROOF_FILE = "privacy-loss.tlog-proof"
ENTRY_FILE = "privacy-loss.entry"
RELEASE_LOG_FILES = (PROOF_FILE, ENTRY_FILE)
"""The files a release folder gets once its publication is recorded (public)."""


def log_path(ledger: Path) -> Path:
    """``<ledger>.public-log``: the public log's folder."""
    return Path(ledger).with_name(Path(ledger).name + LOG_SUFFIX)


def log_key_path(ledger: Path) -> Path:
    """``<ledger>.log.key``: the log's signer key (confidential, 0600)."""
    return Path(ledger).with_name(Path(ledger).name + LOG_KEY_SUFFIX)


def default_log_name(ledger_id: str) -> str:
    """The log's name (its key's name and checkpoints' origin) unless the operator gives one."""
    return f"phsafe.privacy-loss/{ledger_id}"


def create_public_log(ledger: Path, name: str) -> str:
    """Create the log key (0600) and the empty log folder beside ``ledger``; returns the verifier key."""
    try:
        check_key_name(name)
    except MalformedError as exc:
        raise LedgerError(f"the log name {name!r} cannot be a key name: {exc.rule}") from None
    for p in (log_path(ledger), log_key_path(ledger)):
        if os.path.lexists(p):
            raise LedgerError(f"{p} already exists; a public log is created once, with its ledger")
    skey, vkey = generate_keys(name)
    try:
        write_signer_key(log_key_path(ledger), skey)
        LogDirectory.create(log_path(ledger), vkey).close()
    except (OSError, StoreError) as exc:
        raise LedgerError(f"cannot create the public log beside {ledger}: {exc}") from None
    return vkey


def _describe(refusal: WitnessRefusal, size: int) -> str:
    if refusal.status == 409 and refusal.latest_size is not None and refusal.latest_size > size:
        return (f"it has cosigned {refusal.latest_size} entries of this log and this ledger's log has {size}: "
                "this ledger is an older copy or was rolled back")
    if refusal.status == 422:
        return "this ledger's log does not extend the history it cosigned: this ledger is a copy that diverged (a fork)"
    return f"{refusal} (status {refusal.status})"


class PublicLog:
    """The public log of one ledger; every method is called with the ledger's lock held."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = Path(ledger)
        self.path = log_path(self.ledger)
        self._projector = Projector()
        self._signer: Ed25519Signer | None = None

    @classmethod
    def for_ledger(cls, ledger: Path) -> "PublicLog | None":
        """The ledger's public log, or None for a ledger made before public logs existed.

        Raises:
            LedgerError: One of the log folder and the log key is there without the other.
        """
        folder, key = log_path(ledger), log_key_path(ledger)
        if not folder.exists() and not key.exists():
            return None
        if not folder.is_dir():
            raise LedgerError(f"the ledger's public log {folder} is missing (its key {key} is there); restore it "
                              "from the published copy or a backup")
        if not key.exists():
            raise LedgerError(f"the public log's signer key {key} is missing; restore it from the ledger's backup")
        return cls(ledger)

    @property
    def projected(self) -> int:
        """Entries the ledger projects, as of the last :meth:`sync`."""
        return len(self._projector.entries)

    # -- keys ---------------------------------------------------------------------------------

    def signer(self) -> Ed25519Signer:
        if self._signer is None:
            try:
                signer = read_signer_key(log_key_path(self.ledger))
            except StoreError as exc:
                raise LedgerError(f"the public log's key: {exc}") from None
            if signer.alg != ALG_ED25519:
                raise LedgerError(f"{log_key_path(self.ledger)} is not a log key (Ed25519 note signatures)")
            self._signer = signer
        return self._signer

    def verifier_key(self) -> str:
        return (self.path / VERIFIER_KEY_FILE).read_text(encoding="utf-8").strip()

    def check(self) -> None:
        """Preflight: the key is readable and private, and matches the published verifier key."""
        signer = self.signer()
        from phsafe.tlog import format_verifier_key

        try:
            published = self.verifier_key()
        except OSError as exc:
            raise LedgerError(f"cannot read the public log's verifier key in {self.path}: {exc.strerror}") from None
        if format_verifier_key(signer) != published:
            raise LedgerError(f"{log_key_path(self.ledger)} does not match the verifier key in {self.path}")

    # -- keeping in step ----------------------------------------------------------------------

    def _hashed_size(self) -> int | None:
        try:
            length = os.stat(self.path / HASHES_FILE).st_size
        except OSError:
            return None
        if length % HASH_SIZE:
            return None
        try:
            return tree_size_for_stored_count(length // HASH_SIZE)
        except StoreError:
            return None

    def _checkpoint_size(self) -> int | None:
        try:
            return parse_checkpoint(parse_note((self.path / CHECKPOINT_FILE).read_bytes())[0]).size
        except (OSError, TlogError):
            return None

    def _open(self) -> LogDirectory:
        try:
            return LogDirectory.open(self.path)
        except StoreError:
            LogDirectory.recover(self.path)  # an interrupted append: cut or complete it
            return LogDirectory.open(self.path)

    def sync(self, lines: list[bytes], *, deep: bool = False) -> bool:
        """Bring the log in step with the ledger whose verified lines are ``lines``.

        A log whose size and checkpoint match the projection is taken as it is, unless ``deep``:
        then its entries are compared with the projection too (before every spend).
        Returns whether anything was appended or signed.

        Raises:
            LedgerError: The log is not a prefix of the ledger's projection, or cannot be written.
        """
        for line in lines[self._projector.fed:]:
            self._projector.feed_line(line)
        expected = self._projector.entries
        if not deep and self._hashed_size() == len(expected) and self._checkpoint_size() == len(expected):
            return False
        try:
            with self._open() as folder:
                have = folder.size
                on_disk, _ = decode_entries((self.path / ENTRIES_FILE).read_bytes())
                on_disk = on_disk[:have]
                if have > len(expected) or on_disk != expected[:have]:
                    index = next((i for i, (a, b) in enumerate(zip(on_disk, expected)) if a != b), len(expected))
                    raise LedgerError(
                        f"the public log {self.path} is not the projection of the ledger (its entry {index} "
                        f"differs, or it has {have} entries where the ledger projects {len(expected)}); "
                        "it was changed or belongs to another ledger -- the ledger is not used until this is resolved")
                if have < len(expected):
                    folder.append(expected[have:])
                elif self._checkpoint_size() == have:
                    return False  # (deep) in step and signed
                checkpoint = folder.sign_checkpoint(self.signer())
                policy = read_witness_policy(self.ledger)
                if policy is not None:
                    checkpoint, _ = self._cosign(folder, checkpoint, policy)
                folder.publish_checkpoint(checkpoint)
        except StoreError as exc:
            raise LedgerError(f"the public log {self.path} is not the projection of the ledger ({exc}); it was "
                              "changed or damaged -- the ledger is not used until it is restored") from None
        except OSError as exc:
            raise LedgerError(f"could not bring the public log {self.path} in step with the ledger: "
                              f"{exc.strerror or exc}; it is caught up on the ledger's next use (or `phsafe ledger "
                              "repair`)") from None
        return True

    def _cosign(self, folder: LogDirectory, checkpoint: bytes, policy: WitnessPolicy) -> tuple[bytes, list[str]]:
        """``checkpoint`` with every cosignature the witnesses give, and their refusals."""
        size = folder.size
        merged = checkpoint
        refusals: list[str] = []
        for witness_folder in policy.folders:
            try:
                witness = witness_folder.witness()
                cosigned = request_cosignature(witness, folder.log, checkpoint)
            except WitnessRefusal as refusal:
                refusals.append(f"witness {witness_folder.path}: {_describe(refusal, size)}")
                continue
            except (StoreError, OSError) as exc:
                refusals.append(f"witness {witness_folder.path} is not available ({exc})")
                continue
            merged += cosigned[len(checkpoint):]
        return merged, refusals

    def require_witnesses(self, lines: list[bytes]) -> int:
        """The log in step (its entries compared with the projection) and its checkpoint
        cosigned by the ledger's witness quorum (if any). Called before every spend.

        Returns how many witnesses cosigned (0 without a witness policy).

        Raises:
            ForkRefused: Fewer than the quorum cosigned -- this ledger is not the history the
                witnesses know (a copy or a rolled-back ledger), or they cannot be reached.
        """
        self.sync(lines, deep=True)
        policy = read_witness_policy(self.ledger)
        if policy is None:
            return 0
        with self._open() as folder:
            checkpoint = folder.sign_checkpoint(self.signer())
            merged, refusals = self._cosign(folder, checkpoint, policy)
            got = len(policy.folders) - len(refusals)
            if got < policy.quorum:
                raise ForkRefused(
                    f"refused: {got} of the {policy.quorum} required witness cosignatures of the ledger's public log "
                    f"({'; '.join(refusals)}); a copied or rolled-back ledger cannot spend -- nothing was spent")
            folder.publish_checkpoint(merged)
        return got

    # -- release proofs -----------------------------------------------------------------------

    def release_files(self, run_id: str) -> dict[str, bytes]:
        """The two public files a release folder gets: its log entry's bytes and its tlog-proof."""
        with self._open() as folder:
            entries, _ = decode_entries((self.path / ENTRIES_FILE).read_bytes())
            entries = entries[:folder.size]
            index = release_entry_index(entries, run_id)
            if index is None:
                raise LedgerError(f"the public log has no release entry of run {run_id}")
            proof = folder.proof(index)
        return {ENTRY_FILE: entries[index], PROOF_FILE: format_tlog_proof(proof)}


def repair_public_log(ledger: "Any") -> int | None:
    """``phsafe ledger repair``'s part: under the ledger's lock, the public log recovered from an
    interrupted append (a torn line cut, missing hashes computed) and compared with the
    projection in full, then caught up. Returns its size, or None for a ledger without one."""
    with ledger.locked() as state:
        if ledger.public_log is None:
            return None
        ledger.public_log.sync(state.lines, deep=True)
        return ledger.public_log.projected


def write_release_files(outdir: Path, files: dict[str, bytes]) -> None:
    """Write the release's log files into the published folder (each atomically, fsynced)."""
    from phsafe.tlog.files import replace_file

    for name, data in files.items():
        replace_file(Path(outdir) / name, data)
