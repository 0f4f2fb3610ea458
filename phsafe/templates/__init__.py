"""The Jinja2 templates of every HTML report, and the one helper that renders them.

Reports are data (a :class:`phsafe._plots.Document`, a validation result, ...) rendered by a
template in this folder; no HTML is built from strings anywhere else. Autoescaping is on for
every template, so table cells, level names such as ``usa_*`` and file names are always text;
:func:`inline` is the only markup a caller's text gets (```code``` spans). Every page is
self-contained: styles are inline and images are files next to the page, so reports open
offline, with no request to any server.

    >>> from phsafe.templates import render
    >>> html = render("document.html.j2", title="Plan", blocks=[])   # doctest: +SKIP

Templates:

* ``base.html.j2`` -- the page shell and the shared style; others extend it (``{% block content %}``);
* ``document.html.j2`` -- a :class:`phsafe._plots.Document` (plan, risk, accuracy and
  post-processing reports; the audit report can use it too);
* ``validation_index.html.j2``, ``validation_suite.html.j2``, ``validation_reports.html.j2`` --
  the validation reports (:mod:`phsafe.validation._html`).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

_CODE = re.compile(r"`([^`]*)`")


def inline(text: object) -> Markup:
    """``text`` escaped, with ```code``` spans as ``<code>`` (the Markdown the reports share)."""
    escaped = str(escape(str(text)))
    return Markup(_CODE.sub(lambda m: f"<code>{m.group(1)}</code>", escaped))


@functools.cache
def environment() -> jinja2.Environment:
    """The Jinja2 environment of the package's templates (autoescape on, undefined names fail)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("phsafe", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["inline"] = inline
    return env


def render(template: str, **context: Any) -> str:
    """Render ``template`` (a file name in this folder) with ``context``."""
    return environment().get_template(template).render(**context)


def write(path: str | Path, template: str, **context: Any) -> Path:
    """Render ``template`` into the file ``path`` (UTF-8; parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(template, **context), encoding="utf-8")
    return path
