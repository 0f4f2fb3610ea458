"""Offline audit of the privacy-loss ledger (:mod:`phsafe.ledger`).

* :mod:`phsafe.audit.verify` -- recompute the chain, check checkpoints and signatures, sums
  against caps, and released outputs against what the ledger logged.
* :mod:`phsafe.audit.report` -- the auditors' Markdown and HTML report, with (epsilon, delta)
  conversions.
* :mod:`phsafe.audit.empirical` -- the empirical privacy audit: the release code run on generated
  neighbouring datasets, a statistically valid lower bound on its privacy loss.
* :mod:`phsafe.cli.audit` -- the ``phsafe audit`` command group.

An auditor needs only the ledger, the outputs and the operator's public key; nothing here trusts
the operator's word.
"""
