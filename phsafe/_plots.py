"""Shared report helpers: PNG charts drawn with matplotlib's Agg canvas, a minimal document
model (headings, paragraphs, bullet lists, tables, images, preformatted text) rendered both to
Markdown and to self-contained HTML (the Jinja2 template ``document.html.j2`` of
:mod:`phsafe.templates`), and the report folders (:func:`report_folder`).

Charts never touch :mod:`matplotlib.pyplot`: each one is a :class:`matplotlib.figure.Figure`
attached to its own :class:`~matplotlib.backends.backend_agg.FigureCanvasAgg`, so nothing here
selects a GUI backend, changes global state, or keeps figures alive between calls (safe in test
workers and threads). matplotlib is imported lazily, on the first chart.

Inline text may contain ``code`` spans in backticks: Markdown keeps them, HTML renders them as
``<code>``. Nothing else is interpreted, so callers never have to escape table cells or level
names such as ``usa_*``.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Iterable, Sequence

from phsafe.errors import ReportFolderExists

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DPI = 120


# --------------------------------------------------------------------------------------------
# Charts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One line of a line chart.

    Attributes:
        label: Legend text.
        x: Abscissae.
        y: Ordinates (same length as ``x``).
        style: matplotlib format string, e.g. ``"-"``, ``"--"``, ``"o"``.
    """

    label: str
    x: Sequence[float]
    y: Sequence[float]
    style: str = "-"


def _figure(width: float, height: float):  # type: ignore[no-untyped-def]
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:  # type: ignore[no-untyped-def]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def line_chart(
    path: Path,
    series: Sequence[Series],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    vlines: Sequence[tuple[float, str]] = (),
    size: tuple[float, float] = (7.5, 4.8),
) -> Path:
    """Draw ``series`` into one PNG at ``path`` and return the path.

    Args:
        path: Output file (parents are created).
        series: Lines and/or markers to draw, in legend order.
        title: Chart title.
        xlabel: Label of the x axis.
        ylabel: Label of the y axis.
        logx: Logarithmic x axis.
        logy: Logarithmic y axis.
        vlines: Dashed vertical reference lines as ``(x, label)``.
        size: Figure size in inches.
    """
    fig = _figure(*size)
    ax = fig.add_subplot(1, 1, 1)
    for s in series:
        ax.plot(list(s.x), list(s.y), s.style, label=s.label, markersize=5)
    for x, label in vlines:
        ax.axvline(x, linestyle="--", color="grey", linewidth=0.8, label=label)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.6)
    if series or vlines:
        ax.legend(fontsize="small")
    return _save(fig, path)


def stacked_barh(
    path: Path,
    categories: Sequence[str],
    segments: Sequence[tuple[str, Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    annotate_totals: bool = True,
    total_format: str = "{:.6g}",
) -> Path:
    """Horizontal stacked bars: one bar per category, one coloured segment per stack.

    Args:
        path: Output file (parents are created).
        categories: Bar labels, drawn top to bottom.
        segments: ``(legend label, values per category)``; values are non-negative.
        title: Chart title.
        xlabel: Label of the value axis.
        annotate_totals: Write each bar's total at its end.
        total_format: Format of the annotated totals.
    """
    n = len(categories)
    fig = _figure(8.0, max(2.5, 0.45 * n + 1.6))
    ax = fig.add_subplot(1, 1, 1)
    positions = list(range(n))[::-1]
    left = [0.0] * n
    for label, values in segments:
        vals = [float(v) for v in values]
        if len(vals) != n:
            raise ValueError(f"segment {label!r} has {len(vals)} values for {n} categories")
        if not any(vals):
            continue
        ax.barh(positions, vals, left=left, label=label, height=0.6)
        left = [a + b for a, b in zip(left, vals)]
    if annotate_totals:
        for pos, total in zip(positions, left):
            ax.text(total, pos, " " + total_format.format(total), va="center", fontsize="small")
    ax.set_yticks(positions)
    ax.set_yticklabels(list(categories))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_xlim(0, max(left + [0.0]) * 1.18 or 1.0)
    ax.grid(True, axis="x", linewidth=0.3, alpha=0.6)
    if segments:
        ax.legend(fontsize="small", loc="lower right")
    return _save(fig, path)


def is_png(path: Path) -> bool:
    """True if ``path`` starts with the PNG signature and a well-formed IHDR chunk."""
    try:
        head = Path(path).read_bytes()[:33]
    except OSError:
        return False
    if len(head) < 33 or not head.startswith(PNG_SIGNATURE):
        return False
    width = int.from_bytes(head[16:20], "big")
    height = int.from_bytes(head[20:24], "big")
    return head[12:16] == b"IHDR" and width > 0 and height > 0


# --------------------------------------------------------------------------------------------
# Documents
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    kind: ClassVar[str] = "heading"


@dataclass(frozen=True)
class Para:
    text: str
    kind: ClassVar[str] = "para"


@dataclass(frozen=True)
class Bullets:
    items: Sequence[str]
    kind: ClassVar[str] = "bullets"


_NUMBER = re.compile(r"^[-+≈<>~ ]*[0-9.,]+(e[-+]?[0-9]+)?%?$|^(n/a|-|Infinity|NaN|)$", re.IGNORECASE)


@dataclass(frozen=True)
class Table:
    """A table of text cells; columns whose every cell is a number are right-aligned in HTML."""

    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    kind: ClassVar[str] = "table"

    def is_numeric(self, column: int) -> bool:
        cells = [row[column] for row in self.rows if column < len(row)]
        return bool(cells) and all(_NUMBER.match(str(c).strip()) for c in cells) and any(
            any(ch.isdigit() for ch in str(c)) for c in cells)


@dataclass(frozen=True)
class Image:
    """A PNG next to the document (``src`` is relative to the document's folder)."""

    src: str
    alt: str
    kind: ClassVar[str] = "image"


@dataclass(frozen=True)
class Pre:
    text: str
    kind: ClassVar[str] = "pre"


Block = Heading | Para | Bullets | Table | Image | Pre


@dataclass
class Document:
    """An ordered list of blocks with a title; render with :meth:`markdown` or :meth:`html`."""

    title: str
    blocks: list[Block] = field(default_factory=list)

    def add(self, *blocks: Block) -> "Document":
        self.blocks.extend(blocks)
        return self

    def markdown(self) -> str:
        return render_markdown(self.title, self.blocks)

    def html(self) -> str:
        return render_html(self.title, self.blocks)

    def write(self, md_path: Path, html_path: Path) -> tuple[Path, Path]:
        md_path, html_path = Path(md_path), Path(html_path)
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(self.markdown(), encoding="utf-8")
        html_path.write_text(self.html(), encoding="utf-8")
        return md_path, html_path


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(title: str, blocks: Iterable[Block]) -> str:
    out = [f"# {title}", ""]
    for b in blocks:
        if isinstance(b, Heading):
            out += ["#" * b.level + " " + b.text, ""]
        elif isinstance(b, Para):
            out += [b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {item}" for item in b.items] + [""]
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            out.append("|" + "|".join("---" for _ in b.header) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            out.append("")
        elif isinstance(b, Image):
            out += [f"![{b.alt}]({b.src})", ""]
        else:
            out += ["```", b.text.rstrip("\n"), "```", ""]
    return "\n".join(out)


def render_html(title: str, blocks: Iterable[Block]) -> str:
    """The document as a self-contained HTML page (template ``document.html.j2``)."""
    from phsafe.templates import render

    return render("document.html.j2", title=title, blocks=list(blocks))


# --------------------------------------------------------------------------------------------
# Report folders
# --------------------------------------------------------------------------------------------


def report_folder(path: str | Path, *, overwrite: bool = False, what: str = "output folder") -> Path:
    """Make ``path`` ready for a report: a new or empty folder.

    Every report command writes into a folder of its own and never mixes its files with
    others: an existing non-empty folder is refused unless ``overwrite``, which empties it
    first (only a folder: a file at ``path`` is always refused).

    Args:
        path: The report folder.
        overwrite: Replace what an existing folder holds.
        what: What the folder is, for the message (``output folder``, ``report folder``).

    Raises:
        ReportFolderExists: ``path`` is a file, or a non-empty folder without ``overwrite``.
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ReportFolderExists(f"{what} {folder} is a file, not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        if not overwrite:
            raise ReportFolderExists(
                f"{what} {folder} already holds files; choose a new folder, or replace them with --overwrite")
        for child in folder.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    return folder
