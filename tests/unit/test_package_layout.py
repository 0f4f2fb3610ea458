"""What the distribution holds (pyproject.toml): the library, its templates and the suites."""

from __future__ import annotations

import importlib.resources
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_of_phsafe_is_listed_and_nothing_else() -> None:
    config = _setuptools()
    on_disk = {
        ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "phsafe").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert set(config["packages"]) == on_disk | {"phsafe.expectations"}
    assert not {"flows", "tasks", "deployments"} & {p.split(".")[0] for p in config["packages"]}
    assert config["package-dir"] == {"phsafe.expectations": "expectations"}


def test_package_data_covers_the_suites_and_templates() -> None:
    data = _setuptools()["package-data"]
    suites = sorted(p.name for p in (REPO / "expectations").glob("*.json"))
    assert suites and data["phsafe.expectations"][0] == "*.json"
    templates = sorted(p.name for p in (REPO / "phsafe" / "templates").iterdir() if p.suffix == ".j2")
    assert templates and data["phsafe.templates"] == ["*.j2"]


def test_suites_are_read_as_package_data(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from phsafe.validation._suites import SUITES_ENV, suites_dir

    monkeypatch.delenv(SUITES_ENV, raising=False)
    here = suites_dir()
    assert here == Path(str(importlib.resources.files("phsafe.expectations")))
    assert sorted(p.name for p in here.glob("*.json")) == sorted(p.name for p in (REPO / "expectations").glob("*.json"))
    monkeypatch.setenv(SUITES_ENV, "/somewhere/else")
    assert suites_dir() == Path("/somewhere/else")  # the override still wins
