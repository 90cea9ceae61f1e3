"""``srifty-launch``'s journey: profile → plan → confirm → relaunch → watch → resume.

This module joins the stages; each stage lives elsewhere (profiling run, planner,
backends, controller). It owns no UI: the CLI passes a :class:`LauncherUI` that prints
and asks. That keeps the flow testable end to end with a silent UI.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib.util
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.catalog import Offer
from lightning_srifty.core.cluster import Cluster, ClusterGroup, Plan
from lightning_srifty.core.errors import (
    ConfigError,
    InfeasibleError,
    LaunchError,
    ScriptLimitsReachedError,
)
from lightning_srifty.core.links import loopback_links
from lightning_srifty.core.monitor import Expectation, Snapshot
from lightning_srifty.core.perfmodel import PerformanceModel
from lightning_srifty.core.planner import (
    PlanRequest,
    PlanResult,
    on_shared_cores,
    plan,
    plan_pinned,
    predict_per_step,
    profile_blocked_share,
    profile_core_share,
    target_steps_at_base,
)
from lightning_srifty.core.probing import (
    PROBE_MODES,
    ProbeRecord,
    decide_probes,
    interval_value,
    link_evidence,
    probe_seconds,
)
from lightning_srifty.core.profile import Profile
from lightning_srifty.core.script_trainer import ScriptStop, ScriptTrainer
from lightning_srifty.core.spot import POLICY_NAMES, make_policy, young_daly_interval
from lightning_srifty.core.steps import StepLedger
from lightning_srifty.core.units import format_hours, format_money, format_seconds
from lightning_srifty.launch import signals
from lightning_srifty.launch.backend import Backend
from lightning_srifty.launch.controller import (
    STALL_TIMEOUT_S,
    Controller,
    Migration,
    PreemptionSource,
    RunSummary,
)
from lightning_srifty.launch.feedback import RanOn, write_feedback
from lightning_srifty.launch.local_backend import LocalBackend, LocalTopology
from lightning_srifty.launch.migration import (
    Candidates,
    CandidateSource,
    Decision,
    PolicyDecider,
    plan_key,
)
from lightning_srifty.launch.profiling import ProfileRun, run_profile
from lightning_srifty.launch.refine import Refiner
from lightning_srifty.launch.runs import (
    claim_run_dir,
    next_attempt,
    read_startups,
    record_startup,
    write_run_record,
)

if TYPE_CHECKING:
    from lightning_srifty.io.checkpoint_store import CheckpointRef, CheckpointStore

BACKENDS = ("local", "sky", "sky-jobs")
SKY_BACKENDS = ("sky", "sky-jobs")
PROFILE_STARTUP = "profile"
"""The start-up record of the profiling run (``startups.json``): no backend's, so it
never prices a launch, but it bounds how long an attempt's start-up may be silent."""
SPOT_CANDIDATES = 40
"""Ranked spot plans considered after a preemption (one per offer is kept)."""
CLOUD_WAIT_S = 60.0
"""How long to wait for spot, when the policy waits, before asking again (cloud)."""
LOCAL_WAIT_S = 2.0
"""The same on the local backend, whose runs last seconds."""
CLOUD_POLICY_EVERY_S = 300.0
"""While on on-demand, how often the spot policy is asked whether to go back (cloud)."""
LOCAL_POLICY_EVERY_S = 2.0
"""The same on the local backend."""
MANAGED_TOP_K = 30
"""Plans ranked for ``--backend sky-jobs``, from which the same-shape ones are ordered."""
LOOPBACK_GBPS = 40.0
"""Nominal bandwidth of TCP over loopback, for predicting local runs."""


@dataclass(frozen=True)
class LaunchOptions:
    """Everything ``srifty-launch`` was asked to do, validated by the CLI."""

    script: str
    script_args: tuple[str, ...]
    request: PlanRequest
    backend: str = "local"
    checkpoint_uri: str | None = None
    keep_checkpoints: int = 3
    run_dir: Path | None = None
    """``None``: a fresh ``srifty_runs/<script>-<time>``; an existing run is refused."""
    resume: bool = False
    """Continue the run in ``run_dir`` from its newest checkpoint, without profiling."""
    profile_path: Path | None = None
    """Reuse this profile instead of profiling the script again."""
    pinned: tuple[tuple[str, int], ...] = ()
    """``--cluster``: price and run this shape; no search over shapes."""
    argv: tuple[str, ...] = ()
    """The command line, kept in ``run.json`` for ``--resume``."""
    dry_run: bool = False
    assume_yes: bool = False
    catalog: str = "auto"
    calibration: Path | None = None
    preemptions: PreemptionSource | None = None
    grace_s: float = 30.0
    """SIGTERM to SIGKILL on a local revocation: SkyPilot's own 30 s
    (``sky/skylet/subprocess_daemon.py: kill_process_tree``)."""
    stall_timeout_s: float | None = STALL_TIMEOUT_S
    """``--stall-timeout``: a running job silent this long hangs and is relaunched (see
    :attr:`.Controller.stall_timeout_s`); ``None``: never."""
    local_max_nodes: int = 2
    local_max_procs: int = 2
    policy: str = "srifty"
    """Spot policy after a preemption (see :data:`~lightning_srifty.core.spot.POLICY_NAMES`)."""
    keep_clusters: bool = False
    """On Ctrl-C leave the run's clusters (or managed job) running."""
    setup: str | None = None
    """Extra setup commands for the nodes (``--setup``), after the package is installed."""
    refine: bool = True
    """Re-plan on the running job's measured steps and migrate when that pays off."""
    max_attempts: int | None = None
    """``--max-attempts``: give up after this many attempts (``None``: no cap)."""
    probe: str = "auto"
    """``--probe``: measure the plans that could be best before committing (``auto``:
    when their intervals overlap and it is worth its price; ``on``; ``off``)."""
    job_recovery: str = "auto"
    """``--job-recovery``: the managed job's ``job_recovery`` strategy (sky-jobs);
    ``auto`` asks the API server whether it has our strategy's plugin."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"--backend {self.backend!r} is not valid: use one of {', '.join(BACKENDS)}"
            )
        if self.preemptions is not None and self.backend != "local":
            raise ConfigError("--preempt-every/--preempt-trace work only with --backend local")
        if self.setup and self.backend not in SKY_BACKENDS:
            raise ConfigError("--setup works only with --backend sky or sky-jobs")
        if self.job_recovery != "auto" and self.backend != "sky-jobs":
            raise ConfigError("--job-recovery works only with --backend sky-jobs")
        if self.backend == "sky-jobs":
            from lightning_srifty.launch.sky_jobs import JOB_RECOVERIES

            if self.job_recovery not in JOB_RECOVERIES:
                raise ConfigError(
                    f"--job-recovery {self.job_recovery!r} is not valid: use one of "
                    f"{', '.join(JOB_RECOVERIES)}"
                )
        if self.policy not in POLICY_NAMES:
            raise ConfigError(
                f"--policy {self.policy!r} is not valid: use one of {', '.join(POLICY_NAMES)}"
            )
        if self.resume and self.run_dir is None:
            raise ConfigError("--resume needs the run folder to continue")
        if self.resume and self.profile_path is not None:
            raise ConfigError("--resume reuses the run's own profile; leave out --profile")
        if self.probe not in PROBE_MODES:
            raise ConfigError(
                f"--probe {self.probe!r} is not valid: use one of {', '.join(PROBE_MODES)}"
            )
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ConfigError(f"--max-attempts must be >= 1, got {self.max_attempts}")


class LauncherUI(Protocol):
    """What the launcher shows and asks; the CLI implements it with rich."""

    def info(self, message: str) -> None: ...

    def show_profile(self, run: ProfileRun) -> None: ...

    def show_plan(self, result: PlanResult, request: PlanRequest) -> None: ...

    def confirm(self, plan: Plan) -> bool: ...

    def ask(self, question: str) -> bool: ...

    def show_dry_run(self, report: Any) -> None: ...

    def progress(self, plan: Plan, snap: Snapshot, expect: Expectation) -> None: ...

    def migration(self, move: Migration) -> None: ...

    def summary(self, outcome: LaunchOutcome) -> None: ...


@dataclass(frozen=True)
class LaunchOutcome:
    """What the whole launch did."""

    profile: ProfileRun
    plan_result: PlanResult | None
    """``None`` where nothing was planned: the script ended its training while profiled."""
    run: RunSummary | None
    """``None`` on a dry run, or where nothing was left to launch."""
    local_topology: LocalTopology | None = None


def default_checkpoint_uri(run_dir: Path) -> str:
    return str((run_dir / "checkpoints").resolve())


def load_planning_inputs(
    options: LaunchOptions, profiled_on: str
) -> tuple[tuple[Offer, ...], PerformanceModel]:
    """Catalog offers and the performance model (files are read here, once)."""
    from lightning_srifty.core.links import DEFAULT_EFA_MODE
    from lightning_srifty.io.calibration_io import calibration_or_default
    from lightning_srifty.io.catalog_io import load_gpu_specs, planning_offers

    efa = DEFAULT_EFA_MODE
    if options.backend in SKY_BACKENDS:
        from lightning_srifty.launch.sky_tasks import launched_efa_mode

        efa = launched_efa_mode()  # price EFA as SkyPilot will attach it
    offers = planning_offers(options.catalog, profiled_on, efa=efa)
    calibration = calibration_or_default(options.calibration)
    return offers, PerformanceModel(load_gpu_specs(), calibration)


def local_cluster(profile: Profile, topology: LocalTopology) -> Cluster:
    """The processes a local run really uses, as a cluster the model can predict."""
    env = profile.environment
    link = "PCIe" if topology.procs_per_node > 1 else "none"
    offer = Offer(
        instance_type="local",
        accelerator=env.accelerator,
        accelerator_count=topology.procs_per_node,
        gpu_memory_gib=1e6,
        vcpus=1.0,
        memory_gib=1e6,
        region="local",
        zone="local",
        ondemand_price=0.0,
        spot_price=None,
        intra_node_link=link,
        network_gbps=LOOPBACK_GBPS,
        links=loopback_links(link, LOOPBACK_GBPS, gloo=True),
    )
    return Cluster((ClusterGroup(offer, topology.nodes, topology.procs_per_node),))


def run_launch(
    options: LaunchOptions, ui: LauncherUI, *, backend: Backend | None = None
) -> LaunchOutcome:
    """Runs the whole journey; raises :class:`SriftyError` subclasses on user problems.

    Whatever ends it early takes down what this launch started (the clusters and managed
    jobs in its ledger): Ctrl-C, SIGTERM and SIGHUP (:mod:`~lightning_srifty.launch.
    signals`) unless ``--keep-clusters``, and any exception. Only an API server that
    stayed away leaves them, with their autostop, as they are.

    Args:
        options: What the user asked for.
        ui: Shows progress and asks for confirmation.
        backend: Replaces the backend ``options.backend`` names (tests pass a SkyPilot
            backend whose SDK cannot provision).
    """
    made: list[Backend] = []
    with signals.terminating():
        try:
            return _run_launch(options, ui, backend, made)
        except KeyboardInterrupt as exc:
            if made:
                _after_interrupt(made[0], options, ui, exc)
            raise
        except Exception:
            if made:
                _after_failure(made[0], ui)
            raise


def _run_launch(
    options: LaunchOptions, ui: LauncherUI, backend: Backend | None, made: list[Backend]
) -> LaunchOutcome:
    """:func:`run_launch`'s journey; ``made`` receives the backend once it exists."""
    if not Path(options.script).is_file():
        # Before anything is created: a typo must not leave an empty run folder behind.
        raise LaunchError(f"script not found: {options.script}")
    if options.backend in SKY_BACKENDS and importlib.util.find_spec("sky") is None:
        raise ConfigError(
            f"--backend {options.backend} needs SkyPilot, which is not installed: "
            "pip install 'lightning-srifty[launch]'"
        )
    if options.pinned:
        _check_pinned_types(options)  # before profiling: do not make the user wait to be told
    if options.resume:
        assert options.run_dir is not None
        run_dir = options.run_dir
    else:
        run_dir = claim_run_dir(options.run_dir, options.script)
        if options.argv:
            write_run_record(run_dir, options.argv)
    options = dataclasses.replace(options, run_dir=run_dir)
    uri = options.checkpoint_uri or default_checkpoint_uri(run_dir)
    remote = options.backend in SKY_BACKENDS
    if remote and not options.dry_run and not uri.startswith("s3://"):
        raise ConfigError(
            f"--backend {options.backend} needs --checkpoint-uri s3://bucket/prefix (got "
            f"{uri!r}): cloud VMs, and the VMs a job migrates to, cannot read this "
            "machine's directories"
        )
    store = _check_store(uri, options.keep_checkpoints)
    if remote and options.dry_run:
        from lightning_srifty.launch.sky_runtime import use_bundled_catalog_if_missing

        use_bundled_catalog_if_missing(run_dir / "sky" / "offline-runtime")
        if not uri.startswith("s3://"):
            ui.info(
                f"note: the task YAML names checkpoint directory {uri}; a real launch needs "
                "--checkpoint-uri s3://bucket/prefix"
            )
    backend = backend or _make_backend(options, uri)
    made.append(backend)
    if remote and not options.dry_run:
        check = getattr(backend, "check_credentials", None)
        if check is not None:
            check()  # before profiling: do not make the user wait to be refused
        if options.resume:
            _refuse_a_second_writer(backend, run_dir)
    job_env = {proto.ENV_KEEP_CHECKPOINTS: str(options.keep_checkpoints)}
    endpoint = os.environ.get(proto.ENV_S3_ENDPOINT_URL)
    if endpoint:
        job_env[proto.ENV_S3_ENDPOINT_URL] = endpoint  # an address, not a secret

    profiled = _profile_for(options, ui, backend, store, job_env, uri)
    if profiled.startup_s is not None:
        # what this job's start takes here: a silent attempt's start-up is hung only
        # after several times it (Controller.startups_s)
        record_startup(run_dir, PROFILE_STARTUP, profiled.startup_s)
    ui.show_profile(profiled)
    if profiled.ended_at_step is not None:
        # No cluster would have anything to train: a launch would only bill its start-up.
        ui.info(
            f"{options.script} ended its own training at step {profiled.ended_at_step:,} while "
            f"it was profiled ({profiled.ended_why}); the run is complete, with its final "
            f"checkpoint in {uri}: nothing is planned or launched"
        )
        return LaunchOutcome(profiled, None, None)
    profile = profiled.profile
    checkpoint_s = measured_checkpoint_s(store)

    offers, model = load_planning_inputs(options, profile.environment.accelerator)
    script = ScriptTrainer.of(profile)
    if script.trains_on_cpu and remote:
        raise ConfigError(
            f"{options.script} fixes Trainer(accelerator={script.accelerator!r}): on a GPU VM "
            "it would train on the CPUs; remove accelerator= (or set 'gpu') to use the GPUs"
        )
    for note in script.notes():
        ui.info(f"note: {note}")
    request = script.constrain(options.request)
    if request.checkpoint_cost_s is None and checkpoint_s is not None:
        request = dataclasses.replace(request, checkpoint_cost_s=checkpoint_s)
    if options.backend == "sky-jobs":
        # A managed job is one task: one instance type, several ranked candidates.
        request = dataclasses.replace(request, mixes=False, top_k=max(request.top_k, MANAGED_TOP_K))
    measured_startups = [s for _, s in read_startups(run_dir, options.backend)]
    if measured_startups:
        # what this run's launches took: its plan's spot restarts and its moves alike
        mean_startup_s = sum(measured_startups) / len(measured_startups)
        request = dataclasses.replace(request, restart_delay_h=mean_startup_s / 3600.0)
        ui.info(
            f"spot restarts and moves are priced at the start-ups this run measured on the "
            f"{options.backend} backend: {len(measured_startups)}, mean {mean_startup_s:.0f} s "
            "(not --restart-delay)"
        )
    ledger = _step_ledger(run_dir, target_steps_at_base(profile, request), options.resume)
    full_target = int(math.ceil(ledger.target_base))
    reached, trained_s = _where_the_run_stands(store, profile)  # one listing of the store
    priced = _left_to_train(request, ledger, reached, trained_s, ui)

    def stop_now() -> ScriptStop | None:
        """The script's limits left at the newest checkpoint (what a re-plan prices)."""
        if request.script_stop is None:
            return None
        return request.script_stop.after(*_where_the_run_stands(store, profile))

    try:
        result = _search(profile, offers, model, priced, options.pinned)
    except ScriptLimitsReachedError as reached_limits:
        ui.info(f"{reached_limits}; the plans price that end")
        priced = _only_the_end(priced)
        result = _search(profile, offers, model, priced, options.pinned)
    ui.show_plan(result, priced)
    local = backend if isinstance(backend, LocalBackend) else None
    if local is not None:
        local.fix_shape(per_node=script.devices, nodes=script.num_nodes)
    world_of = functools.partial(_world_of, local)
    fixed = {name for name in ("devices", "num_nodes", "strategy", "accelerator")
             if getattr(script, name) is not None}  # fmt: skip
    interval_s = _checkpoint_interval_s(options.preemptions, checkpoint_s)
    wait_s = LOCAL_WAIT_S if local is not None else CLOUD_WAIT_S
    policy_every_s: float | None = (
        LOCAL_POLICY_EVERY_S if local is not None else CLOUD_POLICY_EVERY_S
    )
    if options.backend == "sky-jobs":
        policy_every_s = None  # SkyPilot's jobs controller decides where the job runs

    def make_controller(
        chosen: Plan,
        result: PlanResult,
        model: PerformanceModel,
        ledger: StepLedger | None,
        target: int,
    ) -> Controller:
        """The run loop for ``chosen`` (also the probes', before the plan is final)."""
        controller = Controller(
            backend=backend,
            extra_env=job_env,
            script=_script_for(options, backend),
            script_args=options.script_args,
            run_dir=run_dir,
            checkpoint_uri=uri,
            target_steps=target,
            next_planner=PolicyDecider(
                policy=make_policy(options.policy),
                candidates=_candidate_source(
                    profile, offers, model, request, options.pinned, stop_now
                ),
                home=plan_key(chosen),
                target_steps=full_target,
                deadline_h=request.deadline_h,
                changeover_h=request.restart_delay_h,
                wait_h=wait_s / 3600.0,
                # a resumed run's moves are priced at what its earlier launches took
                startups_h=[s / 3600.0 for s in measured_startups],
            ),
            on_startup=lambda seconds: record_startup(run_dir, options.backend, seconds),
            startups_s=[s for _, s in read_startups(run_dir)],
            wait_s=wait_s,
            on_wait=lambda why, s: ui.info(f"waiting {s:.0f} s for spot ({why})"),
            expectation_for=lambda p: _expectation(
                p, profile, model, local, controller.target_steps
            ),
            preemptions=options.preemptions,
            on_migration=ui.migration,
            on_silence=ui.info,
            grace_s=options.grace_s,
            stall_timeout_s=options.stall_timeout_s,
            checkpoint_interval_s=interval_s,
            progress_is_local=local is not None,
            first_attempt=next_attempt(run_dir),
            start_step=max((ref.step for ref in store.refs()), default=0),
            trainer_env_for=lambda p: _trainer_env(p, local, run_dir, profile),
            trainer_args_for=(
                (
                    lambda p: proto.lightning_cli_args(
                        _trainer_env(p, local, run_dir, profile), keep=fixed
                    )
                )
                if script.lightning_cli
                else None
            ),
            target_epochs=request.epochs,
            policy_every_s=policy_every_s,
            keep_on_interrupt=options.keep_clusters,
            refiner=_refiner(
                options, profile, offers, model, request, local, checkpoint_s, stop_now
            ),
            ledger=ledger,
            base_per_step=lambda p: result.batch.base_per_step(world_of(p)),
            resume_step=lambda: max((ref.step for ref in store.refs()), default=0),
            ledger_path=run_dir / LEDGER_FILE,
            step_limit_for=lambda p: user_limit_steps(profile, world_of(p))[0],
            max_attempts=options.max_attempts,
        )
        return controller

    prepare = getattr(backend, "task_options", None)
    if prepare is not None:
        prepare()  # the wheel, .skyignore and requirements, decided once and shown
        for note in getattr(backend, "notes", ()):
            ui.info(note)
    resolve_recovery = getattr(backend, "resolve_recovery", None)
    if resolve_recovery is not None and not options.dry_run:
        line = resolve_recovery()  # --job-recovery auto: asks the API server, once
        if line:
            ui.info(line)
    if not options.dry_run:
        probing = make_controller(result.best, result, model, None, full_target)
        result, model = probe_and_replan(
            options, ui, profile, offers, model, priced, result, probing, local
        )
    chosen = result.best
    if hasattr(backend, "candidates"):
        backend.candidates = result.plans  # the managed job's ordered resources
    if not options.dry_run and not options.assume_yes and not ui.confirm(chosen):
        raise LaunchError("plan not confirmed; nothing was launched (use --yes to skip asking)")

    topology = local.topology_for(chosen.cluster) if local is not None else None
    target = ledger.target_step(reached, result.batch.base_per_step(world_of(chosen)))
    target = _bounded_by_script(target, profile, world_of(chosen), ui)
    expected = _expectation(chosen, profile, model, local, target)
    _note_time_limit(profile, expected, reached, trained_s, target, ui)
    if topology is not None:
        ui.info(
            f"each process trains on batches of {result.batch.per_process_batch} (global "
            f"{result.batch.global_batch(topology.world_size)} on the {topology.world_size} "
            f"local process(es); {result.batch.describe(chosen.cluster.world_size)} as planned)"
        )
    else:
        ui.info(f"each step: {result.batch.describe(chosen.cluster.world_size)}")
    controller = make_controller(chosen, result, model, ledger, target)

    if options.dry_run:
        if getattr(backend, "strategy", "") is None:
            ui.info(
                "--job-recovery auto: a dry run does not ask the API server for its plugins; "
                "the task shows EAGER_NEXT_REGION, what SkyPilot uses without ours (a launch "
                "picks SRIFTY_NEXT_OFFER when the server has it)"
            )
        report = _dry_run(controller, chosen, run_dir) if remote else None
        ui.show_dry_run(report)
        return LaunchOutcome(profiled, result, None, topology)

    fed_back: set[Plan] = set()

    def on_update(p: Plan, snap: Snapshot) -> None:
        expect = controller.expectation or controller.expectation_for(p)
        ui.progress(p, snap, expect)
        if snap.drift and snap.measured_step_s and p not in fed_back:
            fed_back.add(p)
            path = write_feedback(
                run_dir / "calibration",
                profile,
                _ran_on(p, backend),
                snap.measured_step_s,
                attempt=controller.attempt,
            )
            use = (
                "kept as a record: local processes are no catalog instance"
                if local is not None
                else f"refit with: srifty calibrate --profiles {path} --out CAL.json"
            )
            ui.info(
                f"measured step {snap.measured_step_s * 1e3:.1f} ms is {snap.drift} than "
                f"predicted {expect.step_s * 1e3:.1f} ms "
                f"[{expect.low_s * 1e3:.1f}, {expect.high_s * 1e3:.1f}]; measurement written "
                f"to {path} ({use})"
            )

    controller.on_update = on_update
    shape = (
        f" as {topology.nodes} node(s) x {topology.procs_per_node} process(es)" if topology else ""
    )
    where = chosen.cluster.describe()
    ui.info(f"launching on {where} via the {backend.name} backend{shape}")
    if local is not None:  # the plan's steps are the cloud's: say what this machine will do
        ui.info(
            f"the plan's step ({chosen.step_s * 1e3:.3g} ms) is {where}'s; "
            f"this machine's processes are predicted at {expected.step_s * 1e3:.3g} ms "
            f"[{expected.low_s * 1e3:.3g}, {expected.high_s * 1e3:.3g}] a step, what the run "
            "is measured against"
        )
    summary = controller.run(chosen)
    stored = store.refs()
    if stored and stored[0].reason == "final":
        # The store is the job's own record: a log line lost in transit (a follower
        # that reconnected, a managed job's log read late) does not shrink what it did.
        summary = dataclasses.replace(summary, final_checkpoint_step=stored[0].step)
    outcome = LaunchOutcome(profiled, result, summary, topology)
    ui.summary(outcome)
    return outcome


def _profile_for(
    options: LaunchOptions,
    ui: LauncherUI,
    backend: Backend,
    store: CheckpointStore,
    job_env: dict[str, str],
    uri: str,
) -> ProfileRun:
    """The run's profile: measured now, reused from ``--profile``, or the resumed run's."""
    from lightning_srifty.io.profile_io import load_profile, save_profile

    run_dir = options.run_dir
    assert run_dir is not None
    own = run_dir / "profile.json"
    if options.resume:
        if not own.is_file():
            raise LaunchError(
                f"--resume {run_dir}: the run has no profile.json (its first launch ended "
                "before profiling finished); start a new run instead"
            )
        newest = store.refs()
        if newest and newest[0].reason == "final":
            raise LaunchError(
                f"--resume {run_dir}: the run already finished (final checkpoint at step "
                f"{newest[0].step}); start a new run to train again"
            )
        at = f"step {newest[0].step}" if newest else "the start (no checkpoint yet)"
        ui.info(f"resuming {run_dir} from {at}, with the profile of its first launch")
        return ProfileRun(load_profile(own), own, 0)
    if options.profile_path is not None:
        profile = load_profile(options.profile_path)
        save_profile(profile, own)  # the run folder keeps the profile it planned with
        ui.info(f"reusing the profile {options.profile_path} (not profiling again)")
        return ProfileRun(profile, own, 0)
    ui.info(f"profiling {options.script} on this machine (checkpoints: {uri})")
    profile_env = dict(job_env)
    if options.request.target_steps is not None:
        profile_env[proto.ENV_JOB_STEPS] = str(options.request.target_steps)
    if options.request.epochs is not None:
        profile_env[proto.ENV_JOB_EPOCHS] = f"{options.request.epochs:g}"
    if isinstance(backend, LocalBackend):
        # Profile as the local workers will train: their threads, no GPU.
        profile_env.update(LocalBackend.process_env())
    return run_profile(
        options.script,
        options.script_args,
        run_dir=run_dir,
        checkpoint_uri=uri,
        extra_env=profile_env,
        stall_timeout_s=options.stall_timeout_s,
    )


def _check_pinned_types(options: LaunchOptions) -> None:
    from lightning_srifty.io.catalog_io import load_catalog

    types = set(load_catalog(options.catalog).types())
    for name, _ in options.pinned:
        if name not in types:
            raise ConfigError(
                f"--cluster: {name!r} is not an instance type of the catalog "
                f"({len(types)} types, e.g. {', '.join(sorted(types)[:3])})"
            )


def user_limit_steps(profile: Profile, world: int) -> tuple[int | None, str]:
    """Where the script's own ``max_steps``/``max_epochs`` stop training on ``world``
    processes, in steps (``None``: no limit known), and which setting that is
    (:meth:`ScriptStop.steps_on`)."""
    stop = ScriptStop.of(profile)
    return stop.steps_on(world) if stop is not None else (None, "")


def _bounded_by_script(target: int, profile: Profile, world: int, ui: LauncherUI) -> int:
    """The run's target, unless the script's own ``max_steps``/``max_epochs`` stop first
    (they are never lifted: the user is told where the script will stop)."""
    limit, setting = user_limit_steps(profile, world)
    if limit is not None and limit < target:
        ui.info(
            f"note: the script's own Trainer({setting}) ends training at step {limit:,} on "
            f"{world} process(es), before the target of {target:,} steps; the plan is priced "
            "to there, and srifty-launch never lifts a script's limits (raise it in the "
            "script to train longer)"
        )
        return limit
    return target


def time_limit_step(
    profile: Profile, per_step_s: float, start_step: int, trained_s: float | None = None
) -> tuple[int, float] | None:
    """Where the script's ``Trainer(max_time=...)`` ends training at ``per_step_s`` a step
    (validation included): the step, and the limit in seconds (``None``: none is set).

    Lightning's ``Timer`` counts the training stage's wall time, validation included, and
    a resumed run carries the time counted before: ``trained_s`` at ``start_step`` (the
    checkpoint's manifest keeps it), else what the profile counted by its window's end.
    The rest goes at the run's predicted step.
    """
    stop = ScriptStop.of(profile)
    if stop is None or stop.max_time_s is None or per_step_s <= 0:
        return None
    counted_s = _time_trained_s(None, profile) if trained_s is None else trained_s
    left_s = stop.after(start_step, counted_s).time_left_s or 0.0
    return start_step + int(left_s / per_step_s), stop.max_time_s


def _note_time_limit(
    profile: Profile,
    expected: Expectation,
    start_step: int,
    trained_s: float,
    target: int,
    ui: LauncherUI,
) -> None:
    """Says where ``Trainer(max_time=...)`` will end the run, if before the target: the
    plan is priced to there (:class:`ScriptStop`), and the limit is never lifted."""
    per_step_s = expected.step_s + expected.validation_s
    found = time_limit_step(profile, per_step_s, start_step, trained_s)
    if found is None or found[0] >= target:
        return
    step, limit_s = found
    ui.info(
        f"note: the script's own Trainer(max_time={dt.timedelta(seconds=round(limit_s))}) "
        f"ends training at about step {step:,} on this plan (its predicted "
        f"{per_step_s * 1e3:.1f} ms a step, validation included), before the target of "
        f"{target:,} steps; the plan is priced to there, and srifty-launch never lifts a "
        "script's limits"
    )


def _world_of(local: LocalBackend | None, p: Plan) -> int:
    """Processes that really run ``p`` (this machine's, on the local backend)."""
    if local is not None:
        return local.topology_for(p.cluster).world_size
    return p.cluster.world_size


LEDGER_FILE = "steps.json"
"""The run's :class:`~lightning_srifty.core.steps.StepLedger`, kept for ``--resume``."""


def _refuse_a_second_writer(backend: object, run_dir: Path) -> None:
    """Stops ``--resume`` while the run's own cluster or managed job still lives.

    Two jobs on one checkpoint prefix race each other's saves; the first may still be
    training (a laptop that closed does not stop a managed job).

    Raises:
        ConfigError: SkyPilot still reports one of the run's clusters or jobs.
    """
    live_recorded = getattr(backend, "live_recorded", None)
    live = live_recorded() if live_recorded is not None else []
    if live:
        raise ConfigError(
            f"--resume {run_dir}: the run's {', '.join(live)} still lives and may be "
            "training; follow it with `sky jobs logs` / `sky logs`, or take it down with "
            f"`srifty down {run_dir}` and resume then"
        )


def _step_ledger(run_dir: Path, target_base: int, resume: bool) -> StepLedger:
    """A new ledger for the run's target (steps at the profiled scale), or the resumed
    run's with its history."""
    from lightning_srifty.io.jsonfile import read_json

    path = run_dir / LEDGER_FILE
    if resume and path.is_file():
        kept = StepLedger.from_dict(read_json(path), source=str(path))
        kept.target_base = float(target_base)
        return kept
    return StepLedger(target_base=float(target_base))


def _where_the_run_stands(store: CheckpointStore, profile: Profile) -> tuple[int, float]:
    """The newest checkpoint's step and the training time Lightning's ``Timer`` had
    counted there (one listing of the store; step 0 where it holds none)."""
    newest = max(store.refs(), key=lambda ref: ref.step, default=None)
    return (newest.step if newest is not None else 0), _time_trained_s(newest, profile)


def _time_trained_s(newest: CheckpointRef | None, profile: Profile) -> float:
    """The training time Lightning's ``Timer`` had counted at the newest checkpoint (its
    manifest keeps it), else at the profile's window end (0 without ``max_time``)."""
    kept = newest.extra.get("time_trained_s") if newest is not None else None
    if isinstance(kept, int | float) and not isinstance(kept, bool):
        return float(kept)
    limits = profile.extra.get("trainer")
    counted = limits.get("time_elapsed_s") if isinstance(limits, dict) else None
    return float(counted) if isinstance(counted, int | float) else 0.0


def _left_to_train(
    request: PlanRequest, ledger: StepLedger, reached: int, trained_s: float, ui: LauncherUI
) -> PlanRequest:
    """``request`` for the work left once the job's counter reads ``reached`` after
    ``trained_s`` of training (the profiling run's handover, or a resumed run's newest
    checkpoint): the plans price only what the run will train, and the script's limits
    less what was trained."""
    if reached <= 0:
        return request
    left = max(math.ceil(ledger.remaining_base(reached) - 1e-9), 1)
    ui.info(
        f"the run stands at step {reached:,}: the plans price the {left:,} steps left of "
        f"its {int(ledger.target_base):,} (at the profiled scale)"
    )
    stop = request.script_stop
    if stop is not None:
        stop = stop.after(reached, trained_s)
    return dataclasses.replace(request, target_steps=left, epochs=None, script_stop=stop)


def _trainer_env(
    p: Plan, local: LocalBackend | None, run_dir: Path, profile: Profile
) -> dict[str, str]:
    """``PL_TRAINER_*`` for the processes that run ``p`` (this machine's, locally)."""
    strategy = ddp_strategy(profile)
    if local is not None:
        topo = local.topology_for(p.cluster)
        return proto.trainer_env(
            nodes=topo.nodes,
            devices_per_node=topo.procs_per_node,
            root_dir=str((run_dir / "lightning").resolve()),
            strategy=strategy,
        )
    group = p.cluster.groups[0]
    env = proto.trainer_env(
        nodes=p.cluster.nodes,
        devices_per_node=max(group.gpus_per_node, 1),
        root_dir=None,
        strategy=strategy,
        accelerator="gpu" if group.offer.accelerator_count > 0 else None,
    )
    env[proto.ENV_WORLD_SIZE] = str(p.cluster.world_size)  # mixes: groups differ per node
    # Nodes install the torch and Lightning the profile ran with (sky_tasks.node_stack_setup).
    env.update(proto.stack_env(profile.environment.torch_version,
                               profile.environment.lightning_version))  # fmt: skip
    return env


def ddp_strategy(profile: Profile) -> str:
    """The DDP flavour a script needs when the launcher makes it data parallel.

    A manual ``training_step`` (a GAN) runs several backward passes a batch, each over
    part of the model; DDP then needs to look for the parameters a pass did not use, or
    it stops with "parameters that were not used in producing the loss". Lightning's
    ``ddp_find_unused_parameters_true`` does that; everything else gets plain ``ddp``.
    """
    limits = profile.extra.get("trainer")
    manual = isinstance(limits, dict) and limits.get("automatic_optimization") is False
    return "ddp_find_unused_parameters_true" if manual else "ddp"


def _after_interrupt(
    backend: Backend, options: LaunchOptions, ui: LauncherUI, why: KeyboardInterrupt
) -> None:
    """Ctrl-C, SIGTERM or SIGHUP: what this launch started and still has up goes down,
    unless ``--keep-clusters``."""
    down = getattr(backend, "down_started", None)
    if down is None:
        return
    what = str(why) or "interrupted"
    if options.keep_clusters:
        run_dir = getattr(backend, "run_dir", None) or options.run_dir or "RUN_DIR"
        _tell(
            ui,
            f"{what}; the run's clusters were kept (--keep-clusters): take them "
            f"down with `srifty down {run_dir}`",
        )
        return
    try:
        taken = down()
    except LaunchError as exc:
        _tell(ui, f"{what}; {exc}")
        return
    _tell(ui, f"{what}; took down {', '.join(taken) or 'nothing (all already down)'}")


def _after_failure(backend: Backend, ui: LauncherUI) -> None:
    """Any exception: whatever this launch started and still has up goes down (the error
    itself is reported by the caller). Not when the API server itself failed (stayed
    away, or kept dropping requests): a failed API call is no reason to stop a healthy
    job, and the clusters' autostop takes them down when it ends."""
    down = getattr(backend, "down_started", None)
    if down is None or getattr(backend, "api_gone", False):
        return
    try:
        taken = down()
    except LaunchError as exc:
        _tell(ui, f"after the failure: {exc}")
        return
    if taken:
        _tell(ui, f"after the failure, took down {', '.join(taken)}")


def _tell(ui: LauncherUI, message: str) -> None:
    """Says it if the terminal is still there (after SIGHUP it may not be)."""
    try:
        ui.info(message)
    except OSError:
        pass


def measured_checkpoint_s(store: CheckpointStore) -> float | None:
    """Seconds the profiling run's checkpoint took to save and upload (None if unknown)."""
    refs = store.refs()
    if not refs:
        return None
    extra = refs[0].extra
    total = float(extra.get("save_s", 0.0) or 0.0) + float(extra.get("upload_s", 0.0) or 0.0)
    return total if total > 0 else None


def _checkpoint_interval_s(
    preemptions: PreemptionSource | None, checkpoint_s: float | None
) -> float | None:
    """Young/Daly for the injected preemptions of a local run; ``None``: the plan's own."""
    mtbf = getattr(preemptions, "mean_time_between_s", None)
    if mtbf is None or checkpoint_s is None:
        return None
    seconds = mtbf()
    if seconds is None or not math.isfinite(seconds):
        return None
    return young_daly_interval(checkpoint_s / 3600.0, seconds / 3600.0) * 3600.0


def _expectation(
    p: Plan,
    profile: Profile,
    model: PerformanceModel,
    local: LocalBackend | None,
    target: int,
) -> Expectation:
    """What the plan promises on the hardware that really runs it (this machine's
    processes locally: a probe's measurement of them, when one ran)."""
    if local is not None:
        topology = local.topology_for(p.cluster)
        run = predict_per_step(model, profile, local_cluster(profile, topology))
        validation_s = run.validation_s
        if topology in local.measured:
            step, p10, p90 = local.measured[topology]
            cal = model.calibration
            low = min(step * math.exp(min(cal.residual_low, 0.0)), p10)
            high = max(step * math.exp(max(cal.residual_high, 0.0)), p90)
            return Expectation(step, low, high, p.hourly_usd, target, validation_s)
        share = profile_core_share(profile)
        if share is not None:  # a CPU profile: the run's processes share this machine
            shares = local.core_shares(topology, profile_share=share)
            run = on_shared_cores(run, share, *shares, profile_blocked_share(profile))
        return Expectation(run.step_s, run.low_s, run.high_s, p.hourly_usd, target, validation_s)
    return Expectation(p.step_s, p.step_low_s, p.step_high_s, p.hourly_usd, target, p.validation_s)


def _script_for(options: LaunchOptions, backend: Backend) -> str:
    """The script path as the nodes see it (relative to the synced workdir on SkyPilot)."""
    if isinstance(backend, LocalBackend):
        return options.script
    return Path(options.script).name


def _ran_on(p: Plan, backend: Backend) -> RanOn:
    """The hardware that really runs ``p`` (this machine's processes, locally)."""
    if isinstance(backend, LocalBackend):
        topology = backend.topology_for(p.cluster)
        return RanOn(None, None, topology.nodes, topology.procs_per_node)
    group = p.cluster.groups[0]
    if len(p.cluster.groups) == 1:
        return RanOn(
            group.offer.instance_type, group.offer.region, group.nodes, group.gpus_per_node
        )
    return RanOn(None, group.offer.region, p.cluster.nodes, group.gpus_per_node)


PROBE_STARTUP_LOCAL_S = 10.0
"""Seconds from launch to a local probe's first step (torch import, gloo, restore)."""
PROBE_HANG_LOCAL_S = 120.0
"""Start-up a local probe is allowed before it counts as hung. Its expected start-up
(:data:`PROBE_STARTUP_LOCAL_S`, which prices the probes) is this machine on a good day:
several processes importing torch at once on two busy cores of a slower machine take
over 30 s, and a probe cut off there wastes what it ran. A probe that works stops as
soon as its steady step is measured, so the allowance costs nothing then."""


def probe_and_replan(
    options: LaunchOptions,
    ui: LauncherUI,
    profile: Profile,
    offers: Sequence[Offer],
    model: PerformanceModel,
    request: PlanRequest,
    result: PlanResult,
    controller: Controller,
    local: LocalBackend | None,
) -> tuple[PlanResult, PerformanceModel]:
    """Probes the plans that could be the best when that is worth it, refits the job and
    the probed hardware on what they measured and plans again; returns the (possibly
    new) plans and model. Each probe's record is kept as ``probe-<n>.json``."""
    startup_s = PROBE_STARTUP_LOCAL_S if local is not None else request.restart_delay_h * 3600
    remote = local is None
    decision = decide_probes(
        result.plans,
        objective=request.objective,
        hardware=functools.partial(_probe_hardware, local),
        startup_s=startup_s,
        mode=options.probe,
        unknown_compute=remote and profile.environment.accelerator == "cpu",
        unmeasured_shape=_unmeasured_shape(profile, result.plans[0], local) if result.plans else "",
    )
    if options.probe == "off":
        return result, model
    if not decision.run:
        ui.info(decision.reason)
        return result, model
    where = " on this machine, standing in for the cloud," if local is not None else ""
    ui.info(
        f"probing {len(decision.plans)} plan(s){where} before committing: {decision.reason} "
        f"(about {format_seconds(decision.seconds)}, {format_money(decision.cost_usd)} at plan "
        "prices)"
    )
    if (
        remote
        and not options.assume_yes
        and not ui.ask(
            f"Probe {len(decision.plans)} plan(s) for about {format_money(decision.cost_usd)}?"
        )
    ):
        ui.info("probes declined; planning on the profile alone")
        return result, model
    records = [
        _run_probe(index, p, ui, profile, model, controller, local, startup_s)
        for index, p in enumerate(decision.plans, 1)
    ]
    spent_usd = sum(r.cost_usd for r in records)
    spent_s = sum(r.elapsed_s for r in records)
    if not any(r.measured_step_s is not None for r in records):
        ui.info("the probes measured nothing; planning on the profile alone")
        return result, model
    refitted = refit_on_probe_records(model, profile, records, decision.plans, local)
    for line in [
        *_compute_changes(refitted, profile),
        *_hardware_changes(model, refitted, records),
    ]:
        ui.info(line)
    was = result.best
    again = _search(profile, offers, refitted, request, options.pinned)
    now = again.best
    key = "time" if request.objective == "time" else "cost"
    repriced = _repriced(profile, offers, refitted, request, was)
    spent = f"the probes cost {format_money(spent_usd)} at plan prices ({spent_s:.0f} s)"
    if _same_plan(now, was):
        ui.info(
            f"{spent}; the plan held: {now.cluster.describe()} (the probes saved nothing; "
            "they confirmed the plan)"
        )
    else:
        gain = ""
        if repriced is not None:
            old, new = interval_value(repriced, key, "mid"), interval_value(now, key, "mid")
            net = old - new - (spent_s / 3600.0 if key == "time" else spent_usd)
            gain = (
                f", {format_hours(old - new)} sooner ({format_hours(net)} net of the probes)"
                if key == "time"
                else f", {format_money(old - new)} cheaper than plan #1 as measured "
                f"({format_money(net)} saved net of the probes)"
            )
        ui.info(
            f"{spent}; the plan changed from {was.cluster.describe()} to "
            f"{now.cluster.describe()}{gain}"
        )
    ui.show_plan(again, request)
    return again, refitted


PROBE_RECORD_FILE = "probe-{index}.json"
"""A probe's record in the run folder (its progress is ``probe-<n>.jsonl``)."""


def _run_probe(
    index: int,
    p: Plan,
    ui: LauncherUI,
    profile: Profile,
    model: PerformanceModel,
    controller: Controller,
    local: LocalBackend | None,
    startup_s: float,
) -> ProbeRecord:
    """Runs one probe, prints what it measured against the prediction and what it cost,
    and writes its record."""
    from lightning_srifty.io.probe_io import save_probe_record

    allowed_startup_s = max(startup_s * 3, PROBE_HANG_LOCAL_S if local is not None else 0.0)
    report = controller.probe(
        p, index, timeout_s=allowed_startup_s + probe_seconds(p.step_high_s) * 3
    )
    ran = _probe_ran(profile, p, local)
    before = predict_per_step(model, profile, ran)
    cost = report.elapsed_s / 3600.0 * p.hourly_usd
    link = link_evidence(model, profile, ran, report.allreduce) if report.allreduce else None
    topology = local.topology_for(p.cluster) if local is not None else None
    record = ProbeRecord(
        index=index,
        plan=p.cluster.describe(),
        instance_type=_single_type(p.cluster),
        nodes=topology.nodes if topology else p.cluster.nodes,
        procs_per_node=topology.procs_per_node if topology else _per_node(p.cluster),
        stand_in=local is not None,
        predicted_step_s=before.step_s,
        predicted_low_s=before.low_s,
        predicted_high_s=before.high_s,
        measured_step_s=report.measured_step_s,
        measured_low_s=report.spread_s[0] if report.spread_s else None,
        measured_high_s=report.spread_s[1] if report.spread_s else None,
        steps=report.steps,
        elapsed_s=report.elapsed_s,
        cost_usd=cost,
        allreduce=report.allreduce,
        measured_gbps=link.measured_gbps if link else None,
        predicted_gbps=link.predicted_gbps if link else None,
    )
    save_probe_record(record, controller.run_dir / PROBE_RECORD_FILE.format(index=index))
    paid = f"{report.elapsed_s:.0f} s, {format_money(cost)}"
    if report.measured_step_s is None:
        ui.info(
            f"probe {index} on {p.cluster.describe()} measured nothing ({report.state.value}; "
            f"{paid})"
        )
        return record
    if local is not None:
        low, high = report.spread_s or (report.measured_step_s, report.measured_step_s)
        local.measured[local.topology_for(p.cluster)] = (report.measured_step_s, low, high)
    measured_link = ""
    if link is not None:
        measured_link = (
            f"; all-reduce over {link.link} {link.measured_gbps:.3g} Gbps measured against "
            f"{link.predicted_gbps:.3g} Gbps predicted"
        )
    ui.info(
        f"probe {index} on {p.cluster.describe()}: {report.measured_step_s * 1e3:.1f} ms per "
        f"step measured against {before.step_s * 1e3:.1f} ms predicted "
        f"[{before.low_s * 1e3:.1f}, {before.high_s * 1e3:.1f}]{measured_link} "
        f"({report.steps} steps, {paid})"
    )
    return record


def _probe_spread(record: ProbeRecord, accumulate: int) -> tuple[float, float] | None:
    """The probe's 10th and 90th percentile steps per optimizer update (``None`` where
    the record has none: an older record, or no steady report)."""
    if record.measured_low_s is None or record.measured_high_s is None:
        return None
    return record.measured_low_s * accumulate, record.measured_high_s * accumulate


def refit_on_probe_records(
    model: PerformanceModel,
    profile: Profile,
    records: Sequence[ProbeRecord],
    plans: Sequence[Plan],
    local: LocalBackend | None,
) -> PerformanceModel:
    """The model refitted on what the probes measured
    (:func:`~lightning_srifty.fit.calibration.refit_on_probe_runs`, which
    ``benchmarks/bench_gpu_choice.py`` replays): first the job's own terms on every
    probe (a compute scale per GPU type probed, co-location and overlap), then each
    probed instance type's hardware constants on its own probes (the refit of ``srifty
    validate --protocol probed``), the link's rate from the collective measurement.
    Instance types no probe ran on keep their constants.

    On the local backend the processes that ran stand in for the plan's instance type:
    their measurement counts for it.
    """
    from lightning_srifty.fit.calibration import ProbeRun, refit_on_probe_runs  # lazy: scipy

    k = profile.environment.accumulate_grad_batches
    runs = []
    for record, p in zip(records, plans, strict=True):
        if record.measured_step_s is None:
            continue
        ran = _probe_ran(profile, p, local)
        kind = record.instance_type
        link = link_evidence(model, profile, ran, record.allreduce) if record.allreduce else None
        runs.append(
            ProbeRun(
                cluster=_as_type(ran, kind) if kind else ran,
                instance_type=kind,
                step_s=record.measured_step_s * k,
                link=dict(link.constants) if link is not None else {},
                spread_s=_probe_spread(record, k),
            )
        )
    calibration = refit_on_probe_runs(model.calibration, profile, runs, model.gpu_specs)
    return PerformanceModel(model.gpu_specs, calibration)


HARDWARE_CHANGE_SHOWN = 0.05
"""A refitted hardware constant is printed when it moved by more than this share."""


def _compute_changes(after: PerformanceModel, profile: Profile) -> list[str]:
    """The job's compute per GPU type the probes ran, against what was predicted there."""
    job = after.calibration.job(profile.model_name or "job", profile.environment.instance_type)
    if job is None or not job.measured_scales:
        return []
    measured = ", ".join(f"{acc} x{scale:.2f}" for acc, scale in job.measured_scales)
    profiled = profile.environment.accelerator
    untried = (
        f"; GPU types no probe ran x{job.compute_scale:.2f} (the geometric mean)"
        if job.compute_scale != 1.0
        else ""
    )
    kept = "" if profiled in dict(job.measured_scales) else f"; {profiled} as profiled"
    said = "the job's compute measured by the probes, against the prediction"
    return [f"{said}: {measured}{untried}{kept}"]


def _hardware_changes(
    before: PerformanceModel, after: PerformanceModel, records: Sequence[ProbeRecord]
) -> list[str]:
    """One line per probed instance type: the constants its probes moved."""
    lines = []
    for terms in after.calibration.hardware_terms:
        old = before.calibration.physics_on(terms.instance_type).to_dict()
        new = terms.physics.to_dict()
        moved = [
            f"{n} {old[n]:.3g} -> {new[n]:.3g}{' (measured)' if n in terms.evidence else ''}"
            for n in new
            if abs(new[n] - old[n]) > HARDWARE_CHANGE_SHOWN * max(abs(old[n]), 1e-12)
        ]
        if not any(r.instance_type == terms.instance_type for r in records):
            continue
        probes = sum(1 for r in records if r.instance_type == terms.instance_type)
        what = ", ".join(moved) if moved else "no constant moved by more than 5 %"
        lines.append(
            f"{terms.instance_type}'s hardware terms refitted on {probes} probe(s): {what}"
        )
    return lines


def _probe_ran(profile: Profile, p: Plan, local: LocalBackend | None) -> Cluster:
    """The cluster a probe of ``p`` really ran (this machine's processes, locally)."""
    return local_cluster(profile, local.topology_for(p.cluster)) if local is not None else p.cluster


def _single_type(cluster: Cluster) -> str:
    """The one instance type of ``cluster`` (``""`` for a mix)."""
    kinds = {g.offer.instance_type for g in cluster.groups}
    return kinds.pop() if len(kinds) == 1 else ""


def _per_node(cluster: Cluster) -> int:
    return max(g.gpus_per_node for g in cluster.groups)


def _as_type(cluster: Cluster, instance_type: str) -> Cluster:
    """``cluster`` labelled as ``instance_type`` (local processes standing in for it)."""
    return Cluster(
        tuple(
            dataclasses.replace(g, offer=dataclasses.replace(g.offer, instance_type=instance_type))
            for g in cluster.groups
        )
    )


def _unmeasured_shape(profile: Profile, best: Plan, local: LocalBackend | None) -> str:
    """How ``best`` runs what the profile never measured ("" if the profile ran it):
    more processes per node (co-location, the node's links) or more nodes."""
    env = profile.environment
    if local is not None:
        topology = local.topology_for(best.cluster)
        per_node, nodes = topology.procs_per_node, topology.nodes
    else:
        per_node = max(g.gpus_per_node for g in best.cluster.groups)
        nodes = best.cluster.nodes
    parts = []
    if per_node > env.devices_per_node:
        parts.append(f"{per_node} processes per node")
    if nodes > env.num_nodes:
        parts.append(f"{nodes} nodes")
    return " on ".join(parts)


def _probe_hardware(local: LocalBackend | None, p: Plan) -> object:
    """What a probe of ``p`` measures: this machine's processes locally, else the
    instance types, GPUs per node and whether it crosses nodes."""
    if local is not None:
        return local.topology_for(p.cluster)
    shape = tuple(sorted((g.offer.instance_type, g.gpus_per_node) for g in p.cluster.groups))
    return shape, p.cluster.nodes > 1


def _same_plan(a: Plan, b: Plan) -> bool:
    return (a.cluster.describe(), a.use_spot, plan_key(a)) == (
        b.cluster.describe(),
        b.use_spot,
        plan_key(b),
    )


def _repriced(
    profile: Profile,
    offers: Sequence[Offer],
    model: PerformanceModel,
    request: PlanRequest,
    was: Plan,
) -> Plan | None:
    """``was`` priced again by ``model`` (its shape pinned, same market)."""
    shape = tuple((g.offer.instance_type, g.nodes) for g in was.cluster.groups)
    try:
        pinned = plan_pinned(profile, offers, model, dataclasses.replace(request, top_k=50), shape)
    except (InfeasibleError, ConfigError):
        return None
    return next((p for p in pinned.plans if p.use_spot == was.use_spot), None)


def _refiner(
    options: LaunchOptions,
    profile: Profile,
    offers: Sequence[Offer],
    model: PerformanceModel,
    request: PlanRequest,
    local: LocalBackend | None,
    checkpoint_s: float | None,
    stop_now: Callable[[], ScriptStop | None] = lambda: None,
) -> Callable[[Plan, float, float, float, float], Decision | None] | None:
    """Live refinement for the run (``None`` with ``--no-refine`` or managed jobs, where
    SkyPilot's controller decides where the job runs)."""
    if not options.refine or options.backend == "sky-jobs":
        return None

    def replan(
        refitted: PerformanceModel, remaining: int, elapsed_h: float, restart_h: float
    ) -> list[Plan]:
        left = None if request.deadline_h is None else max(request.deadline_h - elapsed_h, 1e-3)
        rest = dataclasses.replace(
            request,
            target_steps=max(remaining, 1),
            restart_delay_h=restart_h,  # this attempt's measured start-up
            epochs=None,
            deadline_h=left,
            top_k=10,
            script_stop=stop_now(),  # the script's limits left, as the run stands
        )
        try:
            return list(_search(profile, offers, refitted, rest, options.pinned).plans)
        except InfeasibleError:  # the script's limits reached included: nowhere to move
            return []

    def ran_on(p: Plan) -> Cluster:
        if local is not None:
            return local_cluster(profile, local.topology_for(p.cluster))
        return p.cluster

    refiner = Refiner(
        profile=profile,
        calibration=model.calibration,
        gpu_specs=model.gpu_specs,
        replan=replan,
        ran_on=ran_on,
        objective="time" if request.objective == "time" else "cost",
        checkpoint_s=checkpoint_s or 0.0,
    )
    return refiner.check


def _search(
    profile: Profile,
    offers: Sequence[Offer],
    model: PerformanceModel,
    request: PlanRequest,
    pinned: Sequence[tuple[str, int]],
) -> PlanResult:
    """The planner's ranking, over the pinned shape where the user fixed one."""
    if pinned:
        return plan_pinned(profile, offers, model, request, pinned)
    return plan(profile, offers, model, request)


def _only_the_end(request: PlanRequest) -> PlanRequest:
    """``request`` for a run the script's own limits end at once: one step, no limits
    (what a resume there runs before Lightning stops it)."""
    return dataclasses.replace(request, target_steps=1, epochs=None, script_stop=None)


def _candidate_source(
    profile: Profile,
    offers: Sequence[Offer],
    model: PerformanceModel,
    request: PlanRequest,
    pinned: Sequence[tuple[str, int]] = (),
    stop_now: Callable[[], ScriptStop | None] = lambda: None,
) -> CandidateSource:
    """Re-plans the remaining work: the best spot plans, and an on-demand fallback.

    Spot plans are ranked by cost with no deadline filter (the spot policy weighs the
    deadline); the on-demand plan is the cheapest that still meets what is left of the
    deadline, or the fastest one when none does (finishing late beats not finishing).
    """

    def search(req: PlanRequest) -> PlanResult:
        # A pinned shape stays pinned after a preemption: only its zone or market moves.
        return _search(profile, offers, model, req, pinned)

    def find(remaining_steps: int, elapsed_h: float, changeover_h: float) -> Candidates:
        rest = dataclasses.replace(
            request,
            target_steps=max(remaining_steps, 1),
            restart_delay_h=changeover_h,  # what this run's restarts measured
            epochs=None,
            deadline_h=None,
            budget_usd=None,
            objective="cost",
            top_k=SPOT_CANDIDATES,
            script_stop=stop_now(),  # the script's limits left, as the run stands
        )
        try:
            return found_for(rest, elapsed_h)
        except ScriptLimitsReachedError:
            # Preempted at the script's own stop: the resume only loads and ends.
            return found_for(_only_the_end(rest), elapsed_h)

    def found_for(rest: PlanRequest, elapsed_h: float) -> Candidates:
        spot: tuple[Plan, ...] = ()
        if request.allow_spot:
            spot = tuple(p for p in search(rest).plans if p.use_spot)
        left = None if request.deadline_h is None else max(request.deadline_h - elapsed_h, 1e-3)
        on_demand = dataclasses.replace(rest, allow_spot=False, deadline_h=left, top_k=1)
        try:
            fallback = search(on_demand).best
        except InfeasibleError:
            fastest = dataclasses.replace(on_demand, deadline_h=None, objective="time")
            fallback = search(fastest).best
        return Candidates(spot, fallback)

    return find


def _make_backend(options: LaunchOptions, checkpoint_uri: str) -> Backend:
    assert options.run_dir is not None
    if options.backend == "local":
        return LocalBackend(
            options.run_dir,
            max_nodes=options.local_max_nodes,
            max_procs=options.local_max_procs,
        )
    # SkyPilot syncs the script's folder to every node and runs the script from there.
    settings: dict[str, Any] = {
        "workdir": str(Path(options.script).resolve().parent),
        "checkpoint_uri": checkpoint_uri,
        "run_dir": options.run_dir,
        "user_setup": options.setup,
        "keep_clusters": options.keep_clusters,
        "dry_run": options.dry_run,
    }
    if options.backend == "sky-jobs":
        from lightning_srifty.launch.sky_jobs import SkyJobsBackend

        return SkyJobsBackend(recovery=options.job_recovery, **settings)
    from lightning_srifty.launch.sky_backend import SkyBackend

    return SkyBackend(**settings)


def _dry_run(controller: Controller, chosen: Plan, run_dir: Path) -> Any:
    """The task YAML a real launch would submit, priced by SkyPilot's optimizer offline."""
    from lightning_srifty.launch.sky_client import SkyClient
    from lightning_srifty.launch.sky_tasks import build_tasks, dry_run

    backend = controller.backend
    assert isinstance(backend, SkyClient)
    options = backend.task_options()
    options["pin_zone"] = True
    options["envs"] = controller.env_for(1, chosen)
    from lightning_srifty.launch.sky_jobs import SkyJobsBackend

    if isinstance(backend, SkyJobsBackend):
        from lightning_srifty.launch.sky_jobs import managed_task

        task = managed_task(
            backend.ordered_plans(chosen),
            script=controller.script,
            script_args=list(controller.args_for(chosen)),
            recovery=backend.planned_strategy,
            **options,
        )
        return dry_run([task], run_dir / "sky")
    tasks = build_tasks(
        chosen, script=controller.script, script_args=list(controller.args_for(chosen)), **options
    )
    return dry_run(tasks, run_dir / "sky")


def _check_store(uri: str, keep: int) -> CheckpointStore:
    """Fails fast (one line) when the checkpoint store cannot be reached."""
    from lightning_srifty.io.checkpoint_store import open_store

    store = open_store(uri, keep=keep)
    store.check()
    return store
