"""Fitting the performance model to measurements, and judging it on held-out rows.

:mod:`lightning_srifty.fit.calibration` fits a calibration (scipy least squares,
scikit-learn trees); :mod:`lightning_srifty.fit.validation` runs
the held-out protocols (``lomo``, ``scale-out``, ``unseen-hardware``, ``probed``). Reading and
writing calibration files stays in :mod:`lightning_srifty.io.calibration_io`.
"""

PROTOCOLS = ("lomo", "scale-out", "unseen-hardware", "probed")
"""The held-out protocols of :mod:`lightning_srifty.fit.validation` (kept here so the CLI
can list them without importing the fitting code)."""
