"""Every error this package raises on purpose, in one place, with messages that are safe to log.

Every error raised on the data path names *where* the problem is (file, column, config key) and
*which rule* failed, and never carries a raw value of a confidential record. A front end reports
any :class:`PHSafeError` as one line (the command line exits 1; a flow run ends Failed with it).

    PHSafeError                       base class
    ├── ConfigError                   the config breaks a rule of spec §2
    ├── InputError                    an input file breaks a rule of spec §1 or §4
    ├── ValidationFailed              the inputs or the outputs failed their validation suites
    │                                 (a verdict on the data: the report says which rules broke)
    ├── ValidationMachineryError      validation could not run to the end: a defect of the
    │                                 validation machinery, never a verdict on the data
    ├── OutputExistsError             the output folder exists (a release is never overwritten)
    ├── BudgetError                   a spend the lifetime cap, the plan or the run refuses
    │   ├── AlreadyReleasedError      the records were released (or are being released) already
    │   └── ForkRefused               the public log's witnesses refuse the ledger (a copy)
    │       └── WitnessesUnavailable  ... or too few of them can be reached
    ├── LedgerError                   the ledger is broken, unusable, or asked to record
    │   │                             something inconsistent
    │   └── TornTailError             the ledger ends in an interrupted write
    ├── PrivacyMapMismatchError       OpenDP's privacy map disagrees with a planned budget
    ├── PlanningError                 the planner's targets, tau or options are invalid
    ├── ReleaseError                  a release folder cannot be read as asked
    ├── VerificationFailure           the auditor's check: the ledger, a checkpoint or an output
    │                                 does not hold up
    ├── PostprocessError              a release cannot be post-processed
    │   └── EstimateChecksFailed      a check of the estimate files failed (a defect of
    │                                 the post-processing: nothing was published)
    ├── ConfidentialityNotConfirmed   the accuracy experiment needs the data declared
    │                                 non-confidential
    ├── ReportFolderExists            a report folder already holds files
    └── TlogError                     the transparency log (:mod:`phsafe.tlog`)
        ├── MalformedError            bytes that are not the documented format (note,
        │                             checkpoint, key, proof file, witness request, published
        │                             log, store file)
        ├── SignatureError            a note lacks a valid signature by a trusted key, or too
        │                             few witnesses cosigned
        ├── ProofError                an inclusion or consistency proof does not verify (or
        │                             cannot be made)
        ├── ForkError                 two signed checkpoints of one log that cannot both be true
        │   ├── RollbackError         a smaller checkpoint after a larger one was seen
        │   └── EquivocationError     ... proved: the log's key signed two histories (evidence)
        ├── QuorumPolicyError         a witness policy whose quorums need not intersect
        ├── WitnessRefusal            a witness declines to cosign (status as in C2SP
        │                             tlog-witness)
        ├── WitnessUnreachable        a witness cannot be asked (connection, time-out)
        └── StoreError                a hash store, state store or key file is unusable
            └── StaleStateError       a compare-and-swap of a checkpoint store lost a race

:class:`LedgerRuleViolation` is not a :class:`PHSafeError`: it never leaves :mod:`phsafe.ledger`,
whose replay turns it into a :class:`LedgerError` naming the entry.

The modules that raise these errors re-export the ones their callers know them by
(``phsafe.release.ReleaseError``, ``phsafe.tlog.TlogError``, ...).
"""

from __future__ import annotations

import errno


class PHSafeError(Exception):
    """Base class of every error this package raises on purpose."""


# --------------------------------------------------------------------------------------------
# Config and inputs
# --------------------------------------------------------------------------------------------


class ConfigError(PHSafeError):
    """The configuration violates a rule of spec §2.

    Args:
        key: Dotted path of the offending key, e.g. ``privacy_budget.PH2.usa_*``.
        rule: The rule in plain words.
        file: Name of the config file, when the config was read from one.
    """

    def __init__(self, key: str, rule: str, *, file: str | None = None) -> None:
        self.key = key
        self.rule = rule
        self.file = file
        where = f"{file}: " if file else ""
        super().__init__(f"{where}config key '{key}': {rule}")

    def __reduce__(self) -> tuple:
        # Pickled with its fields (a worker process gets the run's config read, errors included).
        return (_config_error, (self.key, self.rule, self.file))


def _config_error(key: str, rule: str, file: str | None) -> "ConfigError":
    return ConfigError(key, rule, file=file)


class InputError(PHSafeError):
    """An input file violates a rule of spec §1 or §4.

    Args:
        file: File name, e.g. ``persons.csv``.
        column: Column or comma-separated columns involved (``""`` for file-level rules).
        rule: The rule in plain words.
        rows: Number of offending rows, when known. Never the rows themselves.
    """

    def __init__(self, file: str, column: str, rule: str, rows: int | None = None) -> None:
        self.file = file
        self.column = column
        self.rule = rule
        self.rows = rows
        where = f"{file}" + (f", column {column}" if column else "")
        count = f" ({rows} row{'s' if rows != 1 else ''})" if rows is not None else ""
        super().__init__(f"{where}: {rule}{count}")


class ValidationFailed(PHSafeError):
    """Input or output validation found problems; the report says which.

    A verdict on the data (compare :class:`ValidationMachineryError`): a run stops before any
    spend on failed inputs, and before publishing on failed outputs.

    Attributes:
        subject: ``input`` or ``output``.
        report: The validation report (value-free; its failing-row counts are confidential).
        report_text: The text of the message after its first line.
    """

    def __init__(self, what: str, report_text: str, report: object | None = None) -> None:
        self.subject = what
        self.report = report
        self.report_text = report_text
        super().__init__(f"{what} validation failed:\n{report_text}")


class ValidationMachineryError(PHSafeError):
    """Validation could not run to the end: a defect of the validation machinery (an exception
    inside Great Expectations or the suites), never a verdict on the data -- broken rules are
    :class:`ValidationFailed` (and the report's failures).

    Its message names the stage and the exception class only: the original exception, whose
    message may quote a value of the data, is not chained.
    """


# --------------------------------------------------------------------------------------------
# Runs, budgets and the ledger
# --------------------------------------------------------------------------------------------


class OutputExistsError(PHSafeError):
    """The output directory already exists; a run never overwrites a publication."""


class BudgetError(PHSafeError):
    """A run would spend more privacy-loss budget than it is allowed to."""


class AlreadyReleasedError(BudgetError):
    """The records are a content version that another run released (or is releasing): a
    content version is released once unless a re-release is declared with a reason."""


class LedgerError(PHSafeError):
    """The ledger is malformed, broken, or was asked to record something inconsistent.

    Args:
        message: What failed, in plain words.
        seq: Index of the first failing entry (line), when the failure is about one.
        kind: That entry's kind, when known.
        violation: The rule the entry broke, when a rule refused it: the ledger's front ends
            (:mod:`phsafe.ledger.runs`) turn it into the operator's message.
    """

    def __init__(self, message: str, *, seq: int | None = None, kind: str | None = None,
                 violation: "LedgerRuleViolation | None" = None) -> None:
        self.seq = seq
        self.kind = kind
        self.reason = message
        self.violation = violation
        where = ""
        if seq is not None:
            where = f"entry {seq}" + (f" ({kind})" if kind else "") + ": "
        super().__init__(where + message)


class TornTailError(LedgerError):
    """The ledger ends in an incomplete line: an interrupted write. ``phsafe ledger repair``."""


class LedgerRuleViolation(Exception):
    """A rule of the ledger failed for the entry being checked.

    Internal to :mod:`phsafe.ledger`: the replay turns it into a :class:`LedgerError` that names
    the entry (its sequence number and kind), so it is deliberately not a :class:`PHSafeError`.

    Args:
        message: The rule, in plain words (what ``audit verify`` prints).
        rule: A short name of the rule, for the rules a front end explains in its own words.
        facts: What the front end needs for that (amounts, a run id, a dataset).
    """

    def __init__(self, message: str, *, rule: str | None = None, **facts: object) -> None:
        super().__init__(message)
        self.rule = rule
        self.facts = facts


class PrivacyMapMismatchError(PHSafeError):
    """OpenDP's privacy map disagrees with the planned budget of a measurement."""


class PlanningError(PHSafeError):
    """The planner's input (targets file, tau, options) is invalid."""


# --------------------------------------------------------------------------------------------
# Releases, audits and reports
# --------------------------------------------------------------------------------------------


class ReleaseError(PHSafeError):
    """An output folder cannot be read as asked (missing, modified, or of the other kind)."""


class VerificationFailure(PHSafeError):
    """The ledger, a checkpoint or an output does not hold up.

    Args:
        where: The first failing entry (``entry 12 (INTENT)``) or file.
        reason: Why, in plain words.
        finding: For the public log's checks, the class of what was found (``rollback``,
            ``quorum``, ``over-cap`` ...: :data:`phsafe.audit.monitor.FINDINGS`); None otherwise.
        evidence: The bytes of evidence of equivocation that proves it, when there is one
            (``finding == "equivocation"``).
    """

    def __init__(self, where: str, reason: str, *, finding: str | None = None, evidence: bytes | None = None) -> None:
        self.where = where
        self.reason = reason
        self.finding = finding
        self.evidence = evidence
        super().__init__(f"{where}: {reason}")


class PostprocessError(PHSafeError):
    """The output directory cannot be post-processed (missing, not private, corrupt)."""


class EstimateChecksFailed(PostprocessError):
    """A check of the estimate files failed: a defect of this code; nothing was published."""


class ConfidentialityNotConfirmed(PHSafeError):
    """The accuracy experiment needs an explicit statement that the data is not confidential."""


class ReportFolderExists(PHSafeError):
    """A report command was pointed at a folder that already holds files."""


# --------------------------------------------------------------------------------------------
# The transparency log (phsafe.tlog)
# --------------------------------------------------------------------------------------------
# Messages are one line, say what was checked and what failed, and carry only public facts
# (sizes, indexes, key names, origins, hashes of public entries) -- never an entry's bytes,
# which a caller may not want echoed.


class TlogError(PHSafeError):
    """Base class of the transparency log's errors."""


class MalformedError(TlogError):
    """Bytes that are not the documented format.

    Args:
        what: What was being read, e.g. ``"checkpoint"``, ``"signed note"``, ``"tlog-proof"``.
        rule: The rule that failed, in plain words.
    """

    def __init__(self, what: str, rule: str) -> None:
        self.what = what
        self.rule = rule
        super().__init__(f"malformed {what}: {rule}")


class SignatureError(TlogError):
    """A note is not validly signed by the keys it must be signed by."""


class ProofError(TlogError):
    """An inclusion or consistency proof does not verify, or cannot be made."""


class ForkError(TlogError):
    """Two checkpoints signed by one log's key that no append-only log can both have produced.

    Both notes are kept as evidence: published side by side, they prove the log misbehaved.

    Args:
        message: What was found, in one line.
        first: The earlier-seen signed checkpoint (note bytes).
        second: The newly seen signed checkpoint (note bytes).
    """

    def __init__(self, message: str, *, first: bytes, second: bytes) -> None:
        self.first = first
        self.second = second
        super().__init__(message)


class WitnessRefusal(TlogError):
    """A witness declined to cosign a checkpoint.

    ``status`` is the HTTP status the C2SP tlog-witness protocol assigns to the refusal, so a
    network front end can answer with it unchanged: 400 (bad request, e.g. old size larger than
    the checkpoint's), 403 (not signed by the log's key), 404 (unknown log), 409 (the old size is
    not the size the witness last cosigned; ``latest_size`` then says which it is), 422 (the
    consistency proof does not verify, or the same size came with another root hash).
    """

    def __init__(self, status: int, message: str, *, latest_size: int | None = None) -> None:
        self.status = status
        self.latest_size = latest_size
        super().__init__(message)


class StoreError(TlogError):
    """A store (hash file, checkpoint state, key file, log directory) is unusable as found."""


class StaleStateError(StoreError):
    """A checkpoint store's compare-and-swap found another value than the one expected."""


class WitnessUnreachable(TlogError):
    """A witness could not be asked (no connection, no answer in time, not the protocol's answer)."""


class RollbackError(ForkError):
    """A log shows a smaller checkpoint than one seen before: an older view, or a smaller fork."""


class EquivocationError(ForkError):
    """Proof that a log's key signed two histories: ``evidence`` (a
    :class:`phsafe.tlog.evidence.Evidence`) verifies by itself, with the log's key alone."""

    def __init__(self, message: str, *, first: bytes, second: bytes, evidence: object) -> None:
        super().__init__(message, first=first, second=second)
        self.evidence = evidence


class QuorumPolicyError(TlogError):
    """A witness policy refused: its quorums need not intersect (K <= N/2 of N witnesses), it
    cannot be met, or it counts one witness twice."""


class ForkRefused(BudgetError):
    """The ledger's witnesses refuse its public log: it is not the history they cosigned.

    A copy of the ledger made earlier, or a rolled-back one, cannot spend: nothing was spent
    from it. Raised before a run's first INTENT (and before every later one).
    """


class WitnessesUnavailable(ForkRefused):
    """Too few of the ledger's witnesses could be reached to cosign (none refused the ledger):
    the run stops before its next spend, and resumes once they answer."""


# --------------------------------------------------------------------------------------------
# Operating-system errors in plain words
# --------------------------------------------------------------------------------------------


def cause_in_words(exc: BaseException) -> str:
    """Why ``exc`` happened, in words and without its message (which may quote a value).

    An operating-system error by :func:`os_reason` (``file too large (EFBIG)``), running out of
    memory as such; anything else is a defect, named as one with its type.
    """
    if isinstance(exc, OSError):
        return os_reason(exc) if exc.errno is not None or exc.strerror else "an operating-system error without a code"
    if isinstance(exc, MemoryError):
        return "out of memory"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, UnicodeEncodeError):
        return "not ASCII text"
    if type(exc).__name__ == "JSONDecodeError":
        return "not valid JSON"
    if type(exc).__name__ == "Error" and type(exc).__module__ == "binascii":
        return "not valid base64"
    if type(exc).__name__ in ("ArrowInvalid", "ArrowIOError"):
        return "not a valid Parquet file"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by the operator"
    return f"an internal error ({type(exc).__name__})"


def os_reason(exc: OSError) -> str:
    """An OSError in plain words, with its errno name (e.g. ``no space left on device (ENOSPC)``).

    Never the file name or the message of the exception beyond the operating system's own text:
    callers say which file they were using.
    """
    name = errno.errorcode.get(exc.errno or 0)
    text = (exc.strerror or type(exc).__name__).lower()
    return f"{text} ({name})" if name else text
