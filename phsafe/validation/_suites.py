"""The expectation suites of ``expectations/*.json``, read as plain JSON (no Great Expectations).

A suite is the reviewable statement of a set of rules. Each expectation carries, in its ``meta``:

* ``frame`` -- the name of the frame it is evaluated on (a suite may cover several frames, e.g.
  the outputs suite covers a table's header, its rows and its cells joined with the domain);
* ``file`` -- the input or output file whose rows it is about (``persons``, ``units``, ``geo``,
  ``config`` or ``output``), resolved to the real file name in reports;
* ``columns`` -- the columns it involves (``units.RTYPE`` names a column of another file);
* ``rule_id`` -- a stable identifier, unique in the suite, that lets the results of many batches
  of one file be added up;

and its ``description`` is the rule in plain words, which is what a report prints.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUITES_ENV = "PHSAFE_EXPECTATIONS_DIR"
"""Environment variable naming another folder of suites (e.g. for an installed package)."""


def suites_dir() -> Path:
    """The folder holding the suites: ``$PHSAFE_EXPECTATIONS_DIR``, else the package data
    ``phsafe.expectations`` (the repository's ``expectations/``, installed with the package)."""
    override = os.environ.get(SUITES_ENV)
    if override:
        return Path(override)
    return Path(str(importlib.resources.files("phsafe.expectations")))


@dataclass(frozen=True)
class Rule:
    """One expectation of a suite, as our reports see it."""

    rule_id: str
    frame: str
    file: str
    columns: tuple[str, ...]
    description: str
    type: str
    config: dict[str, Any]  # the expectation's JSON, unchanged

    def referenced_columns(self) -> set[str]:
        """Columns of the frame the expectation reads (kwargs and row condition)."""
        kwargs = self.config.get("kwargs", {})
        names: set[str] = set()
        for key in ("column", "column_A", "column_B"):
            if isinstance(kwargs.get(key), str):
                names.add(kwargs[key])
        if self.type != "expect_table_columns_to_match_ordered_list" and isinstance(kwargs.get("column_list"), list):
            names.update(kwargs["column_list"])
        names.update(_condition_columns(kwargs.get("row_condition")))
        return names

    def parameters(self) -> set[str]:
        """Names of the suite parameters (``{"$PARAMETER": name}``) the expectation needs."""
        return set(_parameters(self.config.get("kwargs", {})))


def _condition_columns(condition: Any) -> Iterable[str]:
    if isinstance(condition, dict):
        if isinstance(condition.get("column"), dict) and "name" in condition["column"]:
            yield condition["column"]["name"]
        for sub in condition.get("conditions", []):
            yield from _condition_columns(sub)


def _parameters(value: Any) -> Iterable[str]:
    if isinstance(value, dict):
        if set(value) == {"$PARAMETER"}:
            yield value["$PARAMETER"]
            return
        for v in value.values():
            yield from _parameters(v)
    elif isinstance(value, list):
        for v in value:
            yield from _parameters(v)


@dataclass(frozen=True)
class Suite:
    """A suite file: its raw JSON and its rules in file order."""

    name: str
    raw: dict[str, Any]
    rules: tuple[Rule, ...]

    @property
    def frames(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.frame for r in self.rules))

    def rules_for(self, frame: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.frame == frame)

    def rule(self, rule_id: str) -> Rule:
        for r in self.rules:
            if r.rule_id == rule_id:
                return r
        raise KeyError(rule_id)


@functools.cache
def _load(path: str) -> Suite:
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    name = raw["name"]
    rules = []
    for exp in raw["expectations"]:
        meta = exp.get("meta", {})
        rules.append(
            Rule(
                rule_id=meta["rule_id"],
                frame=meta.get("frame", name),
                file=meta.get("file", name),
                columns=tuple(meta.get("columns", ())),
                description=exp.get("description") or exp["type"],
                type=exp["type"],
                config=exp,
            )
        )
    ids = [r.rule_id for r in rules]
    if len(ids) != len(set(ids)):
        raise ValueError(f"suite {name}: rule_id values are not unique")
    return Suite(name, raw, tuple(rules))


def load_suite(name: str) -> Suite:
    """The suite ``expectations/<name>.json`` (cached; callers must not mutate it)."""
    path = suites_dir() / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"expectation suite {name!r} not found at {path}")
    return _load(str(path))


def subsuite_json(suite: Suite, rules: Iterable[Rule]) -> dict[str, Any]:
    """The JSON of ``suite`` restricted to ``rules`` (a deep copy, safe to hand to GX)."""
    raw = copy.deepcopy(suite.raw)
    raw["expectations"] = [copy.deepcopy(r.config) for r in rules]
    return raw
