"""The parameters of a private run, defined once.

:class:`PrivateRunParameters` is what an operator sets for one private run: where the inputs are,
where the release goes, the ledger, the dataset and its version, the cap, the keys, what to
validate, which run to resume, how to count. Each field says what it is once (its type, default
and description), and how each front end spells it:

* :class:`CommandLine` -- how ``phsafe private`` takes it (an argument, an option, a flag);
  :mod:`phsafe.cli.private` makes its options from these fields;
* :class:`OnFlows` -- how the Prefect flows take it: a flat, typed flow parameter (its name,
  its type in the flow's signature -- from which Prefect builds the parameter form the UI shows
  and that ``prefect deployment run --param name=value`` fills -- and its default);
  ``flows/sdhc.py`` makes the flows' signatures from these fields.

The engine takes :meth:`PrivateRunParameters.options` (a :class:`~phsafe.engine.PrivateRunOptions`)
and the sequence a :class:`~phsafe.sequence.ReleaseJob` built from the rest.

A description may name another parameter as ``{name}`` (its field name): each front end writes
it as its operator types it (``--cap-reason`` on the command line, ``cap_reason`` in a flow).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.fields import FieldInfo

if TYPE_CHECKING:
    from phsafe.private_run import PrivateRunOptions

__all__ = ["PrivateRunParameters", "CommandLine", "OnFlows", "on_command_line", "on_flows", "describe",
           "command_line_spelling", "flow_spelling", "flow_parameters", "exact_decimal", "Counting", "LifetimeCap",
           "PositiveCount", "MemorySize", "REQUIRED"]

_SAME = object()


@dataclass(frozen=True)
class CommandLine:
    """How ``phsafe private`` takes a parameter.

    Attributes:
        decls: Click's declarations: ``("config",)`` for an argument, the flags of an option
            (``("--new-version",)``, ``("-vo", "--validate-private-output")``).
        kind: ``text``; ``path`` (any path), ``existing`` (an existing file or folder),
            ``existing_file``; ``size`` (bytes, typed as ``8G``); ``flag`` (a switch that sets the parameter to True), or
            ``negated_flag`` (a switch that sets it to False, e.g. ``--no-validate``).
        argument: A positional argument rather than an option.
        metavar: How the help shows its value (``REASON``, ``PEM``).
        envvar: An environment variable that gives the value when the option is absent.
        help: The option's help when it must differ from the description (a negated flag).
        note: Added to the description in the option's help (what only the command line does).
    """

    decls: tuple[str, ...]
    kind: Literal["text", "path", "existing", "existing_file", "size", "flag", "negated_flag"] = "text"
    argument: bool = False
    metavar: str | None = None
    envvar: str | None = None
    help: str | None = None
    note: str = ""

    @property
    def spelling(self) -> str:
        """How an operator types it: ``--new-version``, or ``OUT`` for an argument."""
        if self.argument:
            return self.decls[0].upper() if self.decls[0] != "output" else "OUT"
        return max((d for d in self.decls if d.startswith("--")), key=len, default=self.decls[0])


@dataclass(frozen=True)
class OnFlows:
    """How the Prefect flows take a parameter.

    Attributes:
        name: The flow parameter's name (default: the field's).
        annotation: Its type in the flow's signature (default: the field's; ``str`` for paths,
            which operators type as text).
        default: Its default (default: the field's; :data:`inspect.Parameter.empty` makes it
            required).
        note: Added to the description in the flows (what only the flows do).
    """

    name: str | None = None
    annotation: Any = _SAME
    default: Any = _SAME
    note: str = ""


# The types of the flow parameters as operators type them in the UI or with ``--param``: numbers
# are JSON numbers (``--param lifetime_cap=2.5``), choices are a list to pick from.
Counting = Literal["local", "dask"]
"""``local``: count in the flow's process; ``dask``: per-partition tasks on a Dask cluster."""
LifetimeCap = Annotated[float, Field(ge=0, description="the dataset's new lifetime privacy-loss cap "
                                                       "(rho under zCDP, epsilon under pure DP)")]
PositiveCount = Annotated[int, Field(ge=1)]
MemorySize = Annotated[str, Field(pattern=r"^\s*0*[1-9]\d*(\.\d+)?\s*[kKmMgGtT]?(i?[bB])?\s*$",
                                  description="a size such as 8G, 512M or 12.5GiB (binary units)")]
"""A memory size as operators type it in a flow (the pattern refuses what is not a positive size)."""
REQUIRED = inspect.Parameter.empty


def exact_decimal(value: float | None) -> Fraction | None:
    """A number typed as a decimal, exactly: ``2.514562`` is 2514562/1000000, not the binary
    float nearest to it (the shortest decimal that reads back as the float)."""
    if value is None:
        return None
    return Fraction(Decimal(repr(float(value))))


class PrivateRunParameters(BaseModel):
    """Everything an operator sets for one private run (see the module docstring).

    The fields are in the order the flows show them. Paths typed as text become paths.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: Annotated[Path, CommandLine(("config",), "existing", argument=True), OnFlows(annotation=str)] = Field(
        description="The dataset's production `config.json` (its `\"dataset\"` names the dataset the run "
                    "spends against, unless {dataset} does).")
    data: Annotated[Path, CommandLine(("data",), "existing", argument=True), OnFlows(annotation=str)] = Field(
        description="Folder with persons, units and geo (CSV, Parquet, or Parquet stored by state).")
    output: Annotated[Path | None, CommandLine(("output",), "path", argument=True)] = Field(
        None, description="Where the release is published: a new folder (never overwritten).")
    output_root: Annotated[Path | None, OnFlows(annotation=str, default=REQUIRED)] = Field(
        None, description="Each run publishes its release to `<output_root>/<run id>/`.")
    ledger: Annotated[Path | None, CommandLine(("--ledger",), "path", envvar="PHSAFE_LEDGER"),
                      OnFlows(annotation=str, default=REQUIRED)] = Field(
        None, description="The dataset's audit ledger, made once by `phsafe ledger init` (a run never creates "
                          "one, except a throwaway one for non-confidential data).")
    dataset: Annotated[str | None, CommandLine(("--dataset",), metavar="NAME"), OnFlows()] = Field(
        None, description="The dataset this run spends against, e.g. cef2020-us (default: the config's "
                          "`\"dataset\"`).")
    new_version: Annotated[str | None, CommandLine(("--new-version",), metavar="REASON"),
                           OnFlows(name="new_version_reason")] = Field(
        None, description="Why these records are a new content version of the dataset (recorded); needed the "
                          "first time the dataset runs on records it has not seen.")
    re_release: Annotated[str | None, CommandLine(("--re-release",), metavar="REASON"),
                          OnFlows(name="re_release_reason")] = Field(
        None, description="Why records the dataset already released (or is releasing) are released again "
                          "(recorded; the lifetime cap still applies). Without it such a run is refused before "
                          "any spend.")
    overlap_reason: Annotated[str | None, CommandLine(("--overlap-reason",), metavar="REASON"), OnFlows()] = Field(
        None, description="Why records that overlap another dataset's (beyond 1%) are a version of this dataset "
                          "and not of that one, e.g. a disjoint population (recorded). Without it such a run is "
                          "refused before any spend.")
    signing_key: Annotated[Path | None, CommandLine(("--signing-key",), "existing_file", metavar="PEM"),
                           OnFlows(annotation=str | None)] = Field(
        None, description="Ed25519 private key (PEM) that signs the ledger checkpoints.")
    public_key: Annotated[Path | None, CommandLine(("--public-key",), "existing_file", metavar="PEM"),
                          OnFlows(annotation=str | None)] = Field(
        None, description="The operator's Ed25519 public key (PEM): the signing key must match it.")
    validate_inputs: Annotated[bool, CommandLine(
        ("--no-validate", "validate_inputs"), "negated_flag",
        help="Skip the full input suites (recorded in the ledger); the config and file checks still run."),
        OnFlows()] = Field(
        True, description="Validate the config and the inputs first (Great Expectations; recorded in the ledger).")
    validate_outputs: Annotated[bool, CommandLine(("-vo", "--validate-private-output", "validate_outputs"), "flag"),
                                OnFlows(default=True)] = Field(
        False, description="Validate the output tables before publishing them.")
    lifetime_cap: Annotated[Fraction | None, CommandLine(("--lifetime-cap",), metavar="RHO"),
                            OnFlows(annotation=LifetimeCap | None)] = Field(
        None, description="Raise the dataset's lifetime cap to this number (rho under zCDP, epsilon under pure "
                          "DP, e.g. 2.5); needs {cap_reason}; recorded.")
    cap_reason: Annotated[str | None, CommandLine(("--cap-reason",), metavar="TEXT"), OnFlows()] = Field(
        None, description="Why the cap is raised (recorded in the ledger).")
    resume_run_id: Annotated[str | None, CommandLine(("--resume", "resume_run_id"), metavar="RUN_ID",
                                                     note="; OUT may be a new folder"),
                             OnFlows(note=" (a Retry of the flow run that started it does the same by itself)")] = Field(
        None, description="Complete this failed run: its committed measurements are reused, not drawn again; "
                          "the rest are new spends.")
    resume_reason: Annotated[str | None, CommandLine(("--resume-reason",), metavar="TEXT"), OnFlows()] = Field(
        None, description="Why the run is resumed (recorded in the ledger).")
    non_confidential: Annotated[bool, CommandLine(("--non-confidential",), "flag"), OnFlows()] = Field(
        False, description="The data is synthetic or otherwise not confidential (Infinity budgets allowed, a "
                           "throwaway ledger).")
    work_dir: Annotated[Path | None, CommandLine(("--work-dir",), "path", metavar="DIR"),
                        OnFlows(annotation=str | None)] = Field(
        None, description="Folder of the runs' confidential work folders (default: `runs/` beside the ledger).")
    truncation_key: Annotated[str | None, CommandLine(("--truncation-key",), metavar="HEX")] = Field(
        None, description="Replay a run with this truncation key (hex) -- non-confidential data only.")
    log_file: Annotated[Path | None, OnFlows(annotation=str | None)] = Field(
        None, description="JSON-lines log file (default: `phsafe-log.jsonl` beside the ledger; confidential).")
    counting: Annotated[Counting, OnFlows()] = Field(
        "local", description="`local` (in this process) or `dask` (per-partition tasks on a Dask cluster; "
                             "validation, plan, ledger and noise stay here).")
    dask_address: Annotated[str | None, OnFlows()] = Field(
        None, description="Scheduler address of an existing Dask cluster (default: a LocalCluster).")
    dask_workers: Annotated[int | None, OnFlows(annotation=PositiveCount | None)] = Field(
        None, description="Workers of the LocalCluster (default 2).")
    partition_persons: Annotated[int | None, OnFlows(annotation=PositiveCount | None)] = Field(
        None, description="Cut partitions larger than this many persons into MAFID ranges.")
    memory_limit: Annotated[int | None, CommandLine(("--memory-limit",), "size", metavar="SIZE"),
                            OnFlows(annotation=MemorySize | None)] = Field(
        None, description="Memory the input pass may use, e.g. 8G or 512M (default: half of the machine's "
                          "memory). Inputs too large for it are spilled in MAFID ranges to the run's confidential "
                          "work folder; inputs that cannot fit are refused before anything is spent.")

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        # Typed as text (``8G``) in a flow; the command line gives bytes already.
        from phsafe.memory import parse_size

        return parse_size(value) if isinstance(value, str) else value

    @field_validator("lifetime_cap", mode="before")
    @classmethod
    def _exact_cap(cls, value: Any) -> Any:
        # A flow's number arrives as a float: read it as the decimal the operator typed.
        return exact_decimal(value) if isinstance(value, float) else value

    def options(self) -> "PrivateRunOptions":
        """The engine's options of this run (its fields of the same names)."""
        from phsafe.private_run import PrivateRunOptions

        return PrivateRunOptions(**{f.name: getattr(self, f.name) for f in fields(PrivateRunOptions)
                                    if f.name in type(self).model_fields})

    @classmethod
    def from_flow(cls, parameters: dict[str, Any]) -> "PrivateRunParameters":
        """The parameters of a flow run (flow parameter names, as :func:`flow_parameters` makes them)."""
        names = {spelling.name or name: name for name, spelling in on_flows()}
        return cls(**{names[key]: value for key, value in parameters.items()})


def _spelling(info: FieldInfo, kind: type) -> Any:
    return next((m for m in info.metadata if isinstance(m, kind)), None)


def on_command_line() -> Iterator[tuple[str, CommandLine]]:
    """(field name, how ``phsafe private`` takes it), in the model's order."""
    for name, info in PrivateRunParameters.model_fields.items():
        spelling = _spelling(info, CommandLine)
        if spelling is not None:
            yield name, spelling


def on_flows() -> Iterator[tuple[str, OnFlows]]:
    """(field name, how the flows take it), in the model's order."""
    for name, info in PrivateRunParameters.model_fields.items():
        spelling = _spelling(info, OnFlows)
        if spelling is not None:
            yield name, spelling


def describe(name: str, spell: dict[str, str], note: str = "") -> str:
    """The description of field ``name``, with a front end's ``note`` before its full stop, naming
    other parameters as ``spell`` spells them."""
    text = (PrivateRunParameters.model_fields[name].description or "").format_map(spell)
    return text.removesuffix(".") + note + "." if note else text


def flow_parameters(*, only: tuple[str, ...] | None = None, prefix: str = "") -> list[inspect.Parameter]:
    """The flow parameters the fields make: keyword-only, typed and defaulted as the flows take them.

    Args:
        only: Just these fields (default: every field the flows take).
        prefix: Put before each name (``us_`` for the release flow's per-dataset parameters).
    """
    out = []
    for name, spelling in on_flows():
        if only is not None and name not in only:
            continue
        info = PrivateRunParameters.model_fields[name]
        annotation = info.annotation if spelling.annotation is _SAME else spelling.annotation
        if spelling.default is not _SAME:
            default = spelling.default
        else:
            default = REQUIRED if info.is_required() else info.get_default()
        out.append(inspect.Parameter(prefix + (spelling.name or name), inspect.Parameter.KEYWORD_ONLY,
                                     default=default, annotation=annotation))
    return out


def flow_spelling() -> dict[str, str]:
    """Field name -> its flow parameter's name (for ``{name}`` in descriptions)."""
    return {name: name for name in PrivateRunParameters.model_fields} | {
        name: spelling.name or name for name, spelling in on_flows()}


def command_line_spelling() -> dict[str, str]:
    """Field name -> how ``phsafe private`` spells it (for ``{name}`` in descriptions)."""
    return {name: spelling.spelling for name, spelling in on_command_line()} | {
        name: name for name in PrivateRunParameters.model_fields if _spelling(
            PrivateRunParameters.model_fields[name], CommandLine) is None}
