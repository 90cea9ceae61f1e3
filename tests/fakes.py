"""The only fakes in the test suite: stand-ins for parts that cannot run here.

Everything else in tests is real (Lightning Trainer, torch.distributed on gloo,
sky.Task/sky.Resources, boto3 against moto's standalone server).
"""

from __future__ import annotations
