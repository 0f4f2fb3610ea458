"""The Great Expectations suites (``*.json``), installed as the package data ``phsafe.expectations``.

This folder is mapped to ``phsafe/expectations/`` when the project is built (``pyproject.toml``,
``[tool.setuptools] package-dir``); :func:`phsafe.validation._suites.suites_dir` reads it with
:mod:`importlib.resources`. It holds no code.
"""
