"""The public log beside a ledger, following it under the ledger's lock.

Files, beside the ledger ``<ledger>`` (the layout of the published folder is
:mod:`phsafe.tlog.layout`'s)::

    <ledger>.public-log/           the public log: publish this folder as it is
        checkpoint                 the latest signed checkpoint (with witness cosignatures)
        entries                    the public entries, one per line (:mod:`.projection`)
        log.vkey                   the log's verifier key (also give it to auditors out of band)
        hashes                     the writer's stored Merkle hashes (need not be published)
    <ledger>.log.key               the log's signer key: CONFIDENTIAL, mode 0600, kept with the ledger
    <ledger>.witnesses.json        the witnesses' public keys and URLs (:mod:`.witnesses`)

:class:`PublicLog` is the ledger's :class:`~phsafe.ledger.store.AppendFollower`: it registers
itself with the ledger (:meth:`PublicLog.attach`), which calls it under its lock -- the ledger
never reads these files. The ledger's first entry binds the log (origin, verifier key, witness
keys, quorum): attaching checks that the folder, the key and the witness list are there and are
the bound ones, or refuses with one line naming what is missing; a ledger bound to a log appends
nothing without it.

In step. Every append to the ledger is followed, under the same lock, by the append of its
projection to ``entries`` (then its hashes) and a new checkpoint signed with the log key, sent to
the witnesses (whoever answers cosigns it) and published. The ledger is written first, so a
process killed in between leaves the log *behind* the ledger, never ahead of it; the next process
that attaches the log (any run, ``ledger repair``) repairs a torn log append
(:meth:`phsafe.tlog.LogDirectory.recover`), checks that what the log holds is a prefix of the
projection, and appends the rest. A log that is not a prefix of the projection is never
"repaired": the ledger refuses to be used until someone looks.

The tree is kept in memory (the projection's, the authority), the files are opened once per
process and written at their end; they are read again only when another process wrote to them
meanwhile (their sizes say so).

Witnesses. Before and after every entry that spends or lets spend, the ledger asks its followers
to confirm it (:meth:`PublicLog.confirm`): the log's checkpoint must be cosigned by the quorum
of its witnesses, asked over HTTP; before the entry every witness is asked anew (an unreachable
witness stops the run before its next spend), after it the cosignatures obtained for the tree
that holds the entry count. Fewer than the quorum refuse the run (:class:`~phsafe.errors.ForkRefused`).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from phsafe.errors import (
    ForkRefused,
    LedgerError,
    MalformedError,
    ProofError,
    SignatureError,
    StoreError,
    TlogError,
    WitnessesUnavailable,
    WitnessRefusal,
    WitnessUnreachable,
    os_reason,
)
from phsafe.ledger.store import FollowerUnwritable
from phsafe.publog.projection import Projector, release_entry_index
from phsafe.publog.witnesses import HttpWitness, WitnessList, describe_refusal, read_witness_list, witnesses_path
from phsafe.tlog.checkpoint import parse_checkpoint, verify_checkpoint
from phsafe.tlog.files import read_signer_key, write_signer_key
from phsafe.tlog.keys import format_verifier_key, generate_keys
from phsafe.tlog.layout import VERIFIER_KEY_FILE
from phsafe.tlog.log import TransparencyLog
from phsafe.tlog.note import ALG_ED25519, Ed25519Signer, NoteSignature, check_key_name, format_note, parse_note
from phsafe.tlog.proof import format_tlog_proof
from phsafe.tlog.publication import LogDirectory
from phsafe.tlog.witness import request_cosignature

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


def log_binding(vkey: str, witnesses: WitnessList | None) -> dict[str, Any]:
    """What the ledger's first entry binds: the log's origin and key, the witnesses' keys and quorum."""
    return {"origin": vkey.split("+", 1)[0], "vkey": vkey,
            "witnesses": witnesses.vkeys if witnesses else [], "quorum": witnesses.quorum if witnesses else 0}


def create_log_files(ledger: Path, name: str) -> str:
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


def _missing(what: str, path: Path, origin: str) -> LedgerError:
    return LedgerError(f"refused: the ledger is bound to its public log {origin} and {what} {path} is missing; "
                       "restore it from the ledger's backup (or the published copy) -- nothing was spent")


def check_log_files(ledger: Path, binding: Mapping[str, Any]) -> tuple[Ed25519Signer, WitnessList | None]:
    """The bound log's files are there and are the bound ones: its folder and verifier key, its
    signer key (private, the bound key), and a witness list with exactly the bound keys and
    quorum. Returns the signer and the witnesses. Reads only the small files; changes nothing.

    Raises:
        LedgerError: One line naming what is missing or is another's.
    """
    origin = binding["origin"]
    folder, key = log_path(ledger), log_key_path(ledger)
    if not folder.is_dir():
        raise _missing("its log folder", folder, origin)
    try:
        published = (folder / VERIFIER_KEY_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise _missing("its verifier key", folder / VERIFIER_KEY_FILE, origin) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LedgerError(f"cannot read the public log's verifier key {folder / VERIFIER_KEY_FILE}: {exc}") from None
    if published != binding["vkey"]:
        raise LedgerError(f"refused: the public log in {folder} is not the one the ledger is bound to (its verifier "
                          f"key is another's than {origin}'s) -- nothing was spent")
    if not os.path.lexists(key):
        raise _missing("its log key", key, origin)
    try:
        signer = read_signer_key(key)
    except StoreError as exc:
        raise LedgerError(f"the public log's key: {exc}") from None
    if signer.alg != ALG_ED25519 or format_verifier_key(signer) != binding["vkey"]:
        raise LedgerError(f"refused: {key} is not the key of the public log the ledger is bound to ({origin}) -- "
                          "nothing was spent")
    witnesses = read_witness_list(ledger)
    bound, quorum = list(binding["witnesses"]), binding["quorum"]
    if bound and witnesses is None:
        raise LedgerError(f"refused: the ledger is bound to {len(bound)} witness(es) (quorum {quorum}) and its witness "
                          f"list {witnesses_path(ledger)} is missing; restore it (the witnesses' keys and URLs) -- "
                          "nothing was spent")
    listed = witnesses.vkeys if witnesses else []
    if sorted(listed) != sorted(bound) or (witnesses.quorum if witnesses else 0) != quorum:
        raise LedgerError(
            f"refused: the witness list {witnesses_path(ledger)} names {len(listed)} witness(es) with quorum "
            f"{witnesses.quorum if witnesses else 0}; the ledger is bound to {len(bound)} with quorum {quorum}: "
            "witnesses are never removed, swapped or lowered by editing the list -- nothing was spent")
    return signer, witnesses  # type: ignore[return-value]


WRITE_REFUSALS = {
    errno.EACCES: ("permission denied: its folder or files are not writable by this user",
                   "make them writable by the user the runs run as"),
    errno.EPERM: ("the operation is not permitted on its folder or files (a read-only or immutable file)",
                  "make them writable by the user the runs run as"),
    errno.EROFS: ("its file system is mounted read-only", "mount it read-write"),
    errno.ENOSPC: ("no space left on its file system", "free space there"),
    errno.EDQUOT: ("the disk quota of its file system is exceeded", "free space there (or raise the quota)"),
    errno.EFBIG: ("a file would exceed the largest size allowed", "raise the file-size limit"),
    errno.EIO: ("an input/output error on its file system", "check the disk"),
}
"""The operating system's refusals of a write to the log, in words, and what the operator does."""


def os_refusal(exc: BaseException) -> OSError | None:
    """The operating system's refusal behind ``exc`` (itself, or what it was raised from or while
    handling), if it is one of :data:`WRITE_REFUSALS`; None otherwise."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in WRITE_REFUSALS:
            return current
        current = current.__cause__ or current.__context__
    return None


def unwritable(folder: Path, exc: OSError) -> FollowerUnwritable:
    """One line: the log cannot be written, why (permission, space ...), and what to do."""
    cause, remedy = WRITE_REFUSALS.get(exc.errno or 0, (os_reason(exc), "fix it"))
    return FollowerUnwritable(
        f"cannot write the public log {folder}: {cause} ({errno.errorcode.get(exc.errno or 0, 'error')}); {remedy}, "
        "then run again (a failed run resumes; the log catches up with the ledger)", errno=exc.errno)


class PublicLog:
    """The public log of one ledger: an :class:`~phsafe.ledger.store.AppendFollower`.

    Made by :meth:`attach` (or :func:`phsafe.publog.open_ledger`); every method is called by the
    ledger with its lock held.
    """

    def __init__(self, ledger: Path, binding: Mapping[str, Any], signer: Ed25519Signer,
                 witnesses: WitnessList | None, *, transport: Any = None) -> None:
        self.ledger = Path(ledger)
        self.path = log_path(self.ledger)
        self._binding = dict(binding)
        self._signer = signer
        self._witnesses = witnesses
        self._clients = [HttpWitness(w, transport) for w in (witnesses.witnesses if witnesses else ())]
        self._projector = Projector()
        self._tree = TransparencyLog.of_entries(())
        self._folder: LogDirectory | None = None
        self._witness_size: dict[str, int] = {}  # what each witness is known to have cosigned last
        self._cosigned: dict[str, NoteSignature] = {}  # cosignatures of the current tree, by witness
        self._unreached: set[str] = set()  # witnesses not reached at their last request
        self._unreached_at: dict[str, tuple[int, str]] = {}  # ... the tree size they were asked to cosign then, why
        self.last_refusals: list[str] = []

    @classmethod
    def attach(cls, ledger: Any, *, transport: Any = None) -> "PublicLog":
        """Check the log ``ledger``'s policy binds, and register it as the ledger's follower.

        Raises:
            LedgerError: The ledger binds no log (made before public logs were bound: `phsafe ledger
                migrate`), or the log's folder, key or witness list is missing or another's.
        """
        state = ledger.state
        binding = state.public_log
        if binding is None:
            raise LedgerError(f"the ledger {ledger.path} is not bound to a public log")
        signer, witnesses = check_log_files(ledger.path, binding)
        log = cls(ledger.path, binding, signer, witnesses, transport=transport)
        ledger.add_follower(log)
        return log

    @property
    def binding(self) -> Mapping[str, Any]:
        return self._binding

    @property
    def witnesses(self) -> WitnessList | None:
        return self._witnesses

    @property
    def projected(self) -> int:
        """Entries the ledger projects, as of the last :meth:`follow`."""
        return len(self._projector.entries)

    def verifier_key(self) -> str:
        return self._binding["vkey"]

    def close(self) -> None:
        if self._folder is not None:
            self._folder.close()
            self._folder = None
        for client in self._clients:
            client.close()

    # -- keeping in step ----------------------------------------------------------------------

    def follow(self, lines: Sequence[bytes]) -> None:
        """Bring the log in step with the ledger whose verified lines are ``lines``.

        Raises:
            LedgerError: The log is not a prefix of the ledger's projection, or cannot be written.
        """
        grew = False
        for line in lines[self._projector.fed:]:
            public = self._projector.feed_line(line)
            if public is not None:
                self._tree.append([public])
                grew = True
        if grew:
            self._cosigned = {}
        try:
            folder = self._open()
            expected = self._projector.entries
            if folder.size < len(expected):
                folder.append(expected[folder.size:])
            published = folder.checkpoint()
            if published is not None and parse_checkpoint(parse_note(published)[0]).size == folder.size:
                return  # in step and signed
            checkpoint = folder.sign_checkpoint(self._signer)
            self._ask(checkpoint, best_effort=True)
            folder.publish_checkpoint(self._merge(checkpoint))
        except StoreError as exc:
            self._forget()
            refused = os_refusal(exc)
            if refused is not None:  # the operating system refused a write: not damage
                raise unwritable(self.path, refused) from None
            raise LedgerError(f"the public log {self.path} is not the projection of the ledger ({exc}); it was "
                              "changed or damaged -- the ledger is not used until it is restored") from None
        except OSError as exc:
            self._forget()
            raise unwritable(self.path, exc) from None

    def _forget(self) -> None:
        if self._folder is not None:
            self._folder.close()
            self._folder = None

    def _open(self) -> LogDirectory:
        """The log's folder, open; read again (recovered, compared in full with the projection)
        when first used and whenever another process wrote to it."""
        if self._folder is not None and not self._folder.changed():
            return self._folder
        self._forget()
        try:
            folder = LogDirectory.open(self.path)
        except StoreError as exc:
            if os_refusal(exc) is not None:
                raise  # its files cannot be opened for writing: nothing to recover (follow() says why)
            LogDirectory.recover(self.path)  # an interrupted append: cut or complete it
            folder = LogDirectory.open(self.path)
        try:
            expected = self._projector.entries
            have = folder.size
            if have > len(expected) or folder.entries != expected[:have]:
                index = next((i for i, (a, b) in enumerate(zip(folder.entries, expected)) if a != b), len(expected))
                raise LedgerError(
                    f"the public log {self.path} is not the projection of the ledger (its entry {index} "
                    f"differs, or it has {have} entries where the ledger projects {len(expected)}); "
                    "it was changed or belongs to another ledger -- the ledger is not used until this is resolved")
            if folder.stored_hashes() != self._stored_hashes(have):
                raise LedgerError(f"the public log's hashes in {self.path} are not those of its entries: remove the "
                                  "file `hashes` (it is made again from the entries on the ledger's next use)")
            self._read_published(folder)
        except BaseException:
            folder.close()
            raise
        self._folder = folder
        return folder

    def _stored_hashes(self, size: int) -> bytes:
        """The stored hashes of the projection's first ``size`` entries, as the hash file holds them."""
        from phsafe.tlog.merkle import stored_hash_count

        return b"".join(self._tree.store.read_hashes(range(stored_hash_count(size))))

    def _read_published(self, folder: LogDirectory) -> None:
        """What the published checkpoint says: signed by the log key, a tree head of the
        projection, and which witnesses cosigned which size."""
        message = folder.checkpoint()
        if message is None:
            return
        verifiers = [w.verifier for w in self._witnesses.witnesses] if self._witnesses else []
        try:
            verified = verify_checkpoint(message, self._signer_verifier(), witnesses=verifiers)
        except TlogError as exc:
            raise LedgerError(f"the public log's checkpoint in {self.path} does not verify with the log key ({exc})") \
                from None
        size = verified.checkpoint.size
        if size > self._tree.size or self._tree.root(size) != verified.checkpoint.root_hash:
            raise LedgerError(f"the public log's checkpoint in {self.path} is not a tree head of the ledger's "
                              "projection: it signs another history -- the ledger is not used until this is resolved")
        for name in verified.cosigners:
            self._witness_size[name] = max(self._witness_size.get(name, 0), size)
        if size == self._tree.size:
            self._cosigned = {s.name: s for s in verified.note.signatures if s.name in verified.cosigners}

    def _signer_verifier(self) -> Any:
        from phsafe.tlog.keys import verifier_from_key

        return verifier_from_key(self._binding["vkey"])

    # -- witnesses ----------------------------------------------------------------------------

    def _ask(self, checkpoint: bytes, *, best_effort: bool,
             skip: frozenset[str] = frozenset()) -> list[tuple[str, bool]]:
        """Ask the witnesses (but ``skip``) to cosign ``checkpoint``, all at once; their
        cosignatures are kept for the current tree. Returns the refusals: one line each, and
        whether the witness could not be reached at all (rather than refusing).

        A best-effort request (a new checkpoint published after an append) does not wait for a
        witness that could not be reached the last time: only the confirmations before and after
        a spend do, so one witness down costs its time-out once per spend, not once per entry."""
        size = self._tree.size
        asked = [c for c in self._clients if c.name not in skip and not (best_effort and c.name in self._unreached)]
        verifier = self._signer_verifier()

        def ask(client: HttpWitness) -> tuple[HttpWitness, Any]:
            client.start_round()  # one deadline for the whole request, a 409's second one included
            try:
                cosigned = request_cosignature(client, self._tree, checkpoint,
                                               old_size=min(self._witness_size.get(client.name, 0), size))
                return client, verify_checkpoint(cosigned, verifier, witnesses=[client.entry.verifier], quorum=1)
            except (WitnessRefusal, WitnessUnreachable) as error:
                return client, error
            except (SignatureError, MalformedError, ProofError) as error:
                return client, MalformedError("cosignature", f"it does not verify with the witness's key ({error})")

        if len(asked) > 1:
            with ThreadPoolExecutor(max_workers=len(asked)) as pool:
                answers = list(pool.map(ask, asked))
        else:
            answers = [ask(c) for c in asked]
        refusals: list[tuple[str, bool]] = []
        for client, answer in answers:
            if isinstance(answer, TlogError):
                if isinstance(answer, WitnessRefusal) and answer.status == 409 and answer.latest_size is not None:
                    self._witness_size[client.name] = answer.latest_size
                unreached = isinstance(answer, WitnessUnreachable)
                if unreached:
                    self._unreached.add(client.name)
                    self._unreached_at[client.name] = (size, describe_refusal(client.name, client.entry.url, answer,
                                                                              size))
                refusals.append((describe_refusal(client.name, client.entry.url, answer, size), unreached))
                continue
            self._unreached.discard(client.name)
            self._unreached_at.pop(client.name, None)
            self._witness_size[client.name] = size
            self._cosigned[client.name] = next(s for s in answer.note.signatures if s.name == client.name)
        if not best_effort:
            self.last_refusals = [text for text, _ in refusals]
        return refusals

    def _merge(self, checkpoint: bytes) -> bytes:
        """``checkpoint`` (signed by the log key) with the cosignatures kept for its tree."""
        text, signatures = parse_note(checkpoint)
        return format_note(text, [*signatures, *self._cosigned.values()])

    def confirm(self, lines: Sequence[bytes], *, fresh: bool = True) -> None:
        """The log in step and its checkpoint cosigned by the witness quorum; called by the
        ledger before (``fresh``: every witness is asked now) and after (the cosignatures of the
        tree that holds the new entries count) every entry that spends or lets spend.

        Raises:
            ForkRefused: Fewer than the quorum cosigned -- this ledger is not the history the
                witnesses know (a copy or a rolled-back ledger), or they cannot be reached.
        """
        self.follow(lines)
        if not self._clients:
            return
        if fresh:
            self._cosigned = {}
        quorum = self._witnesses.quorum if self._witnesses else 0
        refusals: list[tuple[str, bool]] = []
        if len(self._cosigned) < quorum:
            folder = self._open()
            checkpoint = folder.sign_checkpoint(self._signer)
            # After an entry (not fresh), a witness that did not answer for this very tree moments
            # ago -- when the entry's checkpoint was published -- is not asked again: one round,
            # one time-out (a frozen witness would otherwise cost two before the run stops).
            size = self._tree.size
            silent = {c.name: self._unreached_at[c.name][1] for c in self._clients
                      if not fresh and c.name not in self._cosigned and self._unreached_at.get(c.name, (-1,))[0] == size}
            refusals = [(text, True) for text in silent.values()]
            refusals += self._ask(checkpoint, best_effort=False, skip=frozenset(self._cosigned) | set(silent))
            self.last_refusals = [text for text, _ in refusals]
            if len(self._cosigned) >= quorum or self._cosigned:
                try:
                    folder.publish_checkpoint(self._merge(checkpoint))
                except (StoreError, OSError) as exc:
                    refused = exc if isinstance(exc, OSError) else os_refusal(exc)
                    if refused is not None:
                        raise unwritable(self.path, refused) from None
                    raise LedgerError(f"could not publish the public log's checkpoint in {self.path}: {exc}") from None
        got = len(self._cosigned)
        if got < quorum:
            unreachable = all(unreached for _, unreached in refusals)
            raise (WitnessesUnavailable if unreachable else ForkRefused)(
                f"refused: {got} of the {quorum} required witness cosignatures of the ledger's public log "
                f"({'; '.join(text for text, _ in refusals)}); nothing is spent without them -- a copied or rolled-back ledger cannot "
                "spend, and a run whose witnesses cannot be reached stops before its next spend")

    def cosigners(self) -> list[str]:
        """The witnesses whose cosignature of the current tree this process holds."""
        return sorted(self._cosigned)

    # -- release proofs -----------------------------------------------------------------------

    def release_files(self, run_id: str) -> dict[str, bytes]:
        """The two public files a release folder gets: its log entry's bytes and its tlog-proof
        against the published checkpoint."""
        folder = self._open()
        entries = self._projector.entries
        index = release_entry_index(entries, run_id)
        if index is None:
            raise LedgerError(f"the public log has no release entry of run {run_id}")
        proof = folder.proof(index)
        return {ENTRY_FILE: entries[index], PROOF_FILE: format_tlog_proof(proof)}
