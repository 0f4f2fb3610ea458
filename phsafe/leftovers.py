"""What a finished run may leave behind when it is stopped at its very end, and its removal.

A private run publishes its release, records it (``OUTPUTS_PUBLISHED``, ``RUN_FINISHED``),
writes the release's public log files, writes its final checkpoint into its work folder and
only then removes what it no longer needs there (:func:`phsafe.engine.publish_private_run`). A
stop (a kill, a power cut) in between leaves a run the ledger says is finished with its work
folder still holding:

=========================================  ==============================================
``<work folder>/measurements/``            the noisy vectors (released values, no longer needed)
``<work folder>/release/``                 the staged copy of the release
``<work folder>/spill/``                   spilled input records (confidential)
``<work folder>/.checkpoint.json.*.tmp``   a temporary file of the final checkpoint
``.<OUT>.partial-<run id>`` beside OUT      a partial copy of the release (hidden)
``.<OUT>.privacy-loss.*.tmp`` beside OUT    a temporary file of the release's log files
=========================================  ==============================================

Nothing else: the validation reports and the final checkpoint stay (they are the run's record),
and the published release is never touched. Only runs the ledger says finished have leftovers:
a failed or crashed run's work folder is what a resume completes it from. ``phsafe audit verify``
reports them (an action needed, exit status 3) and ``phsafe ledger clean-finished`` removes
them, durably (:func:`phsafe.durable.remove`).
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

from phsafe import durable
from phsafe.intake import SPILL_FOLDER
from phsafe.private_run import CHECKPOINT_FILE, MEASUREMENTS_FOLDER, RELEASE_FOLDER, RUNS_DIR

__all__ = ["Leftovers", "run_folder", "leftovers_of", "remove_leftovers"]


@dataclass(frozen=True)
class Leftovers:
    """What a finished run left behind (see the module docstring).

    Attributes:
        run_id: The run.
        run_dir: Its work folder.
        paths: Each leftover (a folder or a file), in a fixed order.
        vectors: How many noisy vectors ``measurements/`` holds.
    """

    run_id: str
    run_dir: Path
    paths: tuple[Path, ...]
    vectors: int = 0

    def __bool__(self) -> bool:
        return bool(self.paths)

    def describe(self) -> str:
        """``46 noisy vectors, the staged copy of its release, 1 temporary file``."""
        parts = []
        temporary = 0
        for path in self.paths:
            if path.name == MEASUREMENTS_FOLDER and path.parent == self.run_dir:
                parts.append(f"{self.vectors} noisy vector(s)" if self.vectors else "an empty folder of noisy vectors")
            elif path.name == RELEASE_FOLDER and path.parent == self.run_dir:
                parts.append("the staged copy of its release")
            elif path.name == SPILL_FOLDER and path.parent == self.run_dir:
                parts.append("spilled input records")
            elif ".partial-" in path.name:
                parts.append(f"a partial copy of its release beside its output folder ({path.name})")
            else:
                temporary += 1
        if temporary:
            parts.append(f"{temporary} temporary file(s)")
        return ", ".join(parts)


def run_folder(ledger: Path, run_id: str, work_dir: Path | None = None) -> Path:
    """A run's work folder: ``<work_dir or the ledger's folder/runs>/<run id>``."""
    base = Path(work_dir) if work_dir is not None else Path(ledger).parent / RUNS_DIR
    return base.absolute() / run_id


def leftovers_of(ledger: Path, run_id: str, output: str | Path | None, work_dir: Path | None = None) -> Leftovers:
    """What the run ``run_id`` -- which the caller knows is finished, and published to
    ``output`` -- left behind. Reads folder listings only."""
    run_dir = run_folder(ledger, run_id, work_dir)
    found: list[Path] = []
    vectors = 0
    for name in (MEASUREMENTS_FOLDER, RELEASE_FOLDER, SPILL_FOLDER):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            found.append(path)
            if name == MEASUREMENTS_FOLDER:
                vectors = sum(1 for p in path.glob("*.npy"))
    found += sorted(Path(p) for p in glob.glob(str(run_dir / f".{CHECKPOINT_FILE}.*.tmp")))
    if output:
        out = Path(output)
        found += sorted(Path(p) for p in glob.glob(str(out.parent / glob.escape(f".{out.name}.partial-{run_id}"))))
        found += sorted(Path(p) for p in glob.glob(str(out.parent / f"{glob.escape(f'.{out.name}.privacy-loss.')}*.tmp")))
    return Leftovers(run_id, run_dir, tuple(found), vectors)


def remove_leftovers(leftovers: Leftovers, output: str | Path | None) -> list[Path]:
    """Remove ``leftovers`` durably, each then its folder synced; never the published release
    ``output`` nor anything holding it. Returns what was removed.

    Raises:
        OSError: A removal failed (what was removed before it stays removed).
    """
    published = Path(output).absolute() if output else None
    removed = []
    for path in leftovers.paths:
        if published is not None and (path.absolute() == published or published.is_relative_to(path.absolute())):
            continue  # never the release (a work folder inside OUT is refused by the preflight anyway)
        if durable.remove(path):
            removed.append(path)
    return removed
