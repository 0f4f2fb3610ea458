"""Synthetic, fully consistent census inputs (persons, units, geo) for tests, demos and benchmarks.

The generator builds realistic households, vacant housing units and group-quarters (GQ)
facilities, and writes them in the exact file formats of spec §1. Every record is consistent
with every other one: household type (HHT, HHT2, CPLT), family size (NPF), population
(FINAL_POP) and the householder's race and ethnicity (HHRACE, HHSPAN) are *derived* from the
persons generated for the unit, never drawn independently, so the validation suites accept the
data and the tables computed from it are meaningful.

Structure: state populations in proportion to the 2020 census; household sizes 1..20 (a tail
above the truncation threshold tau = 10); relationships, ages, HHT/HHT2/CPLT consistent; race
and Hispanic origin varying by state; tenure by the householder's age; about 10 % vacant units
and 2.5 % of persons in GQ facilities; Puerto Rico as its own dataset.

Everything is vectorized with numpy over households and persons (no per-person Python loop;
the only loops run over states, relationship groups or a handful of categories), and columns are
kept in compact dtypes. :func:`synthesize` generates any size in bounded memory, one chunk (one
state, at most a few million persons, its own seed stream and MAFID range) at a time, and
appends each chunk to the output files: about 1.5M persons a second on one core for CSV, 1M for
Parquet, about 200 bytes of memory per person of a chunk.

The ``seed`` only makes the synthetic data reproducible. It has nothing to do with privacy:
this module never draws, and must never be used to draw, privacy noise.

Example::

    from pathlib import Path
    from phsafe import synthetic

    data = synthetic.generate(20_000, ["01", "06"], seed=7)      # in memory (pandas)
    synthetic.write(data, Path("inputs"), fmt="csv")
    synthetic.synthesize(Path("big"), 10_000_000, "us", fmt="parquet-partitioned", seed=7)

or, from a shell::

    phsafe synth --persons 10M --states us --format parquet-partitioned --out big --seed 7
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from phsafe.schema import FILES, MAFID_MAX, MAFID_MIN, ColumnKind

__all__ = ["FORMATS", "SynthesisResult", "SyntheticData", "generate", "synthesize", "write"]

IntArray = npt.NDArray[np.integer]

# --------------------------------------------------------------------------------------------
# Reference facts (approximate 2020 Census figures; used only to make the data look plausible).
# --------------------------------------------------------------------------------------------

# state FIPS -> (REGIONCE, DIVISIONCE, population in thousands, number of counties,
#                Hispanic share of the population)
_STATES: dict[str, tuple[int, int, int, int, float]] = {
    "01": (3, 6, 5024, 67, 0.053), "02": (4, 9, 733, 30, 0.071),
    "04": (4, 8, 7152, 15, 0.307), "05": (3, 7, 3012, 75, 0.085),
    "06": (4, 9, 39538, 58, 0.394), "08": (4, 8, 5774, 64, 0.219),
    "09": (1, 1, 3606, 8, 0.173), "10": (3, 5, 990, 3, 0.105),
    "11": (3, 5, 690, 1, 0.113), "12": (3, 5, 21538, 67, 0.265),
    "13": (3, 5, 10712, 159, 0.105), "15": (4, 9, 1455, 5, 0.107),
    "16": (4, 8, 1839, 44, 0.130), "17": (2, 3, 12813, 102, 0.182),
    "18": (2, 3, 6786, 92, 0.082), "19": (2, 4, 3190, 99, 0.068),
    "20": (2, 4, 2938, 105, 0.130), "21": (3, 6, 4506, 120, 0.046),
    "22": (3, 7, 4658, 64, 0.069), "23": (1, 1, 1362, 16, 0.020),
    "24": (3, 5, 6177, 24, 0.118), "25": (1, 1, 7030, 14, 0.126),
    "26": (2, 3, 10077, 83, 0.056), "27": (2, 4, 5706, 87, 0.061),
    "28": (3, 6, 2961, 82, 0.036), "29": (2, 4, 6155, 115, 0.048),
    "30": (4, 8, 1084, 56, 0.044), "31": (2, 4, 1962, 93, 0.120),
    "32": (4, 8, 3105, 17, 0.287), "33": (1, 1, 1378, 10, 0.043),
    "34": (1, 2, 9289, 21, 0.216), "35": (4, 8, 2118, 33, 0.477),
    "36": (1, 2, 20201, 62, 0.195), "37": (3, 5, 10439, 100, 0.107),
    "38": (2, 4, 779, 53, 0.043), "39": (2, 3, 11799, 88, 0.044),
    "40": (3, 7, 3959, 77, 0.119), "41": (4, 9, 4237, 36, 0.139),
    "42": (1, 2, 13003, 67, 0.081), "44": (1, 1, 1097, 5, 0.166),
    "45": (3, 5, 5118, 46, 0.069), "46": (2, 4, 887, 66, 0.045),
    "47": (3, 6, 6911, 95, 0.069), "48": (3, 7, 29146, 254, 0.393),
    "49": (4, 8, 3272, 29, 0.151), "50": (1, 1, 643, 14, 0.024),
    "51": (3, 5, 8631, 133, 0.105), "53": (4, 9, 7705, 39, 0.137),
    "54": (3, 5, 1794, 55, 0.019), "55": (2, 3, 5894, 72, 0.076),
    "56": (4, 8, 577, 23, 0.102), "72": (9, 0, 3286, 78, 0.989),
}
_FALLBACK_STATE = (9, 0, 1000, 10, 0.15)  # a 2-digit code this table does not know

# Race groups A..G: White, Black, AIAN, Asian, NHPI, Some Other Race alone, two or more races.
_RACE_NON_HISPANIC_US = (0.711, 0.147, 0.009, 0.071, 0.002, 0.006, 0.054)
_RACE_HISPANIC_US = (0.203, 0.019, 0.027, 0.005, 0.001, 0.420, 0.325)
_RACE_HISPANIC_PR = (0.172, 0.070, 0.005, 0.001, 0.001, 0.255, 0.496)
_RACE_NON_HISPANIC_PR = (0.500, 0.200, 0.005, 0.050, 0.005, 0.040, 0.200)
# Non-Hispanic overrides (Black, AIAN, Asian, NHPI, two or more); White takes the rest.
_NH_OVERRIDES: dict[str, tuple[float, float, float, float, float]] = {
    "01": (0.280, 0.006, 0.016, 0.001, 0.040), "02": (0.034, 0.160, 0.068, 0.019, 0.110),
    "06": (0.090, 0.006, 0.250, 0.006, 0.060), "11": (0.460, 0.003, 0.050, 0.001, 0.050),
    "12": (0.190, 0.003, 0.040, 0.001, 0.040), "13": (0.340, 0.003, 0.050, 0.001, 0.040),
    "15": (0.020, 0.003, 0.410, 0.120, 0.260), "22": (0.350, 0.007, 0.020, 0.001, 0.040),
    "24": (0.340, 0.003, 0.080, 0.001, 0.050), "28": (0.390, 0.005, 0.010, 0.001, 0.030),
    "35": (0.040, 0.180, 0.030, 0.002, 0.050), "36": (0.170, 0.004, 0.110, 0.001, 0.050),
    "37": (0.230, 0.013, 0.035, 0.001, 0.050), "40": (0.080, 0.100, 0.025, 0.003, 0.100),
    "45": (0.280, 0.004, 0.020, 0.001, 0.040), "46": (0.020, 0.090, 0.015, 0.001, 0.040),
    "48": (0.190, 0.004, 0.090, 0.001, 0.050), "51": (0.210, 0.004, 0.080, 0.001, 0.060),
    "53": (0.050, 0.015, 0.110, 0.009, 0.080), "30": (0.005, 0.070, 0.010, 0.001, 0.050),
    "38": (0.035, 0.055, 0.018, 0.001, 0.040), "04": (0.070, 0.060, 0.050, 0.003, 0.060),
}
_NH_SOR = 0.006

# Multi-race codes 07..63 (CENRACE order): 07..21 two races, 22..41 three, 42..56 four,
# 57..62 five, 63 six. Two-race pairs in code order:
# W-B, W-AIAN, W-A, W-NHPI, W-SOR, B-AIAN, B-A, B-NHPI, B-SOR, AIAN-A, AIAN-NHPI, AIAN-SOR,
# A-NHPI, A-SOR, NHPI-SOR.
_TWO_RACE_NON_HISPANIC = (0.25, 0.20, 0.15, 0.02, 0.10, 0.03, 0.01, 0.003, 0.04, 0.005, 0.002,
                          0.01, 0.03, 0.02, 0.003)
_TWO_RACE_HISPANIC = (0.06, 0.08, 0.02, 0.005, 0.60, 0.01, 0.002, 0.001, 0.05, 0.002, 0.001,
                      0.05, 0.003, 0.02, 0.002)
_MULTI_RACE_SHARES = (0.87, 0.10, 0.022, 0.006, 0.002)  # two, three, four, five, six races

# Household size 1..20 (US-like, with a tail of households larger than 10 persons).
_SIZE_PMF = np.array([0.28, 0.34, 0.15, 0.13, 0.06, 0.025, 0.007, 0.003, 0.0015, 0.001,
                      0.0006, 0.0005, 0.0004, 0.0003, 0.00025, 0.0002, 0.00015, 0.0001,
                      0.0001, 0.0001])
_SIZE_PMF = _SIZE_PMF / _SIZE_PMF.sum()
_ORDINARY_MAX_SIZE = 10  # households up to this size use the ordinary composition model

_GQ_SHARE = 0.025  # share of persons in group quarters
_VACANT_SHARE = 0.10  # share of housing units that are vacant

# Household subtypes (internal, not a column): what the members beyond a couple are.
_ALONE, _CHILDREN, _OTHER_REL, _NONREL, _MULTIGEN, _BOARDING = range(6)
_EXTRA_CODES = np.arange(25, 37, dtype=np.int8)  # RELSHIP 25..36
_EXTRA_PMF: dict[int, tuple[float, ...]] = {
    #            25     26     27     28     29     30     31     32     33     34     35     36
    _CHILDREN: (0.800, 0.025, 0.060, 0.010, 0.015, 0.030, 0.008, 0.007, 0.015, 0.008, 0.004, 0.018),
    _OTHER_REL: (0.100, 0.005, 0.005, 0.250, 0.220, 0.120, 0.040, 0.020, 0.190, 0.010, 0.005, 0.035),
    _NONREL: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0.600, 0.050, 0.350),
    _MULTIGEN: (0.400, 0.010, 0.020, 0.050, 0.030, 0.250, 0.020, 0.080, 0.100, 0.010, 0.005, 0.025),
    _BOARDING: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0.500, 0.050, 0.450),
}
# Householder age (normal mean, sd, min, max) by subtype; couples without others use _COUPLE_AGE.
_HH_AGE: dict[int, tuple[float, float, int, int]] = {
    _ALONE: (61.0, 18.0, 18, 100),
    _CHILDREN: (38.0, 9.0, 18, 90),
    _OTHER_REL: (53.0, 17.0, 18, 95),
    _NONREL: (36.0, 14.0, 18, 90),
    _MULTIGEN: (52.0, 10.0, 40, 85),
    _BOARDING: (45.0, 12.0, 18, 85),
}
_COUPLE_AGE = (58.0, 16.0, 18, 95)

# GQ facility types: (RELSHIP, median size, lognormal sigma, max size, share of facilities,
# age model). Facility shares are chosen so that person shares look like the 2020 Census
# (college housing and correctional facilities large, group homes many and small).
_GQ_TYPES: tuple[tuple[int, float, float, int, float, str], ...] = (
    (37, 120.0, 1.0, 3000, 0.0535, "adult"),     # correctional facilities for adults
    (37, 15.0, 0.6, 200, 0.0120, "juvenile"),    # juvenile facilities
    (37, 70.0, 0.5, 400, 0.0860, "nursing"),     # nursing facilities
    (38, 250.0, 1.0, 3000, 0.0340, "college"),   # college / university housing
    (38, 150.0, 0.8, 2000, 0.0080, "military"),  # military quarters
    (38, 8.0, 0.8, 300, 0.8065, "other"),        # group homes, shelters, other
)

# Tenure (TEN 1..4) by householder age band (<35, 35..64, 65+).
_TEN_PMF = np.array([[0.25, 0.05, 0.68, 0.02],
                     [0.47, 0.18, 0.33, 0.02],
                     [0.25, 0.52, 0.21, 0.02]])


@dataclass
class SyntheticData:
    """The three input tables of spec §1, as pandas DataFrames.

    Code columns hold strings with their leading zeros (pandas string dtype); integer columns
    hold compact signed integers. Columns are in the order of spec §1.

    Attributes:
        persons: One row per person, in random order.
        units: One row per housing unit or GQ facility, sorted by MAFID.
        geo: One row per unit, sorted by MAFID (the same MAFIDs as ``units``).
    """

    persons: pd.DataFrame
    units: pd.DataFrame
    geo: pd.DataFrame


# --------------------------------------------------------------------------------------------
# Small vectorized helpers
# --------------------------------------------------------------------------------------------


@functools.cache
def _digit_table(width: int) -> npt.NDArray[np.bytes_]:
    """Zero-padded ASCII strings of 0 .. 10**width - 1 (numpy ``S<width>`` array)."""
    values = np.arange(10**width)
    powers = 10 ** np.arange(width - 1, -1, -1)
    digits = ((values[:, None] // powers) % 10 + ord("0")).astype(np.uint8)
    return np.ascontiguousarray(digits).view(f"S{width}").ravel()


def _fixed_width(values: IntArray, width: int,
                 offsets_cache: dict[tuple[int, int], pa.Buffer] | None = None) -> pa.Array:
    """Zero-padded decimal strings of non-negative integers, as an Arrow string array.

    The string buffer is gathered from a lookup table of all ``width``-digit strings, which is
    much faster than formatting Python strings one by one. The array is ``large_string``
    (what pandas' Arrow-backed string dtype holds, so no conversion copy is needed).

    Args:
        values: Non-negative integers below ``10**width``.
        width: Number of digits of every string.
        offsets_cache: Optional dict in which the (immutable) offsets buffer is shared between
            arrays of the same length and width, which saves 8 bytes per row and column.

    Returns:
        An Arrow ``large_string`` array with one ``width``-character string per value.
    """
    n = len(values)
    if n and (int(values.min()) < 0 or int(values.max()) >= 10**width):
        raise ValueError(f"value out of range for a {width}-digit code")
    index = values.astype(np.intp, copy=False)
    if width <= 4:
        chars = _digit_table(width)[index]
    else:
        chars = np.empty(n, dtype=f"S{width}")
        grid = chars.view(np.uint8).reshape(n, width)
        grid[:, : width - 3] = _digit_table(width - 3)[index // 1000].view(np.uint8).reshape(
            n, width - 3)
        grid[:, width - 3:] = _digit_table(3)[index % 1000].view(np.uint8).reshape(n, 3)
    key = (n, width)
    offsets = offsets_cache.get(key) if offsets_cache is not None else None
    if offsets is None:
        offsets = pa.py_buffer(np.arange(0, n * width + 1, width, dtype=np.int64))
        if offsets_cache is not None:
            offsets_cache[key] = offsets
    return pa.LargeStringArray.from_buffers(n, offsets, pa.py_buffer(chars))


def _categorical(rng: np.random.Generator, pmf: Sequence[float] | npt.NDArray[np.floating],
                 size: int) -> npt.NDArray[np.intp]:
    """Indices drawn from a categorical distribution (inverse CDF)."""
    cdf = np.cumsum(np.asarray(pmf, dtype=np.float64))
    cdf /= cdf[-1]
    return np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), len(cdf) - 1)


def _categorical_rows(rng: np.random.Generator, pmfs: npt.NDArray[np.floating],
                      row: IntArray) -> npt.NDArray[np.int8]:
    """One categorical draw per element, from the distribution ``pmfs[row[i]]``.

    Memory stays O(n): one comparison per category, not an n x k matrix.
    """
    cdf = np.cumsum(pmfs, axis=1)
    cdf /= cdf[:, -1:]
    u = rng.random(len(row))
    out = np.zeros(len(row), dtype=np.int8)
    for k in range(pmfs.shape[1] - 1):
        out += u >= cdf[row, k]
    return out


def _normal_int(rng: np.random.Generator, mean: float | npt.NDArray[np.floating], sd: float,
                size: int, lo: int | IntArray, hi: int | IntArray) -> npt.NDArray[np.int16]:
    """Rounded, clipped normal integers."""
    x = np.rint(mean + sd * rng.standard_normal(size, dtype=np.float32))
    return np.clip(x, lo, hi).astype(np.int16)


def _sizes_summing_to(rng: np.random.Generator, total: int, mean: float,
                      draw: Callable[[int], IntArray]) -> npt.NDArray[np.int32]:
    """Draw unit sizes until they reach ``total`` persons; the last one is cut to fit exactly."""
    if total <= 0:
        return np.zeros(0, dtype=np.int32)
    chunks: list[npt.NDArray[np.int32]] = []
    acc = 0
    while acc < total:
        k = int((total - acc) / mean * 1.05) + 16
        chunk = draw(k).astype(np.int32)
        chunks.append(chunk)
        acc += int(chunk.sum(dtype=np.int64))
    sizes = np.concatenate(chunks)
    csum = np.cumsum(sizes, dtype=np.int64)
    last = int(np.searchsorted(csum, total))
    sizes = sizes[: last + 1].copy()
    sizes[last] -= np.int32(csum[last] - total)
    return sizes


def _rank_within(mask: npt.NDArray[np.bool_], group: IntArray,
                 starts: IntArray) -> npt.NDArray[np.int32]:
    """1-based running count of ``mask`` within each contiguous group (0 where mask is False)."""
    c = np.cumsum(mask, dtype=np.int32)
    before = np.concatenate([np.zeros(1, np.int32), c])[starts]
    return np.where(mask, c - before[group], 0).astype(np.int32)


def _mix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64 finalizer: a cheap, well-mixed integer hash (for stable synthetic geography)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


# --------------------------------------------------------------------------------------------
# Race and ethnicity
# --------------------------------------------------------------------------------------------


def _race_tables(states: Sequence[str]) -> tuple[npt.NDArray[np.float64],
                                                 npt.NDArray[np.float64]]:
    """Per state: Hispanic share, and race-group pmfs (row ``2*s + hispanic``, 7 groups A..G)."""
    hisp = np.array([_STATES.get(s, _FALLBACK_STATE)[4] for s in states])
    pmfs = np.zeros((2 * len(states), 7))
    for i, s in enumerate(states):
        if s == "72":
            pmfs[2 * i] = _RACE_NON_HISPANIC_PR
            pmfs[2 * i + 1] = _RACE_HISPANIC_PR
            continue
        if s in _NH_OVERRIDES:
            black, aian, asian, nhpi, multi = _NH_OVERRIDES[s]
            white = 1.0 - black - aian - asian - nhpi - multi - _NH_SOR
            pmfs[2 * i] = (white, black, aian, asian, nhpi, _NH_SOR, multi)
        else:
            pmfs[2 * i] = _RACE_NON_HISPANIC_US
        pmfs[2 * i + 1] = _RACE_HISPANIC_US
    return hisp, pmfs


def _multi_race_pmf(two_race: Sequence[float]) -> npt.NDArray[np.float64]:
    """Distribution of the 57 multi-race codes 07..63 (index 0 is code 07)."""
    two = np.asarray(two_race, dtype=np.float64)
    counts = (15, 20, 15, 6, 1)
    parts = [two / two.sum() * _MULTI_RACE_SHARES[0]]
    for share, k in zip(_MULTI_RACE_SHARES[1:], counts[1:]):
        w = 1.0 / np.arange(1, k + 1)  # earlier (White-containing) combinations more common
        parts.append(w / w.sum() * share)
    return np.concatenate(parts)


_MULTI_PMF = np.stack([_multi_race_pmf(_TWO_RACE_NON_HISPANIC), _multi_race_pmf(_TWO_RACE_HISPANIC)])


def _draw_race(rng: np.random.Generator, state: IntArray, hisp_share: npt.NDArray[np.float64],
               race_pmfs: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int8],
                                                            npt.NDArray[np.int8]]:
    """CENHISP (1/2) and CENRACE (1..63) for people in the given states."""
    n = len(state)
    hispanic = rng.random(n) < hisp_share[state]
    group = _categorical_rows(rng, race_pmfs, 2 * state.astype(np.intp) + hispanic)
    race = (group + 1).astype(np.int8)
    multi = np.flatnonzero(group == 6)
    if len(multi):
        race[multi] = 7 + _categorical_rows(rng, _MULTI_PMF, hispanic[multi].astype(np.intp))
    return (hispanic + 1).astype(np.int8), race


# --------------------------------------------------------------------------------------------
# Households
# --------------------------------------------------------------------------------------------


_F32 = npt.NDArray[np.float32]


def _grandchild_age(a: _F32, z: _F32, u: _F32) -> _F32:
    gap = np.clip(np.rint(47 + 7 * z), 34, 70)
    return np.where(a >= gap, a - gap, np.floor(u * (a - 33)))


def _other_relative_age(a: _F32, z: _F32, u: _F32) -> _F32:
    younger = np.floor(u * 2 * np.maximum(a - 10, 1))  # nephews, nieces, cousins
    return np.where(u < 0.5, younger, np.clip(np.rint(a + 15 * z), 0, 105))


def _other_nonrelative_age(a: _F32, z: _F32, u: _F32) -> _F32:
    return np.where(u < 0.2, np.floor(u / 0.2 * 18), np.clip(np.rint(a + 12 * z), 18, 95))


# Age of a household member from the householder's age ``a``, a standard normal ``z`` and a
# uniform ``u``, by RELSHIP. Householders, spouses and partners are 18+, parents and
# parents-in-law at least 15 years older than the householder (and 30+), grandchildren at
# least 34 years younger, children mostly 16+ years younger, children-in-law 18+.
_AGE_RULES: dict[int, Callable[[_F32, _F32, _F32], _F32]] = {
    20: lambda a, z, u: a,
    21: lambda a, z, u: np.clip(np.rint(a - 1 + 4 * z), 18, 100),
    22: lambda a, z, u: np.clip(np.rint(a + 5 * z), 18, 95),
    23: lambda a, z, u: np.clip(np.rint(a - 1 + 4 * z), 18, 100),
    24: lambda a, z, u: np.clip(np.rint(a + 5 * z), 18, 95),
    **{c: (lambda a, z, u: a - np.minimum(np.clip(np.rint(29 + 6 * z), 16, 48), a))
       for c in (25, 26, 27)},
    28: lambda a, z, u: np.clip(np.rint(a + 6 * z), 0, 105),
    29: lambda a, z, u: np.clip(a + np.clip(np.rint(28 + 5 * z), 15, 45), 30, 115),
    30: _grandchild_age,
    31: lambda a, z, u: np.clip(a + np.clip(np.rint(28 + 5 * z), 15, 45), 30, 115),
    32: lambda a, z, u: a - np.clip(np.rint(27 + 5 * z), 15, a - 18),
    33: _other_relative_age,
    34: lambda a, z, u: np.clip(np.rint(a + 6 * z), 18, 95),
    35: lambda a, z, u: np.floor(u * 18),
    36: _other_nonrelative_age,
}


@dataclass
class _Households:
    """Households in generation order, and their persons grouped contiguously by household."""

    size: npt.NDArray[np.int32]
    state: npt.NDArray[np.int16]
    # unit attributes
    npf: npt.NDArray[np.int16]
    hhspan: npt.NDArray[np.int8]
    hhrace: npt.NDArray[np.int8]
    ten: npt.NDArray[np.int8]
    hht: npt.NDArray[np.int8]
    hht2: npt.NDArray[np.int8]
    cplt: npt.NDArray[np.int8]
    # persons
    p_unit: npt.NDArray[np.int32]
    p_age: npt.NDArray[np.int16]
    p_hisp: npt.NDArray[np.int8]
    p_race: npt.NDArray[np.int8]
    p_rel: npt.NDArray[np.int8]


def _households(rng: np.random.Generator, n_persons: int, state_weights: npt.NDArray[np.float64],
                hisp_share: npt.NDArray[np.float64],
                race_pmfs: npt.NDArray[np.float64]) -> _Households:
    """Generate households holding exactly ``n_persons`` persons."""
    mean_size = float(np.arange(1, len(_SIZE_PMF) + 1) @ _SIZE_PMF)
    size = _sizes_summing_to(rng, n_persons, mean_size,
                             lambda k: 1 + _categorical(rng, _SIZE_PMF, k))
    n_hh = len(size)
    state = np.repeat(np.arange(len(state_weights), dtype=np.int16),
                      rng.multinomial(n_hh, state_weights))

    # Couple (RELSHIP of the person in position 1, or 0) and subtype.
    u = rng.random(n_hh)
    married = np.where(size == 2, 0.55, 0.66)
    cohab = np.where(size == 2, 0.13, 0.10)
    couple = np.zeros(n_hh, dtype=np.int8)
    is_married = (size >= 2) & (u < married)
    is_cohab = (size >= 2) & ~is_married & (u < married + cohab)
    same_sex = rng.random(n_hh)
    couple[is_married] = np.where(same_sex[is_married] < 0.012, 23, 21)
    couple[is_cohab] = np.where(same_sex[is_cohab] < 0.035, 24, 22)

    v = rng.random(n_hh)
    has_couple = couple > 0
    subtype = np.full(n_hh, _CHILDREN, dtype=np.int8)
    subtype[size == 1] = _ALONE
    mid = (size >= 2) & (size <= _ORDINARY_MAX_SIZE)
    subtype[mid & has_couple & (v >= 0.94)] = _OTHER_REL
    subtype[mid & has_couple & (v >= 0.97)] = _NONREL
    subtype[mid & ~has_couple & (v >= 0.50)] = _OTHER_REL
    subtype[mid & ~has_couple & (v >= 0.72)] = _NONREL
    big = size > _ORDINARY_MAX_SIZE
    subtype[big] = np.where(v[big] < 0.8, _MULTIGEN, _BOARDING)

    # Householder sex (internal only): probability that the householder is female.
    p_female = np.select(
        [couple == 21, couple == 22, (couple == 23) | (couple == 24), subtype == _ALONE,
         subtype == _CHILDREN, subtype == _OTHER_REL],
        [0.45, 0.45, 0.5, 0.53, 0.72, 0.55], default=0.45)
    female = rng.random(n_hh) < p_female

    # Persons, contiguous per household: position 0 householder, 1 partner if a couple.
    n_p = int(size.sum(dtype=np.int64))
    starts = (np.cumsum(size, dtype=np.int64) - size).astype(np.int64)
    unit = np.repeat(np.arange(n_hh, dtype=np.int32), size)
    pos = (np.arange(n_p, dtype=np.int64) - starts[unit]).astype(np.int32)
    rel = np.full(n_p, 20, dtype=np.int8)
    partner = pos == 1
    partner &= has_couple[unit]
    rel[partner] = couple[unit[partner]]
    extra = np.flatnonzero((pos >= 1) & ~partner)
    extra_subtype = subtype[unit[extra]]
    for st, pmf in _EXTRA_PMF.items():
        idx = extra[extra_subtype == st]
        rel[idx] = _EXTRA_CODES[_categorical(rng, pmf, len(idx))]
    # At most two parents and two parents-in-law per household.
    for code in (29, 31):
        too_many = _rank_within(rel == code, unit, starts) > 2
        rel[too_many] = 33

    def any_in_unit(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        return np.bincount(unit[mask], minlength=n_hh) > 0

    # Householder ages, then everyone else's relative to the householder.
    hh_age = np.zeros(n_hh, dtype=np.int16)
    couple_only = has_couple & (size == 2)
    for st, (mu, sd, lo, hi) in _HH_AGE.items():
        idx = np.flatnonzero((subtype == st) & ~couple_only)
        hh_age[idx] = _normal_int(rng, mu, sd, len(idx), lo, hi)
    idx = np.flatnonzero(couple_only)
    hh_age[idx] = _normal_int(rng, _COUPLE_AGE[0], _COUPLE_AGE[1], len(idx), *_COUPLE_AGE[2:])
    # Grandchildren and children-in-law need an older householder; parents a younger one.
    needs_old = any_in_unit((rel == 30) | (rel == 32)) & (hh_age < 45)
    hh_age[needs_old] = 45 + rng.integers(0, 25, int(needs_old.sum()), dtype=np.int16)
    needs_young = any_in_unit((rel == 29) | (rel == 31)) & (hh_age > 85)
    hh_age[needs_young] = 60 + rng.integers(0, 26, int(needs_young.sum()), dtype=np.int16)

    age = np.empty(n_p, dtype=np.int16)
    for code in range(20, 37):
        idx = np.flatnonzero(rel == code)
        a = hh_age[unit[idx]].astype(np.float32)
        z = rng.standard_normal(len(idx), dtype=np.float32)
        u = rng.random(len(idx), dtype=np.float32)
        age[idx] = np.clip(_AGE_RULES[code](a, z, u), 0, 115)

    # Race and ethnicity: the householder's from the state; others mostly share it.
    p_state = state[unit]
    hisp = np.zeros(n_p, dtype=np.int8)
    race = np.zeros(n_p, dtype=np.int8)
    hh_pos = starts
    hisp[hh_pos], race[hh_pos] = _draw_race(rng, state, hisp_share, race_pmfs)
    hisp[:] = hisp[hh_pos][unit]
    race[:] = race[hh_pos][unit]
    own = np.flatnonzero((pos > 0) & (rng.random(n_p, dtype=np.float32) < 0.10))
    hisp[own], race[own] = _draw_race(rng, p_state[own], hisp_share, race_pmfs)
    del p_state

    # Unit attributes derived from the members.
    is_relative = (rel == 21) | (rel == 23) | ((rel >= 25) & (rel <= 33))
    n_rel = np.bincount(unit[is_relative], minlength=n_hh).astype(np.int16)
    own_u18 = any_in_unit((rel >= 25) & (rel <= 27) & (age < 18))
    has_rel = n_rel > 0
    spouse = (couple == 21) | (couple == 23)
    cohabiting = (couple == 22) | (couple == 24)
    alone = size == 1
    hht = np.select(
        [spouse, has_rel, alone],
        [1, np.where(female, 3, 2), np.where(female, 6, 4)],
        default=np.where(female, 7, 5),
    ).astype(np.int8)
    no_partner = np.select([alone, own_u18, has_rel], [1, 2, 3], default=4)
    hht2 = np.select(
        [spouse, cohabiting],
        [np.where(own_u18, 1, 2), np.where(own_u18, 3, 4)],
        default=np.where(female, 4, 8) + no_partner,
    ).astype(np.int8)
    cplt = np.select([couple == 21, couple == 23, couple == 22, couple == 24],
                     [1, 2, 3, 4], default=5).astype(np.int8)
    npf = np.where(hht <= 3, n_rel + 1, 0).astype(np.int16)
    band = np.digitize(hh_age, [35, 65])
    ten = (1 + _categorical_rows(rng, _TEN_PMF, band)).astype(np.int8)

    return _Households(
        size=size, state=state, npf=npf, hhspan=hisp[hh_pos], hhrace=race[hh_pos], ten=ten,
        hht=hht, hht2=hht2, cplt=cplt,
        p_unit=unit, p_age=age, p_hisp=hisp, p_race=race, p_rel=rel,
    )


# --------------------------------------------------------------------------------------------
# Group quarters
# --------------------------------------------------------------------------------------------


@dataclass
class _GroupQuarters:
    size: npt.NDArray[np.int32]
    state: npt.NDArray[np.int16]
    p_unit: npt.NDArray[np.int32]
    p_age: npt.NDArray[np.int16]
    p_hisp: npt.NDArray[np.int8]
    p_race: npt.NDArray[np.int8]
    p_rel: npt.NDArray[np.int8]


def _group_quarters(rng: np.random.Generator, n_persons: int,
                    state_weights: npt.NDArray[np.float64], hisp_share: npt.NDArray[np.float64],
                    race_pmfs: npt.NDArray[np.float64]) -> _GroupQuarters:
    """Generate GQ facilities holding exactly ``n_persons`` persons."""
    shares = np.array([t[4] for t in _GQ_TYPES])
    shares /= shares.sum()
    medians = np.array([t[1] for t in _GQ_TYPES])
    sigmas = np.array([t[2] for t in _GQ_TYPES])
    # Keep facilities of a small sample small enough that there are several of them.
    caps = np.minimum(np.array([t[3] for t in _GQ_TYPES]), max(10, n_persons // 5))
    drawn_types: list[npt.NDArray[np.intp]] = []

    def draw(k: int) -> IntArray:
        t = _categorical(rng, shares, k)
        drawn_types.append(t)
        s = np.rint(medians[t] * np.exp(sigmas[t] * rng.standard_normal(k)))
        return np.clip(s, 1, caps[t]).astype(np.int32)

    mean = float(np.sum(shares * np.minimum(medians * np.exp(sigmas**2 / 2), caps)))
    size = _sizes_summing_to(rng, n_persons, mean, draw)
    n_f = len(size)
    ftype = (np.concatenate(drawn_types)[:n_f] if drawn_types else np.zeros(0, np.intp))
    state = rng.choice(len(state_weights), size=n_f, p=state_weights).astype(np.int16)

    unit = np.repeat(np.arange(n_f, dtype=np.int32), size)
    pt = ftype[unit]
    n_p = len(unit)
    rel = np.array([t[0] for t in _GQ_TYPES], dtype=np.int8)[pt]
    z = rng.standard_normal(n_p, dtype=np.float32)
    u = rng.random(n_p, dtype=np.float32)
    kinds = [t[5] for t in _GQ_TYPES]
    age = np.select(
        [pt == kinds.index("adult"), pt == kinds.index("juvenile"),
         pt == kinds.index("nursing"), pt == kinds.index("college"),
         pt == kinds.index("military")],
        [np.clip(np.rint(37 + 12 * z), 18, 90), np.where(u < 0.85, 12 + np.floor(u / 0.85 * 6), 18),
         np.clip(np.rint(82 + 9 * z), 40, 110), np.clip(np.rint(20 + 1.8 * z), 16, 40),
         np.clip(np.rint(24 + 5 * z), 17, 50)],
        default=np.where(u < 0.15, np.floor(u / 0.15 * 18), np.clip(np.rint(50 + 20 * z), 18, 100)),
    ).astype(np.int16)
    hisp, race = _draw_race(rng, state[unit], hisp_share, race_pmfs)
    return _GroupQuarters(size=size, state=state, p_unit=unit, p_age=age, p_hisp=hisp,
                          p_race=race, p_rel=rel)


# --------------------------------------------------------------------------------------------
# Geography
# --------------------------------------------------------------------------------------------


def _geography(rng: np.random.Generator, states: Sequence[str],
               unit_state: npt.NDArray[np.int16],
               offsets_cache: dict[tuple[int, int], pa.Buffer],
               geo_seed: int) -> dict[str, pa.Array]:
    """Geo columns (beyond RTYPE and MAFID) for units in the given states.

    Counties follow a Zipf-like size distribution with real county counts; tract, block-group
    and block codes, place and AIAN/NH area are stable functions of the tract (hashes salted by
    ``geo_seed``), so units in one tract agree on everything above the block. The county codes
    of a state and the salt depend only on ``geo_seed`` and the state, not on ``rng``: chunks of
    one state generated separately (see :func:`synthesize`) share one geography.
    """
    n = len(unit_state)
    salt = np.uint64(geo_seed % 2**62)
    county = np.zeros(n, dtype=np.int32)
    tract = np.zeros(n, dtype=np.int32)
    block = np.zeros(n, dtype=np.int32)
    place = np.zeros(n, dtype=np.int32)
    aian = np.zeros(n, dtype=np.int32)
    order = np.argsort(unit_state, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(unit_state, minlength=len(states)))])
    aian_share = {"40": 0.55, "02": 0.30, "35": 0.10, "04": 0.07, "46": 0.09, "30": 0.07,
                  "38": 0.05, "49": 0.02, "53": 0.03, "32": 0.02, "56": 0.03, "16": 0.03,
                  "27": 0.02, "55": 0.02, "06": 0.01, "15": 0.0, "72": 0.0, "11": 0.0}
    for s, code in enumerate(states):
        idx = order[bounds[s]:bounds[s + 1]]
        m = len(idx)
        if m == 0:
            continue
        _, _, pop_k, n_counties, _ = _STATES.get(code, _FALLBACK_STATE)
        w = 1.0 / np.arange(1, n_counties + 1) ** 1.1
        w /= w.sum()
        county_codes = 2 * np.random.default_rng([geo_seed, int(code)]).permutation(n_counties) + 1
        n_tracts = np.clip(np.rint(pop_k * 1000 * w / 4000), 1, 9000).astype(np.int64)
        c = _categorical(rng, w, m)
        t = np.floor(rng.random(m) * n_tracts[c]).astype(np.int64)
        step = np.clip(9000 // n_tracts, 1, 100)[c]
        key = ((np.uint64(int(code)) * np.uint64(1000) + county_codes[c].astype(np.uint64))
               * np.uint64(100_000) + t.astype(np.uint64))
        h = _mix64(key ^ salt)
        suffix = np.where(h % np.uint64(10) < np.uint64(8), 0,
                          1 + (h >> np.uint64(8)) % np.uint64(4)).astype(np.int64)
        n_bg = 1 + ((h >> np.uint64(16)) % np.uint64(4)).astype(np.int64)
        n_blk = 10 + ((h >> np.uint64(24)) % np.uint64(50)).astype(np.int64)
        bg = 1 + np.floor(rng.random(m) * n_bg).astype(np.int64)
        blk = np.floor(rng.random(m) * n_blk).astype(np.int64)
        county[idx] = county_codes[c]
        tract[idx] = (1 + t * step) * 100 + suffix
        block[idx] = bg * 1000 + blk
        # Places group neighbouring tracts; about 60 % of tracts lie in a place.
        hp = _mix64((key - t.astype(np.uint64) + (t // 6).astype(np.uint64))
                    ^ (salt + np.uint64(1)))
        if code == "11":
            place[idx] = 50000
        else:
            in_place = hp % np.uint64(1000) < np.uint64(600)
            place[idx] = np.where(in_place, 1000 + (hp >> np.uint64(10)) % np.uint64(98000), 99999)
        ha = _mix64(key ^ (salt + np.uint64(2)))
        share = aian_share.get(code, 0.003)
        in_aian = ha % np.uint64(10_000) < np.uint64(int(share * 10_000))
        aian[idx] = np.where(in_aian, 1 + (ha >> np.uint64(14)) % np.uint64(5999), 9999)

    info = [_STATES.get(code, _FALLBACK_STATE) for code in states]
    region = np.array([i[0] for i in info], dtype=np.int32)[unit_state]
    division = np.array([i[1] for i in info], dtype=np.int32)[unit_state]
    state_fips = np.array([int(code) for code in states], dtype=np.int32)[unit_state]
    fixed = functools.partial(_fixed_width, offsets_cache=offsets_cache)
    return {
        "TABBLKST": fixed(state_fips, 2),
        "TABBLKCOU": fixed(county, 3),
        "TABTRACTCE": fixed(tract, 6),
        "TABBLK": fixed(block, 4),
        "TABBLKGRPCE": fixed(block // 1000, 1),
        "REGIONCE": fixed(region, 1),
        "DIVISIONCE": fixed(division, 1),
        "PLACEFP": fixed(place, 5),
        "AIANNHCE": fixed(aian, 4),
    }


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _check_states(states: Sequence[str]) -> list[str]:
    if isinstance(states, str):
        raise TypeError("states must be a sequence of 2-digit codes, not a string")
    out = list(states)
    if not out:
        raise ValueError("states must not be empty")
    for s in out:
        if not (isinstance(s, str) and len(s) == 2 and s.isdigit()):
            raise ValueError(f"state code {s!r} is not a 2-digit string")
    if len(set(out)) != len(out):
        raise ValueError("state codes must be distinct")
    return out


def _frame(columns: dict[str, pa.Array | npt.NDArray[np.integer]]) -> pd.DataFrame:
    """A DataFrame over Arrow string columns (pandas string dtype) and numpy integers."""
    table = pa.table({k: (v if isinstance(v, pa.Array) else pa.array(v))
                      for k, v in columns.items()})
    mapper = None
    if int(pd.__version__.split(".")[0]) < 3:  # pandas 3 maps Arrow strings to its str dtype
        mapper = {pa.large_string(): pd.StringDtype("pyarrow")}.get
    return table.to_pandas(types_mapper=mapper, split_blocks=True)


def _state_weights(codes: Sequence[str]) -> npt.NDArray[np.float64]:
    """2020 populations of ``codes`` as weights (uniform if any code is unknown)."""
    if all(c in _STATES for c in codes):
        weights = np.array([_STATES[c][2] for c in codes], dtype=np.float64)
    else:
        weights = np.ones(len(codes))
    return weights / weights.sum()


Block = dict[str, dict[str, "pa.Array | npt.NDArray[np.integer]"]]
"""File stem -> column name -> values (Arrow strings for codes, numpy integers), spec order."""


def _block(rng: np.random.Generator, n_persons: int, codes: list[str], *, mafid_lo: int,
           mafid_hi: int, geo_seed: int) -> Block:
    """Generate ``n_persons`` persons with their units and geo rows, MAFIDs in [lo, hi).

    This is the whole generator for one block of data: :func:`generate` calls it once for
    everything, :func:`synthesize` once per chunk (one state, a few million persons).

    Raises:
        ValueError: If the MAFID range cannot hold the units.
    """
    weights = _state_weights(codes)
    hisp_share, race_pmfs = _race_tables(codes)

    n_gq = int(round(n_persons * _GQ_SHARE))
    hh = _households(rng, n_persons - n_gq, weights, hisp_share, race_pmfs)
    gq = _group_quarters(rng, n_gq, weights, hisp_share, race_pmfs)
    n_hh, n_gq_units = len(hh.size), len(gq.size)
    n_vac = int(round(n_hh * _VACANT_SHARE / (1 - _VACANT_SHARE)))
    vac_state = np.repeat(np.arange(len(codes), dtype=np.int16), rng.multinomial(n_vac, weights))
    n_units = n_hh + n_vac + n_gq_units
    span = mafid_hi - mafid_lo
    if n_units > span:
        raise ValueError("too many units for the MAFID range")

    # MAFIDs: sorted, unique, spread over the range; units get them in random order.
    gap = max(1, span // (2 * n_units))
    mafid_sorted = (mafid_lo - 1 + np.cumsum(rng.integers(1, 2 * gap, n_units), dtype=np.int64)
                    ).astype(np.int32)
    unit_order = rng.permutation(n_units).astype(np.int32)  # row j holds unit unit_order[j]
    rank = np.empty(n_units, dtype=np.int32)
    rank[unit_order] = np.arange(n_units, dtype=np.int32)
    unit_mafid = mafid_sorted[rank]
    del rank

    # Units in generation order (households, vacant units, GQ facilities), then MAFID order.
    def unit_col(hh_vals: IntArray, gq_vals: IntArray | int, dtype: type) -> IntArray:
        gq_arr = np.broadcast_to(np.asarray(gq_vals, dtype=dtype), (n_gq_units,))
        return np.concatenate([hh_vals.astype(dtype), np.zeros(n_vac, dtype=dtype),
                               gq_arr])[unit_order]

    cache: dict[tuple[int, int], pa.Buffer] = {}
    code = functools.partial(_fixed_width, offsets_cache=cache)
    rtype = code(np.concatenate([np.full(n_hh + n_vac, 2, np.int8),
                                 np.full(n_gq_units, 4, np.int8)])[unit_order], 1)
    units = {
        "RTYPE": rtype,
        "MAFID": mafid_sorted,
        "FINAL_POP": unit_col(hh.size, gq.size, np.int32),
        "NPF": unit_col(hh.npf, 0, np.int16),
        "HHSPAN": unit_col(hh.hhspan, 0, np.int8),
        "HHRACE": code(unit_col(hh.hhrace, 0, np.int8), 2),
        "TEN": code(unit_col(hh.ten, 0, np.int8), 1),
        "HHT": code(unit_col(hh.hht, 0, np.int8), 1),
        "HHT2": code(unit_col(hh.hht2, 0, np.int8), 2),
        "CPLT": code(unit_col(hh.cplt, 0, np.int8), 1),
    }
    u_state = np.concatenate([hh.state, vac_state, gq.state])[unit_order]
    geo = {"RTYPE": rtype, "MAFID": mafid_sorted,
           **_geography(rng, codes, u_state, cache, geo_seed)}
    del u_state, unit_order, rtype

    # Persons, shuffled so that file order carries no meaning.
    cache.clear()
    perm = rng.permutation(n_persons)
    p_unit = np.concatenate([hh.p_unit, gq.p_unit + np.int32(n_hh + n_vac)])[perm]

    def person_col(hh_vals: IntArray, gq_vals: IntArray) -> IntArray:
        return np.concatenate([hh_vals, gq_vals])[perm]

    persons = {
        "RTYPE": code(person_col(np.full(len(hh.p_unit), 3, np.int8),
                                 np.full(len(gq.p_unit), 5, np.int8)), 1),
        "MAFID": unit_mafid[p_unit],
        "QAGE": person_col(hh.p_age, gq.p_age).astype(np.int16),
        "CENHISP": person_col(hh.p_hisp, gq.p_hisp).astype(np.int8),
        "CENRACE": code(person_col(hh.p_race, gq.p_race), 2),
        "RELSHIP": code(person_col(hh.p_rel, gq.p_rel), 2),
    }
    block = {"persons": persons, "units": units, "geo": geo}
    for name, columns in block.items():
        assert list(columns) == [c.name for c in FILES[name]], name
    return block


def generate(n_persons: int, states: Sequence[str], *, seed: int | None = None) -> SyntheticData:
    """Generate consistent synthetic persons, units and geo tables, in memory.

    About 2.5 % of persons live in GQ facilities, the rest in households; about 10 % of
    housing units are vacant. Every consistency rule of spec §1 holds, and unit attributes
    (FINAL_POP, NPF, HHSPAN, HHRACE, HHT, HHT2, CPLT) are derived from the unit's persons.
    For data larger than memory, and for files, use :func:`synthesize`.

    Args:
        n_persons: Exact number of persons to generate (at least 1).
        states: Distinct 2-digit state FIPS codes. Units are spread over them roughly in
            proportion to their 2020 populations (uniformly if any code is unknown).
        seed: Seed of the synthetic data (``None`` for a fresh one). It makes the data
            reproducible and is never used for privacy noise.

    Returns:
        The three tables, columns in the order and string forms of spec §1.

    Raises:
        ValueError: If ``n_persons`` < 1 or ``states`` is empty, has duplicates or a code
            that is not two digits.
    """
    codes = _check_states(states)
    if n_persons < 1:
        raise ValueError("n_persons must be at least 1")
    rng = np.random.default_rng(seed)
    geo_seed = int(rng.integers(0, 2**62))
    block = _block(rng, n_persons, codes, mafid_lo=MAFID_MIN, mafid_hi=MAFID_MAX + 1,
                   geo_seed=geo_seed)
    return SyntheticData(persons=_frame(block["persons"]), units=_frame(block["units"]),
                         geo=_frame(block["geo"]))


def _arrow_table(frame: pd.DataFrame, name: str, string_type: pa.DataType) -> pa.Table:
    """The frame's columns in spec order: codes as ``string_type``, integers as ``int32``."""
    columns = FILES[name]
    missing = [c.name for c in columns if c.name not in frame.columns]
    if missing:
        raise ValueError(f"{name}: missing columns {missing}")
    table = pa.Table.from_pandas(frame[[c.name for c in columns]], preserve_index=False)
    return table.cast(_file_schema(name, string_type))


@functools.cache
def _file_schema(name: str, string_type: pa.DataType) -> pa.Schema:
    """Arrow schema of an input file as written: codes as ``string_type``, integers ``int32``."""
    return pa.schema([pa.field(c.name, string_type if c.kind is ColumnKind.CODE else pa.int32())
                      for c in FILES[name]])


def _block_table(columns: dict[str, pa.Array | npt.NDArray[np.integer]], name: str,
                 string_type: pa.DataType) -> pa.Table:
    """One stem of a :data:`Block` as an Arrow table of the written schema."""
    schema = _file_schema(name, string_type)
    arrays = []
    for field_ in schema:
        v = columns[field_.name]
        arrays.append(v.cast(field_.type) if isinstance(v, pa.Array)
                      else pa.array(np.asarray(v, dtype=np.int32)))
    return pa.Table.from_arrays(arrays, schema=schema)


def _write_csv_header(sink: pa.NativeFile, names: Sequence[str]) -> None:
    # pyarrow quotes header names even with quoting disabled: the header is written by hand.
    sink.write((",".join(names) + "\n").encode("ascii"))


_CSV_OPTIONS = pacsv.WriteOptions(include_header=False, quoting_style="none", batch_size=1 << 16)


def write(data: SyntheticData, directory: Path, *,
          fmt: Literal["csv", "parquet"] = "csv") -> None:
    """Write ``persons``, ``units`` and ``geo`` files into ``directory``.

    CSV files are comma-separated with an unquoted header row, no index column and no quoting
    (codes keep their leading zeros); Parquet files have the same columns with code columns as
    Arrow ``string`` and integer columns as ``int32``.

    Args:
        data: The tables to write.
        directory: Target folder (created if missing). Existing files of the same names are
            replaced.
        fmt: ``"csv"`` or ``"parquet"``.

    Raises:
        ValueError: If ``fmt`` is unknown or a table lacks a column of spec §1.
    """
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"unknown format {fmt!r}; use 'csv' or 'parquet'")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("persons", "units", "geo"):
        path = directory / f"{name}.{fmt}"
        if fmt == "parquet":
            pq.write_table(_arrow_table(getattr(data, name), name, pa.string()), path)
            continue
        # Pandas holds Arrow large_string: writing it as is avoids a copy.
        table = _arrow_table(getattr(data, name), name, pa.large_string())
        with pa.OSFile(str(path), "wb") as sink:
            _write_csv_header(sink, table.column_names)
            pacsv.write_csv(table, sink, _CSV_OPTIONS)


# --------------------------------------------------------------------------------------------
# Data of any size, written chunk by chunk
# --------------------------------------------------------------------------------------------

FORMATS = ("csv", "parquet", "parquet-partitioned")
"""Output formats of :func:`synthesize`."""
Format = Literal["csv", "parquet", "parquet-partitioned"]

US_STATES: tuple[str, ...] = tuple(sorted(c for c in _STATES if c != "72"))
"""The 50 states and DC: the ``state_filter`` of the production US run."""
PUERTO_RICO = "72"
PARTITION_KEY = "TABBLKST"
"""Hive partition key of ``parquet-partitioned`` output: ``persons/TABBLKST=06/part-0.parquet``."""
DEFAULT_CHUNK_PERSONS = 4_000_000
"""Persons generated at once: memory is about 200 bytes a person of the chunk (~0.8 GB)."""
_PARQUET_ROW_GROUP = 1 << 20
_STEMS = ("persons", "units", "geo")


def resolve_states(spec: str | Sequence[str]) -> dict[str, list[str]]:
    """Datasets to generate: sub-folder name ("" for the output folder itself) -> states.

    Args:
        spec: ``"us"`` (the 50 states and DC), ``"pr"`` (Puerto Rico alone), ``"all"`` (both,
            each as its own dataset in ``us/`` and ``pr/``), a comma-separated list of 2-digit
            codes, or a sequence of codes.

    Raises:
        ValueError: An unknown code, a duplicate, or Puerto Rico listed with states (Puerto Rico
            is always its own dataset, as in production: spec §2, §4).
    """
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key == "us":
            return {"": list(US_STATES)}
        if key == "pr":
            return {"": [PUERTO_RICO]}
        if key == "all":
            return {"us": list(US_STATES), "pr": [PUERTO_RICO]}
        codes = [c.strip() for c in spec.split(",") if c.strip()]
    else:
        codes = list(spec)
    codes = _check_states(codes)
    unknown = [c for c in codes if c not in _STATES]
    if unknown:
        raise ValueError(f"unknown state code(s) {', '.join(unknown)}; use 2020 FIPS codes")
    if PUERTO_RICO in codes and len(codes) > 1:
        raise ValueError("Puerto Rico (72) is its own dataset: use --states pr, or all for both")
    return {"": codes}


def _allocate(total: int, weights: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainders)."""
    exact = total * weights / weights.sum()
    out = np.floor(exact).astype(np.int64)
    short = total - int(out.sum())
    if short:
        out[np.argsort(-(exact - out), kind="stable")[:short]] += 1
    return out


@dataclass(frozen=True)
class Chunk:
    """One unit of generation: persons of one state, with their own MAFID range and seed.

    Attributes:
        dataset: Sub-folder of the output ("" for the output folder itself).
        state: The state's 2-digit code.
        n_persons: Persons in the chunk.
        mafid_lo: First MAFID of the chunk's range.
        mafid_hi: One past the last MAFID of the chunk's range (ranges never overlap).
        seed: Independent seed stream of the chunk.
    """

    dataset: str
    state: str
    n_persons: int
    mafid_lo: int
    mafid_hi: int
    seed: np.random.SeedSequence


@dataclass(frozen=True)
class ChunkPlan:
    """The chunks of one generation and the seeds that make it reproducible.

    Attributes:
        chunks: The chunks in writing order (dataset, then state).
        entropy: Entropy of the root seed: the ``seed`` given, or the fresh one drawn.
        geo_seed: Seed of the geography shared by all chunks (county codes, tract hashes).
    """

    chunks: list[Chunk]
    entropy: int
    geo_seed: int


def plan_chunks(n_persons: int, datasets: dict[str, list[str]], *, seed: int | None,
                chunk_persons: int = DEFAULT_CHUNK_PERSONS) -> ChunkPlan:
    """Cut the generation of ``n_persons`` into chunks of at most ``chunk_persons``.

    Persons are shared out over every state of every dataset in proportion to the 2020
    populations; a state larger than ``chunk_persons`` is cut into near-equal chunks. The MAFID
    range is cut into consecutive pieces in proportion to the chunks' persons, so MAFIDs are
    unique across all chunks and datasets. Each chunk gets its own child of one
    :class:`numpy.random.SeedSequence`, so the data is fully determined by
    (``n_persons``, the states, ``seed``, ``chunk_persons``).


    Raises:
        ValueError: ``n_persons`` < 1, ``chunk_persons`` < 1, or more persons than the MAFID
            range can house.
    """
    if n_persons < 1:
        raise ValueError("n_persons must be at least 1")
    if chunk_persons < 1:
        raise ValueError("chunk_persons must be at least 1")
    if n_persons > (MAFID_MAX - MAFID_MIN + 1):
        raise ValueError("too many persons for the MAFID range")
    pairs = [(name, code) for name, codes in datasets.items() for code in codes]
    per_state = _allocate(n_persons, _state_weights([c for _, c in pairs]))
    sizes: list[tuple[str, str, int]] = []
    for (name, code), n in zip(pairs, per_state.tolist()):
        k = -(-n // chunk_persons)
        sizes.extend((name, code, int(m)) for m in _allocate(n, np.ones(k)) if m > 0)
    root = np.random.SeedSequence(seed)
    children = root.spawn(len(sizes) + 1)  # the last one seeds the shared geography
    bounds = MAFID_MIN + (np.cumsum([0] + [m for _, _, m in sizes], dtype=np.float64)
                          * (MAFID_MAX - MAFID_MIN + 1) / n_persons).astype(np.int64)
    chunks = [Chunk(name, code, m, int(bounds[i]), int(bounds[i + 1]), children[i])
              for i, (name, code, m) in enumerate(sizes)]
    assert isinstance(root.entropy, int)
    geo_seed = int(children[-1].generate_state(1, np.uint64)[0] >> np.uint64(2))
    return ChunkPlan(chunks, root.entropy, geo_seed)


class _Sink:
    """Writes the chunks of one dataset to its files (base class: one writer per stem)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, state: str, tables: dict[str, pa.Table]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @staticmethod
    def string_type() -> pa.DataType:
        return pa.string()


class _CsvSink(_Sink):
    """``persons.csv``, ``units.csv``, ``geo.csv``: one header row, chunks appended."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.files = {stem: pa.OSFile(str(directory / f"{stem}.csv"), "wb") for stem in _STEMS}
        for stem, sink in self.files.items():
            _write_csv_header(sink, [c.name for c in FILES[stem]])

    @staticmethod
    def string_type() -> pa.DataType:
        return pa.large_string()  # what the generator holds: no conversion copy

    def write(self, state: str, tables: dict[str, pa.Table]) -> None:
        for stem, table in tables.items():
            pacsv.write_csv(table, self.files[stem], _CSV_OPTIONS)

    def close(self) -> None:
        for sink in self.files.values():
            sink.close()


class _ParquetSink(_Sink):
    """``persons.parquet``, ``units.parquet``, ``geo.parquet``: one row group per chunk part."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.writers = {stem: pq.ParquetWriter(directory / f"{stem}.parquet",
                                               _file_schema(stem, pa.string()))
                        for stem in _STEMS}

    def write(self, state: str, tables: dict[str, pa.Table]) -> None:
        for stem, table in tables.items():
            self.writers[stem].write_table(table, row_group_size=_PARQUET_ROW_GROUP)

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


class _PartitionedSink(_Sink):
    """``<stem>/TABBLKST=<state>/part-0.parquet``: one file per state and stem.

    The chunks of a state arrive one after the other, so one state's files are open at a time.
    """

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.state: str | None = None
        self.writers: dict[str, pq.ParquetWriter] = {}

    def write(self, state: str, tables: dict[str, pa.Table]) -> None:
        if state != self.state:
            self.close()
            self.state = state
            for stem in _STEMS:
                folder = self.directory / stem / f"{PARTITION_KEY}={state}"
                folder.mkdir(parents=True, exist_ok=True)
                self.writers[stem] = pq.ParquetWriter(folder / "part-0.parquet",
                                                      _file_schema(stem, pa.string()))
        for stem, table in tables.items():
            self.writers[stem].write_table(table, row_group_size=_PARQUET_ROW_GROUP)

    def close(self) -> None:
        for w in self.writers.values():
            w.close()
        self.writers.clear()
        self.state = None


_SINKS: dict[str, type[_Sink]] = {"csv": _CsvSink, "parquet": _ParquetSink,
                                  "parquet-partitioned": _PartitionedSink}


def _input_entries(directory: Path) -> list[Path]:
    """Input files or folders of any format in ``directory``, and a previous ``synth.json``."""
    names = [f"{stem}{ext}" for stem in _STEMS for ext in (".csv", ".parquet", "")]
    return [directory / n for n in [*names, "synth.json"] if (directory / n).exists()]


@dataclass
class SynthesisResult:
    """What :func:`synthesize` wrote.

    Attributes:
        datasets: Dataset folder -> its states.
        n_persons: Persons written in all.
        n_units: Units (housing units and GQ facilities) written in all.
        seed: Entropy of the root seed (reproduces the data with the same arguments).
        seconds: Wall time.
    """

    datasets: dict[Path, list[str]]
    n_persons: int
    n_units: int
    seed: int
    seconds: float


def synthesize(directory: Path, n_persons: int, states: str | Sequence[str] = "us", *,
               fmt: Format = "csv", seed: int | None = None,
               chunk_persons: int = DEFAULT_CHUNK_PERSONS, overwrite: bool = False,
               progress: Callable[[int, int], None] | None = None) -> SynthesisResult:
    """Generate and write synthetic inputs of any size in bounded memory.

    Data is generated chunk by chunk (:func:`plan_chunks`: one state, at most
    ``chunk_persons`` persons, its own seed stream and MAFID range) and appended to the files,
    so memory depends on ``chunk_persons``, not on ``n_persons``. Formats:

    * ``csv``: ``persons.csv``, ``units.csv``, ``geo.csv`` -- the production format;
    * ``parquet``: ``persons.parquet``, ``units.parquet``, ``geo.parquet``;
    * ``parquet-partitioned``: a folder per file, partitioned by state in the Hive layout,
      ``persons/TABBLKST=06/part-0.parquet`` (every record in the folder of its unit's
      state; the files hold exactly the columns of spec §1, geo's ``TABBLKST`` included).

    Files are written into a hidden staging folder and moved into place when complete, with a
    ``synth.json`` recording the arguments and the seed. With ``states="all"`` the 50 states
    and DC go to ``directory/us`` and Puerto Rico to ``directory/pr`` (separate datasets, as
    production runs them), the persons shared out by population.

    Args:
        directory: Output folder.
        n_persons: Persons to generate in all (at least 1).
        states: See :func:`resolve_states`.
        fmt: Output format.
        seed: Seed of the synthetic data (None: fresh; the one used is returned). Never used
            for privacy noise.
        chunk_persons: Persons generated at once.
        overwrite: Replace existing input files in the target folder(s); without it, existing
            inputs are an error (a folder holding both CSV and Parquet would be ambiguous).
        progress: Called with (persons written, n_persons) after each chunk.

    Raises:
        ValueError: Bad arguments.
        FileExistsError: The target folder holds inputs and ``overwrite`` is False.
    """
    import json
    import shutil
    import time
    import uuid

    if fmt not in _SINKS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    start = time.perf_counter()
    datasets = resolve_states(states)
    plan = plan_chunks(n_persons, datasets, seed=seed, chunk_persons=chunk_persons)
    directory = Path(directory)
    targets = {name: directory / name if name else directory for name in datasets}
    for target in targets.values():
        existing = _input_entries(target)
        if existing and not overwrite:
            raise FileExistsError(f"{target} already holds input files")
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / f".synth-staging-{uuid.uuid4().hex[:8]}"
    n_units = 0
    written = 0
    sinks: dict[str, _Sink] = {}
    try:
        try:
            for name in datasets:
                sinks[name] = _SINKS[fmt](staging / (name or "data"))
            for chunk in plan.chunks:
                rng = np.random.default_rng(chunk.seed)
                block = _block(rng, chunk.n_persons, [chunk.state], mafid_lo=chunk.mafid_lo,
                               mafid_hi=chunk.mafid_hi, geo_seed=plan.geo_seed)
                sink = sinks[chunk.dataset]
                tables = {stem: _block_table(block[stem], stem, sink.string_type())
                          for stem in _STEMS}
                del block
                n_units += tables["units"].num_rows
                sink.write(chunk.state, tables)
                del tables
                written += chunk.n_persons
                if progress is not None:
                    progress(written, n_persons)
        finally:
            for sink in sinks.values():
                sink.close()
        for name, target in targets.items():
            staged = staging / (name or "data")
            (staged / "synth.json").write_text(json.dumps({
                "generator": "phsafe.synthetic", "persons_requested": n_persons,
                "persons": sum(c.n_persons for c in plan.chunks if c.dataset == name),
                "states": datasets[name], "format": fmt, "seed": plan.entropy,
                "chunk_persons": chunk_persons,
                "note": "synthetic data; the seed is never used for privacy noise",
            }, indent=1) + "\n")
            target.mkdir(parents=True, exist_ok=True)
            for old in _input_entries(target):
                shutil.rmtree(old) if old.is_dir() else old.unlink()
            for entry in staged.iterdir():
                entry.rename(target / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return SynthesisResult({targets[n]: codes for n, codes in datasets.items()}, written, n_units,
                           plan.entropy, time.perf_counter() - start)

