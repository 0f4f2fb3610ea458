"""The parameters of a private run are defined once (:mod:`phsafe.parameters`), and every front end
spells them from there: the command line's options, the flows' parameters, the engine's options,
and the names refusals give them (:func:`phsafe.errors.option`)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path

import click
import pytest

from phsafe.cli.private import private
from phsafe.engine import PrivateRunOptions
from phsafe.errors import FLOW_PARAMETERS, OPTIONS
from phsafe.parameters import PrivateRunParameters, command_line_spelling, flow_parameters, on_command_line, on_flows

ENGINE_ONLY = {"report_dir"}
"""Options of the engine that no front end sets."""
OPTION_NAMES = {"resume": "resume_run_id", "no_validate": "validate_inputs"}
"""How :data:`phsafe.errors.OPTIONS` names a parameter when it is not by its field's name."""


def test_the_engine_options_are_fields_of_the_model() -> None:
    engine = {f.name for f in dataclasses.fields(PrivateRunOptions)}
    assert engine - ENGINE_ONLY <= set(PrivateRunParameters.model_fields)
    given = PrivateRunParameters(config=Path("c.json"), data=Path("d"), output=Path("out"), dataset="x",
                                 lifetime_cap=Fraction(5, 2), validate_inputs=False, truncation_key="ab")
    options = given.options()
    assert (options.dataset, options.lifetime_cap, options.validate_inputs, options.truncation_key) == \
        ("x", Fraction(5, 2), False, "ab")
    assert options.report_dir is None


def test_the_command_line_options_are_the_models() -> None:
    params = {p.name: p for p in private.params}
    for name, spelling in on_command_line():
        assert name in params, name
        if not spelling.argument:
            assert set(spelling.decls) - {name} <= set(params[name].opts), name
    # what the command adds of its own: the production release's -v, quiet/verbose (its --log is the
    # log_file field, spelled as every command spells it)
    assert set(params) - set(PrivateRunParameters.model_fields) == {"validate_flag", "quiet", "verbose"}
    ledger = params["ledger"]
    assert isinstance(ledger, click.Option) and ledger.envvar == "PHSAFE_LEDGER"
    assert "--cap-reason" in (params["lifetime_cap"].help or "")  # other options named as typed


def test_the_flow_parameters_are_the_models() -> None:
    names = [p.name for p in flow_parameters()]
    assert names == [spelling.name or name for name, spelling in on_flows()]
    assert "new_version_reason" in names and "new_version" not in names and "truncation_key" not in names


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_refusals_name_each_option_as_the_front_ends_spell_it(option: str) -> None:
    field = OPTION_NAMES.get(option, option)
    if field not in PrivateRunParameters.model_fields:
        pytest.skip(f"{option} is not a parameter of a private run")
    assert OPTIONS[option] == command_line_spelling()[field]
    flows = {name: spelling.name or name for name, spelling in on_flows()}
    if field in flows:
        assert FLOW_PARAMETERS.get(option, option).split("=")[0] == flows[field]


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
    assert given.options().memory_limit == 3 << 29
    # Command line: bytes, refused in one usage line when not a size.
    ctx = private.make_context("private", ["c.json", "d", "out", "--memory-limit", "512M"], resilient_parsing=True)
    assert ctx.params["memory_limit"] == 512 << 20
    with pytest.raises(click.BadParameter, match="not a size"):
        private.make_context("private", ["c.json", "d", "out", "--memory-limit", "8X"])
