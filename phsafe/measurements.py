"""The noisy vectors of a run in progress, kept durably so that a spend is never drawn twice.

A measurement's noisy vector is written here (and fsynced) after its noise is drawn and before
the ledger records it COMMITTED (see :func:`phsafe.noise.measure`'s ``keep``). When a failed or
crashed run is resumed, every measurement whose latest spend the ledger shows COMMITTED is read
back from here and checked against the digest the ledger recorded; only a vector that is
missing or does not match is measured again -- a new spend, recorded as such.

The vectors are released values (noise already added), not confidential data; they live in the
run's staging directory and are removed before the outputs are published.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import numpy.typing as npt

from phsafe import durable
from phsafe.logs import get_logger
from phsafe.noise import vector_digest

log = get_logger("phsafe.measurements")

MEASUREMENTS_DIR = ".measurements"


def _file_name(key: str) -> str:
    # Keys are ``TABLE/level``; both parts are [A-Za-z0-9_] only.
    return key.replace("/", "__") + ".npy"


class MeasurementStore:
    """Noisy vectors by measurement key, under ``directory``.

    Args:
        directory: Folder holding one ``.npy`` per measurement (created on first save).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / _file_name(key)

    def save(self, key: str, vector: npt.NDArray[np.int64]) -> None:
        """Write ``vector`` atomically and durably (:func:`phsafe.durable.replace`)."""
        durable.make_folders(self.directory)  # synced into its parent: a committed vector survives a power cut
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(vector, dtype="<i8"), allow_pickle=False)
        durable.replace(self.path(key), buffer.getvalue(), mode=0o600)

    def load(self, key: str, digest: str, n_cells: int) -> npt.NDArray[np.int64] | None:
        """The stored vector of ``key`` if it is there, has ``n_cells`` cells and hashes to
        ``digest`` (the digest the ledger recorded at COMMITTED); ``None`` otherwise."""
        path = self.path(key)
        try:
            vector = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            log.warning("stored measurement unreadable", measurement=key, error_type=type(exc).__name__)
            return None
        if vector.ndim != 1 or vector.size != n_cells or vector.dtype != np.dtype("<i8"):
            log.warning("stored measurement has the wrong shape", measurement=key)
            return None
        if vector_digest(vector) != digest:
            log.warning("stored measurement does not match the ledger's digest", measurement=key)
            return None
        return vector.astype(np.int64, copy=False)
