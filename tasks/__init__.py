"""Thin Prefect tasks over the :mod:`phsafe` library (see ``tasks/pipeline.py``)."""
