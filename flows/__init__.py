"""Prefect flows of the S-DHC production runs (see ``flows/sdhc.py``)."""
