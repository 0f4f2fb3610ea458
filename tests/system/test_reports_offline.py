"""Every kind of HTML report opens offline in a real browser (headless Chromium).

Plan, risk, accuracy, post-processing and validation reports are generated for real, then
opened with every http(s) request blocked (:func:`tests._browser.browser_page`): no request may
fail, the console must stay free of errors, every image must load, and every link must lead to
a file (and an anchor) that exists. A screenshot of each page is saved next to it in tmp.

The accuracy and post-processing reports come from a small synthetic dataset (1,200 persons in two
states): every section and plot of the reports is there, at a fraction of the demo data's
post-processing and production-method sampling (which made the first case of this module, the one
that builds the reports, cost about 30 CPU-seconds). The post-processing report opened is the one the
experiment writes for its trial.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from click.testing import CliRunner

from phsafe import synthetic
from phsafe.accuracy import experiment
from phsafe.accuracy.production import production_files
from phsafe.cli import main
from tests._browser import browser_page
from tests.conftest import END_TO_END, PR_CONFIG, US_CONFIG

REPO = Path(__file__).resolve().parents[2]
DEMO_US = REPO / "demo" / "data" / "us"


def _cli(*args: str) -> None:
    result = CliRunner().invoke(main, ["-q", *map(str, args)])
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 1:  # only the failing validation is expected to exit 1
        assert args[0] == "validate", result.output


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reports")
    _cli("plan", "--from-config", US_CONFIG, "--out", root / "plan")
    _cli("plan", "--targets", REPO / "docs" / "table10_moe_targets.csv", "--tau", "10", "--tau", "PH3=6,PH6=6",
         "--privacy-defn", "puredp", "--out", root / "plan-puredp")
    _cli("risk", PR_CONFIG, "--out", root / "risk")
    _cli("validate", END_TO_END / "config.json", END_TO_END, "--report-dir", root / "validation-failed")
    _cli("validate", DEMO_US / "config.json", DEMO_US, "--report-dir", root / "validation-passed")
    small = root / "small"
    synthetic.write(synthetic.generate(1200, ["01", "06"], seed=3), small)
    config = json.loads(US_CONFIG.read_text())
    config["state_filter"] = ["01", "06"]
    (small / "config.json").write_text(json.dumps(config))
    # The reports' sections and plots, not the samplers: the production's Gibbs sampler keeps 1,000 draws (its
    # 10,000 were most of this fixture's CPU) and averages on lattices above 1,000,000 points are drawn.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(experiment, "production_files", functools.partial(production_files, gibbs_draws=1_000))
        _cli("accuracy", small / "config.json", small, root / "accuracy", "--trials", "1", "--draws", "200",
             "--exact-limit", "1000000", "--non-confidential")
    pages = {
        "plan": root / "plan" / "plan_report.html",
        "plan-puredp": root / "plan-puredp" / "plan_report.html",
        "risk": root / "risk" / "risk_report.html",
        "accuracy": root / "accuracy" / "report.html",
        # the post-processing report of the experiment's trial: written by the function the `postprocess` command
        # runs (the command's own files: test_postprocess_release), so not made a second time here
        "postprocess": root / "accuracy" / "postprocessed" / "001" / "report.html",
        "validation-reports": root / "validation-failed" / "index.html",
        "validation-summary": root / "validation-failed" / "inputs" / "index.html",
        "validation-suite": root / "validation-failed" / "inputs" / "data_docs" / "units_geo.html",
        "validation-passed": root / "validation-passed" / "inputs" / "data_docs" / "persons.html",
    }
    for page in pages.values():
        assert page.is_file(), page
    return pages


@pytest.fixture(scope="module")
def browser():  # type: ignore[no-untyped-def]
    """One headless Chromium (off the network) for all the pages of this module."""
    with browser_page() as page:
        yield page


def _check_link(href: str, page: Path) -> None:
    url = urlparse(href)
    assert url.scheme == "file", f"{page.name} links outside the report: {href}"
    target = Path(unquote(url.path))
    assert target.is_file(), f"{page.name}: broken link {href}"
    if url.fragment:
        assert f'id="{url.fragment}"' in target.read_text(encoding="utf-8"), f"{page.name}: no anchor {href}"


@pytest.mark.parametrize("kind", [
    "plan", "plan-puredp", "risk", "accuracy", "postprocess",
    "validation-reports", "validation-summary", "validation-suite", "validation-passed",
])
def test_report_opens_offline(reports: dict[str, Path], browser, kind: str) -> None:  # type: ignore[no-untyped-def]
    path = reports[kind]
    page = browser
    page.failed_requests.clear()
    page.console_errors.clear()
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_load_state("networkidle")
    title = page.title()
    images = page.eval_on_selector_all("img", "els => els.map(e => [e.src, e.complete && e.naturalWidth > 0])")
    links = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
    requested = page.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    page.screenshot(path=str(path.with_suffix(".png")), full_page=True)
    assert page.failed_requests == [], page.failed_requests
    assert page.console_errors == [], page.console_errors
    assert title.startswith("PHSafe"), title
    assert all(ok for _, ok in images), [src for src, ok in images if not ok]
    assert not [r for r in requested if not r.startswith("file:")], requested
    for href in links:
        _check_link(href, path)
    if kind in ("plan", "risk", "accuracy"):
        assert images, "the report shows its plots"
    if kind.startswith("validation-summary"):
        assert any("#" in h for h in links), "each failure links to its rule"
    assert path.with_suffix(".png").stat().st_size > 10_000


def test_validation_pages_name_the_run_and_hold_counts_only(reports: dict[str, Path]) -> None:
    suite = reports["validation-suite"].read_text(encoding="utf-8")
    summary = json.loads((reports["validation-summary"].parent / "report.json").read_text())
    assert "__none__" not in suite and "Data asset: None" not in suite and "newsletter" not in suite.lower()
    assert "http" not in suite and "http" not in reports["validation-summary"].read_text(encoding="utf-8")
    for failure in summary["failures"]:
        if failure["suite"] == "units_geo":
            assert f'id="{failure["rule_id"]}"' in suite
