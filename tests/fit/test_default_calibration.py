"""The shipped calibration is the output of its recipe (``make default-calibration``).

Refitting on exactly the trace sets its ``sources`` name must give every physics
constant back within 5 % and the same NCCL algorithm: a constant that moved further
would mean the file records where an optimiser happened to stop, not what the data
say. Needs ``../shared/data``; takes about a minute (one full physics fit).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_srifty.fit.calibration import PRIORS, calibrate_traces
from lightning_srifty.io.calibration_io import load_default_calibration
from lightning_srifty.io.catalog_io import load_gpu_specs
from lightning_srifty.io.traces import load_traces

pytestmark = pytest.mark.slow

TOLERANCE = 0.05


def test_the_shipped_calibration_is_reproduced_by_its_recipe(shared_data: Path) -> None:
    shipped = load_default_calibration()
    assert len(shipped.sources) >= 3
    sets = [(s.name, load_traces(shared_data / s.name)) for s in shipped.sources]
    for (name, traces), source in zip(sets, shipped.sources, strict=True):
        assert traces.hardware.fingerprint == source.fingerprint, name
    refit = calibrate_traces(sets, gpu_specs=load_gpu_specs(), learned=False, conformal=False)
    assert refit.physics.inter_algorithm == shipped.physics.inter_algorithm
    old, new = shipped.physics.to_dict(), refit.physics.to_dict()
    off = {k: new[k] / old[k] for k in old if abs(new[k] / old[k] - 1.0) > TOLERANCE}
    assert off == {}, f"constants more than 5 % off the shipped file: {off}"
    # no shipped set ran on EFA or NVLink/PCIe peer links (pods): those keep their priors
    for name in ("efa_efficiency", "nvlink_efficiency", "pcie_efficiency"):
        assert old[name] == pytest.approx(PRIORS[name].centre)
