"""PHSafe: differentially private tabulation of the 2020 Census S-DHC tables.

The library is Prefect-free and organised by pipeline stage:

* :mod:`phsafe.config` -- the production ``config.json`` as validated, typed models.
* :mod:`phsafe.schema` -- input columns, code lists and their compact encodings.
* :mod:`phsafe.reader` -- CSV/Parquet readers, state filter and geography rules.
* :mod:`phsafe.iterations` -- the race/ethnicity iteration mapping (written once).
* :mod:`phsafe.tables` -- one declarative definition per table.
* :mod:`phsafe.truncation` -- truncate-and-join (Algorithm 3 of the PHSafe paper).
* :mod:`phsafe.tabulate` -- exact count vectors over the full public domain.
* :mod:`phsafe.noise` -- the single place where noise is drawn.
* :mod:`phsafe.outputs` -- output tables, atomic publication and manifest.
* :mod:`phsafe.engine` -- the private and non-private runs, stage by stage.
"""

__version__ = "0.1.0"
