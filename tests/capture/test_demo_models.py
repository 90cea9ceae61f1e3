"""Capture on code we did not write: Lightning's demo Transformer and CNN (``Net``).

The demos are used as shipped; only the data is replaced (the Transformer's WikiText2
would download), by random tokens and random images of the demo's own shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos import LightningTransformer
from lightning.pytorch.demos.boring_classes import Net
from torch.utils.data import DataLoader, TensorDataset

from lightning_srifty import SriftyCallback
from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.profile import Profile
from lightning_srifty.io.checkpoint_store import open_store

VOCAB = 1000
TOKENS = 35
D_MODEL = 200  # the demo Transformer's default ninp
CNN_BATCH = 16
MATMUL_TYPES = ("Linear", "Conv2d", "MultiheadAttention", "NonDynamicallyQuantizableLinear")


class SyntheticTransformer(LightningTransformer):
    """The demo, with random tokens instead of the WikiText2 download."""

    def prepare_data(self) -> None:
        """Nothing to download."""

    def train_dataloader(self) -> DataLoader:
        tokens = torch.randint(0, VOCAB, (256, TOKENS), generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(tokens, torch.roll(tokens, -1, 1)), batch_size=8)


class CnnModule(pl.LightningModule):
    """A user's module around the demo ``Net``, calling ``self.net(x)`` in training_step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.nll_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        images = torch.randn(128, 1, 28, 28, generator=g)
        return DataLoader(
            TensorDataset(images, torch.randint(0, 10, (128,), generator=g)), batch_size=CNN_BATCH
        )


def _profile(model: pl.LightningModule, root: Path, accumulate: int = 1, **cb: Any) -> Profile:
    pl.seed_everything(0)
    callback = SriftyCallback(warmup_steps=2, profile_steps=4, verbose=False, **cb)
    pl.Trainer(
        max_steps=8,
        accelerator="cpu",
        devices=1,
        default_root_dir=root,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=accumulate,
        callbacks=[callback],
    ).fit(model)
    assert callback.profile is not None
    return callback.profile


@pytest.fixture(scope="module")
def transformer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Profile, LightningTransformer]:
    model = SyntheticTransformer(vocab_size=VOCAB)
    return _profile(model, tmp_path_factory.mktemp("tx")), model


@pytest.fixture(scope="module")
def cnn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Profile, CnnModule]:
    model = CnnModule()
    return _profile(model, tmp_path_factory.mktemp("cnn")), model


def _parameter_share(profile: Profile, model: torch.nn.Module) -> float:
    return sum(x.param_count for x in profile.layers) / sum(p.numel() for p in model.parameters())


def test_transformer_records_hold_every_parameter_once(
    transformer: tuple[Profile, LightningTransformer],
) -> None:
    profile, model = transformer
    assert _parameter_share(profile, model) == 1.0  # each parameter in exactly one record
    attention = [x for x in profile.layers if x.module_type == "MultiheadAttention"]
    assert len(attention) == 6  # 2 encoder self, 2 decoder self, 2 decoder cross
    # in_proj (3 d x d + 3 d) it owns directly, plus out_proj (d x d + d) it uses.
    assert {x.param_count for x in attention} == {4 * D_MODEL * D_MODEL + 4 * D_MODEL}
    assert not any(x.name.endswith("out_proj") for x in profile.layers)


def test_transformer_layer_times_cover_the_forward_pass(
    transformer: tuple[Profile, LightningTransformer],
) -> None:
    profile, _ = transformer
    covered = sum(x.forward_s for x in profile.layers) / profile.steps.forward_s
    assert 0.7 <= covered <= 1.01
    backward = sum(x.backward_s for x in profile.layers) / profile.steps.backward_s
    assert backward <= 1.01  # self times: nested modules are not counted twice


def test_transformer_matmul_layers_have_flops_that_add_up(
    transformer: tuple[Profile, LightningTransformer],
) -> None:
    profile, _ = transformer
    matmuls = [x for x in profile.layers if x.module_type in MATMUL_TYPES]
    assert matmuls and all(x.flops > 0 for x in matmuls)
    # Every counted op sits in some layer: nothing double-counted, nothing lost.
    assert sum(x.flops for x in profile.layers) == pytest.approx(profile.flops_per_step, rel=0.02)


def test_transformer_blocks_follow_the_wrapper(
    transformer: tuple[Profile, LightningTransformer],
) -> None:
    profile, _ = transformer
    names = [b.name for b in profile.blocks]
    assert set(names) == {
        "model",  # the demo Transformer's own ops (scaling, log_softmax)
        "model.embedding",
        "model.pos_encoder",
        "model.transformer",
        "model.decoder",
    }


def test_cnn_flops_land_on_layers_called_through_self_net(
    cnn: tuple[Profile, CnnModule],
) -> None:
    profile, model = cnn
    assert _parameter_share(profile, model) == 1.0
    flops = {x.name: x.flops for x in profile.layers}
    conv1 = 2 * CNN_BATCH * 32 * 26 * 26 * (1 * 3 * 3)
    conv2 = 2 * CNN_BATCH * 64 * 24 * 24 * (32 * 3 * 3)
    fc1 = 2 * CNN_BATCH * 9216 * 128
    # Backward: weights' gradients always, the input's only where it needs one.
    assert flops["net.conv1"] == pytest.approx(2 * conv1)
    assert flops["net.conv2"] == pytest.approx(3 * conv2)
    assert flops["net.fc1"] == pytest.approx(3 * fc1)
    # Net's own forward (relu, max-pool, log_softmax) is a record of its own.
    own = next(x for x in profile.layers if x.name == "net")
    assert own.module_type == "Net" and own.forward_s > 0
    covered = sum(x.forward_s for x in profile.layers) / profile.steps.forward_s
    assert 0.7 <= covered <= 1.01


def test_accumulation_profiles_optimizer_steps(tmp_path: Path) -> None:
    one = _profile(CnnModule(), tmp_path / "one")
    store = tmp_path / "store"
    env = {
        proto.ENV_MODE: proto.MODE_PROFILE,
        proto.ENV_CHECKPOINT_URI: str(store),
        proto.ENV_PROFILE_PATH: str(tmp_path / "two.json"),
        proto.ENV_IMDS: "off",
    }
    two = _profile(CnnModule(), tmp_path / "two", accumulate=2, env=env)
    assert two.environment.accumulate_grad_batches == 2
    assert two.environment.step_batch_size == 2 * CNN_BATCH
    assert two.steps.measured_steps == 4
    # The FLOP count and the forward span both micro-batches of a step.
    assert two.flops_per_step == pytest.approx(2 * one.flops_per_step)
    layer_forward = sum(x.forward_s for x in two.layers)
    assert 0.7 <= layer_forward / two.steps.forward_s <= 1.01
    # The window counts optimizer updates (2 of warm-up + 4); the checkpoint records the
    # launcher's steps, batches of the training loop: two per update.
    assert open_store(str(store)).refs()[0].step == 2 * (2 + 4)
    limits = two.extra["trainer"]
    assert limits["steps_per_epoch"] == 128 // CNN_BATCH // 2
    assert limits["batches_per_epoch"] == 128 // CNN_BATCH
    assert limits["optimizer_steps_per_batch"] == pytest.approx(0.5)
    assert limits["automatic_optimization"] is True


@pytest.mark.parametrize("fixture", ["transformer", "cnn"])
def test_no_gpu_prediction_falls_below_the_profiles_floors(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    """A CPU profile priced on every GPU AWS sells: the host time it measured (data
    loading, Python, the framework) is kept as host time, and the device work cannot
    run faster than its FLOPs at the GPU's peak nor than its kernel launches (5 us
    each, the low end of HolisticTraceAnalysis's 5-20 us). Real profiles, the shipped
    model."""
    from lightning_srifty.core.cluster import Cluster, ClusterGroup
    from lightning_srifty.core.perfmodel import PerformanceModel
    from lightning_srifty.io.calibration_io import load_default_calibration
    from lightning_srifty.io.catalog_io import load_gpu_specs, planning_offers

    profile, _ = request.getfixturevalue(fixture)
    steps = profile.steps
    host_s = steps.step.mean_s - (steps.forward_s + steps.backward_s + steps.optimizer_s)
    assert host_s > 0  # the profile measured some host time
    flops = sum(x.flops for x in profile.layers)
    assert flops > 0
    specs = load_gpu_specs()
    model = PerformanceModel(specs, load_default_calibration())
    seen = set()
    for offer in planning_offers("bundled", profile.environment.accelerator):
        if offer.accelerator in seen or offer.accelerator not in specs:
            continue
        seen.add(offer.accelerator)
        spec = specs[offer.accelerator]
        peak = 1e12 * max(spec.fp16_tflops, spec.tf32_tflops, spec.fp32_tflops)
        step = model.predict(profile, Cluster((ClusterGroup(offer, 1, 1),))).step_s
        assert step >= host_s * (1 - 1e-9), f"{offer.accelerator}: {step} < host {host_s}"
        assert step >= host_s + flops / peak * (1 - 1e-9), offer.accelerator
        # ... nor faster than its kernel launches: >= 3 per layer with parameters, 2 else.
        launches = sum(3 if x.param_count else 2 for x in profile.layers)
        assert step >= host_s + launches * 5e-6 * (1 - 1e-9), offer.accelerator
    assert len(seen) >= 5  # T4, A10G, L4, V100, A100, H100 ... all priced
