"""The parameters of a private run are defined once (:class:`phsafe.parameters.PrivateRunParameters`),
and every front end is made from that definition: the command line's options, the flows'
parameters, the Python API's keyword arguments, and the names refusals give them
(:func:`phsafe.parameters.option`). Each test fails when a field exists in one and not the others."""

from __future__ import annotations

import inspect
from fractions import Fraction
from pathlib import Path

import click
import pytest

import phsafe
from phsafe.cli.private import private
from phsafe.parameters import (
    FORMER_FLOW_NAMES,
    CommandLine,
    InPython,
    NotOnFlows,
    OnFlows,
    PrivateRunParameters,
    command_line_spelling,
    flow_parameters,
    front_end,
    in_python,
    name_of,
    on_command_line,
    on_flows,
    option,
    refuse_former_names,
    snake_case,
)


def _spelled(name: str, kind: type) -> bool:
    return any(isinstance(m, kind) for m in PrivateRunParameters.model_fields[name].metadata)


def test_every_field_has_a_front_end() -> None:
    for name in PrivateRunParameters.model_fields:
        assert _spelled(name, CommandLine) or _spelled(name, OnFlows) or _spelled(name, InPython), name
        # A field no flow takes says what a flow's operator does instead (refusals name it).
        assert _spelled(name, OnFlows) or _spelled(name, NotOnFlows) or not _spelled(name, CommandLine), name


def test_the_command_line_options_are_the_models() -> None:
    params = {p.name: p for p in private.params}
    for name, spelling in on_command_line():
        assert name in params, name
        if not spelling.argument:
            assert set(spelling.decls) - {name} <= set(params[name].opts), name
    # what the command adds of its own: the production release's -v, quiet/verbose (its --log is the
    # log_file field, spelled as every command spells it)
    assert set(params) - set(PrivateRunParameters.model_fields) == {"validate_flag", "quiet", "verbose"}
    assert {n for n in params if n in PrivateRunParameters.model_fields} == {n for n, _ in on_command_line()} | {
        "log_file"}
    ledger = params["ledger"]
    assert isinstance(ledger, click.Option) and ledger.envvar == "PHSAFE_LEDGER"
    assert "--cap-reason" in (params["lifetime_cap"].help or "")  # other options named as typed


def test_the_flow_parameters_are_the_models() -> None:
    names = [p.name for p in flow_parameters()]
    assert names == [spelling.name or name for name, spelling in on_flows()]
    assert "new_version" in names and "new_version_reason" not in names and "truncation_key" not in names


def test_each_parameter_has_one_name_the_command_line_option_in_snake_case() -> None:
    """A flow parameter, and a keyword of phsafe.run_private, is the snake_case form of the
    command line's option (``--new-version``: ``new_version``; the negated ``--no-validate``:
    ``validate``); only the command line's positional arguments and the fields it does not take
    are named otherwise."""
    python = dict(in_python())
    for name, flows in on_flows():
        cli = dict(on_command_line()).get(name)
        expected = cli.snake_case if cli is not None and not cli.argument else name
        assert flows.name == expected, f"the flow parameter {flows.name} is {cli.spelling if cli else name} ({expected})"
        if name in python:
            assert python[name].name == expected, f"run_private's {python[name].name} is {expected}"
    for name, cli in on_command_line():
        if not cli.argument:
            assert name_of(name) == cli.snake_case, name
    assert snake_case("--new-version") == "new_version" and snake_case("--no-validate", negated=True) == "validate"
    assert {name_of(f) for f in ("new_version", "re_release", "resume_run_id", "validate_inputs",
                                 "validate_outputs")} == {"new_version", "re_release", "resume", "validate",
                                                          "validate_private_output"}
    # The command line's own -v/--validate is the same parameter as --no-validate (the production release's flag).
    assert {"-v", "--validate"} <= {o for p in private.params if p.name == "validate_flag" for o in p.opts}


def test_a_mismatched_flow_name_would_fail_the_rule() -> None:
    """The rule above catches a flow parameter named otherwise (as new_version_reason was)."""
    wrong = OnFlows(name="new_version_reason")
    cli = dict(on_command_line())["new_version"]
    assert wrong.name != cli.snake_case


@pytest.mark.parametrize("former, now", sorted(FORMER_FLOW_NAMES.items()))
def test_a_former_flow_parameter_name_is_refused_in_one_line_naming_the_new_one(former: str, now: str) -> None:
    assert now in {spelling.name for _, spelling in on_flows()} and former not in {p.name for p in flow_parameters()}
    with pytest.raises(ValueError) as refused:
        refuse_former_names({"config": "c.json", former: "x"})
    message = str(refused.value)
    assert "\n" not in message and f"{former} is now {now}" in message and "deploy step" in message
    refuse_former_names({"config": "c.json", now: "x"})  # the new name passes


def test_the_python_api_takes_the_models_fields() -> None:
    signature = inspect.signature(phsafe.run_private)
    taken = {name: p for name, p in signature.parameters.items() if name != "progress"}
    spelled = {spelling.name or name: name for name, spelling in in_python()}
    assert list(taken) == list(spelled), "phsafe.run_private's arguments are the fields with an InPython spelling"
    for keyword, field in spelled.items():
        info = PrivateRunParameters.model_fields[field]
        if taken[keyword].default is not inspect.Parameter.empty:  # ``out`` is required in Python
            assert taken[keyword].default == info.get_default(), keyword
        assert f"{keyword}" in (phsafe.run_private.__doc__ or ""), f"{keyword} is documented"
    given = PrivateRunParameters.from_python({"config": "c.json", "data": "d", "out": "o", "resume": "r1",
                                              "validate": False, "memory_limit": "1.5G"})
    assert (given.output, given.resume_run_id, given.validate_inputs, given.memory_limit) == \
        (Path("o"), "r1", False, 3 << 29)


def test_a_float_budget_is_refused_in_python() -> None:
    with pytest.raises(phsafe.PHSafeError, match="not a float"):
        phsafe.run_private("c.json", "d", "o", lifetime_cap=2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(PrivateRunParameters.model_fields))
def test_refusals_name_each_parameter_as_the_front_ends_spell_it(name: str) -> None:
    cli = command_line_spelling()[name]
    assert option(name) == cli
    flows = {field: spelling.name or field for field, spelling in on_flows()}
    with front_end("flow"):
        if name in flows:
            assert option(name) == f"the flow parameter {flows[name]}"
        else:
            assert "flow parameter" not in option(name) or "output_root" in option(name)
    if name in flows:
        with front_end("flow", frozenset({"config"})):  # a deployment without the parameter
            assert "flow parameter" not in option(name) or name == "config"


def test_a_deployment_without_a_parameter_says_what_to_do_instead() -> None:
    with front_end("flow", frozenset({"config", "data", "ledger", "output_root"})):
        assert "raise-cap" in option("lifetime_cap")
        assert option("resume_run_id") == "a Retry of this flow run"
        assert option("ledger") == "the flow parameter ledger"
    with front_end("flow"):
        assert "output_root" in option("output")


def test_the_memory_limit_is_typed_as_a_size_on_every_front_end() -> None:
    # Flows: text such as "8G" (a pattern in the flow's signature refuses what is not a positive
    # size before the run starts); the engine gets bytes.
    flow = {p.name: p for p in flow_parameters()}["memory_limit"]
    pydantic = pytest.importorskip("pydantic")
    adapter = pydantic.TypeAdapter(flow.annotation)
    assert adapter.validate_python("8G") == "8G" and adapter.validate_python(None) is None
    for bad in ("8 gigs", "0G", "-1G", ""):
        with pytest.raises(pydantic.ValidationError):
            adapter.validate_python(bad)
    given = PrivateRunParameters.from_flow({"config": "c.json", "data": "d", "output_root": "o", "ledger": "l",
                                            "memory_limit": "1.5G"})
    assert given.memory_limit == 3 << 29
    # Command line: bytes, refused in one usage line when not a size.
    ctx = private.make_context("private", ["c.json", "d", "out", "--memory-limit", "512M"], resilient_parsing=True)
    assert ctx.params["memory_limit"] == 512 << 20
    with pytest.raises(click.BadParameter, match="not a size"):
        private.make_context("private", ["c.json", "d", "out", "--memory-limit", "8X"])


def test_a_flow_cap_is_read_as_the_decimal_typed() -> None:
    given = PrivateRunParameters.from_flow({"config": "c.json", "data": "d", "output_root": "o", "ledger": "l",
                                            "lifetime_cap": 2.514562})
    assert given.lifetime_cap == Fraction(2514562, 1000000)
