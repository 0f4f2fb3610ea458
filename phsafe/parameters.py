"""The parameters of a private run, defined once -- and how each front end spells them.

:class:`PrivateRunParameters` is what an operator sets for one private run: where the inputs are,
where the release goes, the ledger, the dataset and its version, the cap, the keys, what to
validate, which run to resume, how to count. Each field says what it is once (its type, default
and description), and how each front end takes it:

* :class:`CommandLine` -- how ``phsafe private`` takes it (an argument, an option, a flag);
  :mod:`phsafe.cli._parameters` makes the command's options from these fields;
* :class:`OnFlows` -- how the Prefect flows take it: a flat, typed flow parameter (its name,
  its type in the flow's signature -- from which Prefect builds the parameter form the UI shows
  and that ``prefect deployment run --param name=value`` fills -- and its default);
  ``flows/sdhc.py`` makes the flows' signatures from these fields;
* :class:`InPython` -- how :func:`phsafe.run_private` takes it (a keyword argument).

The release sequence (:func:`phsafe.sequence.run_release`) takes the model itself: there is no
second description of a run's options. Refusals name a parameter as the operator's front end
spells it (:func:`option`: ``--lifetime-cap`` on the command line, ``the flow parameter
lifetime_cap`` in a flow, or what to do instead on a deployment without that parameter).

**One name per parameter.** A parameter the command line takes as an option has one name
everywhere else: the snake_case form of the option (:func:`name_of`) -- ``--new-version`` is the
flow parameter ``new_version`` and ``run_private(new_version=...)``; a negated flag names what it
turns off (``--no-validate``: ``validate``). Only the command line's positional arguments
(``CONFIG DATA OUT``) and the fields it does not take have names of their own. The flows' former
names (:data:`FORMER_FLOW_NAMES`: ``new_version_reason`` and the like) are refused in one line
naming the new one (:func:`refuse_former_names`), never taken as a second spelling.

A description may name another parameter as ``{name}`` (its field name): each front end writes
it as its operator types it (``--cap-reason`` on the command line, ``cap_reason`` in a flow).

This is a leaf module (it imports nothing of the package but :mod:`phsafe.sizes`), so that every
module that refuses something can name the option that fixes it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Iterable, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.fields import FieldInfo

from phsafe.sizes import parse_size

__all__ = ["PrivateRunParameters", "CommandLine", "OnFlows", "InPython", "NotOnFlows", "on_command_line",
           "on_flows", "in_python", "describe", "command_line_spelling", "flow_spelling", "flow_parameters",
           "exact_decimal", "Counting", "LifetimeCap", "PositiveCount", "MemorySize", "REQUIRED",
           "option", "front_end", "deployment_parameters", "name_of", "snake_case", "FORMER_FLOW_NAMES",
           "refuse_former_names"]

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

    @property
    def snake_case(self) -> str:
        """The option as a name in the flows and in Python (:func:`snake_case`)."""
        return snake_case(self.spelling, negated=self.kind == "negated_flag")


def snake_case(option: str, *, negated: bool = False) -> str:
    """``--new-version`` -> ``new_version``; a negated flag names what it turns off:
    ``--no-validate`` -> ``validate``."""
    name = option.lstrip("-").replace("-", "_")
    return name.removeprefix("no_") if negated else name


@dataclass(frozen=True)
class OnFlows:
    """How the Prefect flows take a parameter.

    Attributes:
        name: The flow parameter's name: leave it to :func:`name_of` (the snake_case form of the
            command-line option, else the field's name); only a field the command line does not
            take as an option may have another.
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
    elsewhere: str | None = None
    """What an operator does instead on a deployment that lacks this parameter (the release
    deployment has no ``lifetime_cap``: a cap is raised with ``phsafe ledger raise-cap``)."""


@dataclass(frozen=True)
class NotOnFlows:
    """A parameter no flow takes, and what a flow's operator does instead (for refusals)."""

    instead: str


@dataclass(frozen=True)
class InPython:
    """How :func:`phsafe.run_private` takes a parameter: a keyword argument of this name
    (default: :func:`name_of`; only a positional argument of the command line, ``OUT``, has
    another)."""

    name: str | None = None


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

    config: Annotated[Path, CommandLine(("config",), "existing", argument=True), OnFlows(annotation=str),
                      InPython()] = Field(
        description="The dataset's production `config.json` (its `\"dataset\"` names the dataset the run "
                    "spends against, unless {dataset} does).")
    data: Annotated[Path, CommandLine(("data",), "existing", argument=True), OnFlows(annotation=str),
                    InPython()] = Field(
        description="Folder with persons, units and geo (CSV, Parquet, or Parquet stored by state).")
    output: Annotated[Path | None, CommandLine(("output",), "path", argument=True), InPython("out"),
                      NotOnFlows("the flow parameter output_root (each run publishes to <output_root>/<run id>/)")] = Field(
        None, description="Where the release is published: a new folder (never overwritten).")
    output_root: Annotated[Path | None, OnFlows(annotation=str, default=REQUIRED)] = Field(
        None, description="Each run publishes its release to `<output_root>/<run id>/`.")
    ledger: Annotated[Path | None, CommandLine(("--ledger",), "path", envvar="PHSAFE_LEDGER"),
                      OnFlows(annotation=str, default=REQUIRED), InPython()] = Field(
        None, description="The dataset's audit ledger, made once by `phsafe ledger init` (a run never creates "
                          "one, except a throwaway one for non-confidential data).")
    dataset: Annotated[str | None, CommandLine(("--dataset",), metavar="NAME"),
                       OnFlows(elsewhere="the config's \"dataset\" key"), InPython()] = Field(
        None, description="The dataset this run spends against, e.g. cef2020-us (default: the config's "
                          "`\"dataset\"`).")
    new_version: Annotated[str | None, CommandLine(("--new-version",), metavar="REASON"),
                           OnFlows(), InPython()] = Field(
        None, description="Why these records are a new content version of the dataset (recorded); needed the "
                          "first time the dataset runs on records it has not seen.")
    re_release: Annotated[str | None, CommandLine(("--re-release",), metavar="REASON"),
                          OnFlows(), InPython()] = Field(
        None, description="Why records the dataset already released (or is releasing) are released again "
                          "(recorded; the lifetime cap still applies). Without it such a run is refused before "
                          "any spend.")
    overlap_reason: Annotated[str | None, CommandLine(("--overlap-reason",), metavar="REASON"), OnFlows(),
                              InPython()] = Field(
        None, description="Why records that overlap another dataset's (beyond 1%) are a version of this dataset "
                          "and not of that one, e.g. a disjoint population (recorded). Without it such a run is "
                          "refused before any spend.")
    signing_key: Annotated[Path | None, CommandLine(("--signing-key",), "existing_file", metavar="PEM"),
                           OnFlows(annotation=str | None), InPython()] = Field(
        None, description="Ed25519 private key (PEM) that signs the ledger checkpoints.")
    public_key: Annotated[Path | None, CommandLine(("--public-key",), "existing_file", metavar="PEM"),
                          OnFlows(annotation=str | None), InPython()] = Field(
        None, description="The operator's Ed25519 public key (PEM): the signing key must match it.")
    validate_inputs: Annotated[bool, CommandLine(
        ("--no-validate", "validate_inputs"), "negated_flag",
        help="Skip the full input suites (recorded in the ledger); the config and file checks still run."),
        OnFlows(elsewhere="the us or pr deployment's parameter validate=false"), InPython()] = Field(
        True, description="Validate the config and the inputs first (Great Expectations; recorded in the ledger).")
    validate_outputs: Annotated[bool, CommandLine(("-vo", "--validate-private-output", "validate_outputs"), "flag"),
                                OnFlows(default=True), InPython()] = Field(
        False, description="Validate the output tables before publishing them.")
    lifetime_cap: Annotated[Fraction | None, CommandLine(("--lifetime-cap",), metavar="RHO"),
                            OnFlows(annotation=LifetimeCap | None, elsewhere=(
                                "`phsafe ledger raise-cap LEDGER --dataset NAME --to CAP --reason TEXT` (in the "
                                "enclave; then Retry this flow run)")), InPython()] = Field(
        None, description="Raise the dataset's lifetime cap to this number (rho under zCDP, epsilon under pure "
                          "DP, e.g. 2.5); needs {cap_reason}; recorded.")
    cap_reason: Annotated[str | None, CommandLine(("--cap-reason",), metavar="TEXT"),
                          OnFlows(elsewhere="raise-cap's --reason"), InPython()] = Field(
        None, description="Why the cap is raised (recorded in the ledger).")
    resume_run_id: Annotated[str | None, CommandLine(("--resume", "resume_run_id"), metavar="RUN_ID",
                                                     note="; OUT may be a new folder"),
                             OnFlows(note=" (a Retry of the flow run that started it does the same by itself)",
                                     elsewhere="a Retry of this flow run"), InPython()] = Field(
        None, description="Complete this failed run: its committed measurements are reused, not drawn again; "
                          "the rest are new spends.")
    resume_reason: Annotated[str | None, CommandLine(("--resume-reason",), metavar="TEXT"),
                             OnFlows(elsewhere="the Retry (its reason is recorded for you)"), InPython()] = Field(
        None, description="Why the run is resumed (recorded in the ledger).")
    non_confidential: Annotated[bool, CommandLine(("--non-confidential",), "flag"), OnFlows(), InPython()] = Field(
        False, description="The data is synthetic or otherwise not confidential (Infinity budgets allowed, a "
                           "throwaway ledger).")
    work_dir: Annotated[Path | None, CommandLine(("--work-dir",), "path", metavar="DIR"),
                        OnFlows(annotation=str | None, elsewhere="the us or pr deployment's parameter work_dir"),
                        InPython()] = Field(
        None, description="Folder of the runs' confidential work folders (default: `runs/` beside the ledger).")
    truncation_key: Annotated[str | None, CommandLine(("--truncation-key",), metavar="HEX"), InPython(),
                              NotOnFlows("nothing: flows run on confidential data, whose truncation key is drawn "
                                         "fresh for every run")] = Field(
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
        None, description="With counting=dask, the persons of a MAFID range of national files (default 8M); "
                          "data stored by state is counted a state at a time.")
    memory_limit: Annotated[int | None, CommandLine(("--memory-limit",), "size", metavar="SIZE"),
                            OnFlows(annotation=MemorySize | None), InPython()] = Field(
        None, description="Memory the input pass may use, e.g. 8G or 512M (default: half of the machine's "
                          "memory). Inputs too large for it are spilled in MAFID ranges to the run's confidential "
                          "work folder; inputs that cannot fit are refused before anything is spent.")

    @field_validator("memory_limit", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        # Typed as text (``8G``) in a flow or in Python; the command line gives bytes already.
        return parse_size(value) if isinstance(value, str) else value

    @field_validator("lifetime_cap", mode="before")
    @classmethod
    def _exact_cap(cls, value: Any) -> Any:
        # A flow's number arrives as a float: read it as the decimal the operator typed.
        return exact_decimal(value) if isinstance(value, float) else value

    @classmethod
    def from_python(cls, arguments: dict[str, Any]) -> "PrivateRunParameters":
        """The parameters of a call of :func:`phsafe.run_private` (its keyword names)."""
        names = {spelling.name or name: name for name, spelling in in_python()}
        return cls(**{names[key]: value for key, value in arguments.items()})

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


def name_of(field: str) -> str:
    """The name of the parameter ``field`` in the flows and in Python: the snake_case form of its
    command-line option (``--new-version``: ``new_version``; ``--no-validate``: ``validate``),
    else the field's own name."""
    cli = _spelling(PrivateRunParameters.model_fields[field], CommandLine)
    return cli.snake_case if cli is not None and not cli.argument else field


def in_python() -> Iterator[tuple[str, InPython]]:
    """(field name, how :func:`phsafe.run_private` takes it, its ``name`` filled in), in the model's order."""
    for name, info in PrivateRunParameters.model_fields.items():
        spelling = _spelling(info, InPython)
        if spelling is not None:
            yield name, dataclasses.replace(spelling, name=spelling.name or name_of(name))


def on_flows() -> Iterator[tuple[str, OnFlows]]:
    """(field name, how the flows take it, its ``name`` filled in), in the model's order."""
    for name, info in PrivateRunParameters.model_fields.items():
        spelling = _spelling(info, OnFlows)
        if spelling is not None:
            yield name, dataclasses.replace(spelling, name=spelling.name or name_of(name))


FORMER_FLOW_NAMES: dict[str, str] = {
    "new_version_reason": "new_version",
    "re_release_reason": "re_release",
    "resume_run_id": "resume",
    "validate_inputs": "validate",
    "validate_outputs": "validate_private_output",
}
"""Flow parameters renamed to the command line's names (issue 36) -> their names now. A flow run
given one is refused in one line naming the new name (:func:`refuse_former_names`): an old
deployment's stored parameters or an old trigger never run with a setting silently dropped."""


def refuse_former_names(parameters: Iterable[str]) -> None:
    """Refuse a flow run's parameters that use a former name, in one line naming the new one.

    Raises:
        ValueError: ``renamed flow parameter(s): new_version_reason is now new_version (...)``.
    """
    given = [name for name in parameters if name in FORMER_FLOW_NAMES]
    if not given:
        return
    renames = "; ".join(f"{name} is now {FORMER_FLOW_NAMES[name]}" for name in given)
    raise ValueError(f"renamed flow parameter(s): {renames} (each flow parameter is named as phsafe private's "
                     "option): re-run the deploy step (deployments/deploy.py) for the deployments' own parameters, "
                     "and use the new name in the trigger. No privacy-loss budget was spent.")


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


# --------------------------------------------------------------------------------------------
# Naming a parameter in a refusal, as the operator's front end spells it
# --------------------------------------------------------------------------------------------
# A refusal says what to do ("raise the cap with --lifetime-cap ..."). The same library runs
# behind the command line and behind the Prefect flows, whose operators set flow parameters, not
# flags: messages name a parameter through :func:`option`, and each front end declares itself
# with :func:`front_end`.

_FRONT_END: contextvars.ContextVar[str] = contextvars.ContextVar("phsafe_front_end", default="cli")
_DEPLOYMENT: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("phsafe_flow_parameters",
                                                                                   default=None)


def option(name: str) -> str:
    """How the operator sets the parameter ``name`` (a field of :class:`PrivateRunParameters`) here:
    ``--lifetime-cap`` (the command line and Python), ``the flow parameter lifetime_cap`` (a flow
    that has it), or what to do instead (a deployment that has not)."""
    info = PrivateRunParameters.model_fields[name]
    if _FRONT_END.get() == "flow":
        flows, instead = _spelling(info, OnFlows), _spelling(info, NotOnFlows)
        if flows is None:
            return instead.instead if instead is not None else f"{name} (not a parameter of the flows)"
        parameter = flows.name or name_of(name)
        known = _DEPLOYMENT.get()
        if known is None or parameter in known:
            return f"the flow parameter {parameter}"
        return flows.elsewhere or f"{parameter} (not a parameter of this deployment)"
    cli = _spelling(info, CommandLine)
    return cli.spelling if cli is not None else name


def deployment_parameters() -> frozenset[str] | None:
    """The parameters of the deployment whose run this is (None: unknown, or not a flow)."""
    return _DEPLOYMENT.get() if _FRONT_END.get() == "flow" else None


@contextlib.contextmanager
def front_end(kind: str, parameters: frozenset[str] | None = None) -> Iterator[None]:
    """Name parameters as ``kind`` (``cli`` or ``flow``) spells them inside the ``with`` block.

    Args:
        parameters: For a flow, the parameters its operator can set: a parameter the deployment
            lacks is named by what to do instead (:attr:`OnFlows.elsewhere`).
    """
    if kind not in ("cli", "flow"):
        raise ValueError(kind)
    token = _FRONT_END.set(kind)
    known = _DEPLOYMENT.set(parameters if kind == "flow" else None)
    try:
        yield
    finally:
        _DEPLOYMENT.reset(known)
        _FRONT_END.reset(token)
