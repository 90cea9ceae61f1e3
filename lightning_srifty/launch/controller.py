"""The run loop of ``srifty-launch``: launch, watch, survive preemptions, migrate.

The controller owns no policy and no UI. It launches a plan through a
:class:`~lightning_srifty.launch.backend.Backend`, follows the job's progress file,
and on a preemption asks a re-planner for the best plan available now (the preempted
offer cooling down), then relaunches; training resumes from the newest checkpoint in
the store. Every migration is logged with why, from where, to where and time lost.

What ends an attempt, and what the controller does about it:

* **spot preemption** (a spot plan's job or nodes were taken away): the offer cools
  down, the policy hears ``preempted=True`` and the market history counts it;
* **on-demand interruption** (the same on an on-demand plan: a host retired, a node
  terminated): relaunched, but labelled as such and not counted against spot;
* **no capacity** (:class:`~lightning_srifty.core.errors.CapacityError` at launch): a
  preemption of length zero, the offer cools down and the policy chooses again;
* **a move by the policy**: while on on-demand the policy is asked again every
  ``policy_every_s``; when it sends the job back to spot, the running job is drained
  (it saves a checkpoint on the signal) and relaunched there;
* **a hang** (the job reported progress, then nothing for ``stall_timeout_s`` while
  it runs: a deadlocked collective, a DataLoader worker stuck in its fork), or **a hung
  start-up** (running, no progress line yet, and no output at all for the stall timeout
  or :data:`STARTUP_FACTOR` times the longest start-up this job has measured): stopped
  and relaunched on the same plan from the newest checkpoint; it gives up when the job
  hangs again without getting further;
* anything else (the job failed, setup failed) ends the run with one line.

Injected preemptions (the local backend's stand-in for the spot market) only ever hit
spot plans. Time comes from ``clock``/``sleep``/``wall`` so a test can drive the loop
on a virtual clock.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import CapacityError, LaunchError, SchemaError
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.core.monitor import (
    Expectation,
    Snapshot,
    snapshot,
    steady_spread,
    steady_step_time,
)
from lightning_srifty.core.steps import StepLedger
from lightning_srifty.io.jsonfile import write_json_atomic
from lightning_srifty.launch.backend import Backend, JobState, LaunchSpec
from lightning_srifty.launch.migration import REPLANNED, Decision, plan_key, true_move

log = logging.getLogger(__name__)

LOG_CATCH_UP_S = 10.0
"""How long to let a cloud job's log stream deliver its last lines after the job ended."""
RECONNECT_MAX_S = 60.0
"""Longest wait between attempts to reopen a broken log stream."""
STALL_TIMEOUT_S = 900.0
"""``--stall-timeout``'s default (15 min): a healthy job writes a line every second
unless a checkpoint save or its own epoch-end work runs that long."""
STALL_STEPS = 10.0
"""A job is not hung before this many of its predicted steps passed without a line."""
HANGS_WITHOUT_PROGRESS = 2
"""Relaunches after a hang that got no further before the run gives up on the job."""
STARTUP_FACTOR = 3.0
"""A start-up is not hung before it has been silent for this many times the longest
start-up the job has measured (its profiling run's, its attempts'): a script's own
start (imports, ``prepare_data``, loading a dataset, the loaders' first batches) may be
silent for as long as it takes, which a cloud node may take longer over."""


@dataclass(frozen=True)
class Migration:
    """One move from a preempted cluster to a new plan."""

    at_s: float
    """Seconds since the launcher started the first training attempt."""
    reason: str
    from_plan: str
    to_plan: str
    step_at_preemption: int
    """The step the job had reached: where it saved its emergency checkpoint, or else the
    last step it reported (it may have run a little further)."""
    resumed_step: int
    lost_s: float
    """Wall time from the preemption until the new attempt reported progress."""
    saved_at_preemption: bool = False
    """The job saved an emergency checkpoint at the step it reached (nothing to redo)."""


@dataclass(frozen=True)
class AttemptReport:
    """One launch of the job on one plan."""

    plan: Plan
    state: JobState
    events: tuple[ProgressEvent, ...]
    elapsed_s: float
    expectation: Expectation
    moved_to: Plan | None = None
    """The policy sent the job elsewhere (from on-demand back to spot)."""
    move_reason: str = ""
    no_capacity: str = ""
    """Why the launch found no capacity (the attempt never ran)."""
    detail: str = ""
    """The backend's one-line account of a failure."""
    recoveries: int = 0
    """Preemptions SkyPilot recovered inside this attempt (managed jobs)."""
    placements: tuple[str, ...] = ()
    """Where SkyPilot ran this attempt's managed job: first launch, then each recovery
    (as its queue showed the launched resources), so a summary can say which offer a
    recovery moved to."""
    startup_s: float | None = None
    """Seconds from the launch call to the attempt's first progress line (provisioning,
    set-up, checkpoint load): what starting on a new cluster cost this run; ``None``
    when training never began."""
    hung: str = ""
    """Why the stall watchdog stopped the attempt (``""``: it did not)."""

    @property
    def resumed_from(self) -> str:
        return next((e.checkpoint for e in self.events if e.event == "resumed"), "")

    @property
    def last_step(self) -> int:
        return max((e.step for e in self.events), default=0)

    @property
    def preempted_step(self) -> int | None:
        """Where the job saved its emergency checkpoint, by its own account."""
        return next((e.step for e in reversed(self.events) if e.event == "preempted"), None)

    @property
    def finished(self) -> bool:
        """The job reported ``done`` (target reached, final checkpoint saved), even if
        the node was revoked while it was shutting down."""
        return any(e.event == "done" for e in self.events)


@dataclass(frozen=True)
class ProbeReport:
    """A short real run of the job on one plan, measuring its steady step."""

    plan: Plan
    measured_step_s: float | None
    """Steady seconds per step (``None``: it never ran long enough to tell)."""
    spread_s: tuple[float, float] | None
    """10th and 90th percentiles of its steady step reports."""
    steps: int
    """Steps the probe ran."""
    elapsed_s: float
    """Wall time from launch to stop (what the probe is billed)."""
    state: JobState
    allreduce: tuple[tuple[int, float], ...] = ()
    """``(bytes, seconds)`` of the all-reduces the job timed among its processes."""


@dataclass(frozen=True)
class RunSummary:
    """What the whole run did, for the final table."""

    attempts: tuple[AttemptReport, ...]
    migrations: tuple[Migration, ...]
    target_steps: int
    cost_usd: float
    elapsed_s: float
    final_checkpoint_step: int = 0
    """Step of the job's final checkpoint in the store (0: none was written)."""

    @property
    def final(self) -> AttemptReport:
        return self.attempts[-1]

    @property
    def steps_done(self) -> int:
        reported = max((a.last_step for a in self.attempts), default=0)
        return max(reported, self.final_checkpoint_step)

    @property
    def recoveries(self) -> int:
        """Preemptions SkyPilot's jobs controller survived (besides :attr:`migrations`)."""
        return sum(a.recoveries for a in self.attempts)


class NextPlanner(Protocol):
    """Chooses where the job goes after a preemption (see :mod:`.migration`)."""

    def record(self, key: tuple[str, str], ran_hours: float, preempted: bool) -> None: ...

    def observe_startup(self, hours: float) -> None:
        """An attempt took ``hours`` from its launch to its first step (a changeover)."""
        ...

    def decide(
        self,
        *,
        steps_done: int,
        elapsed_h: float,
        cooling: frozenset[tuple[str, str]],
        preempted: bool,
        on_demand_now: bool = False,
        spot_up: bool = True,
    ) -> Decision: ...


class PreemptionSource(Protocol):
    """Decides when to revoke the running job (injection on the local backend)."""

    def should_preempt(
        self, attempt_elapsed_s: float, total_elapsed_s: float, training_s: float
    ) -> bool:
        """Whether to revoke now: seconds since this attempt launched, since the run
        started, and since this attempt's first step report."""
        ...

    def mean_time_between_s(self) -> float | None:
        """Mean wall seconds between revocations (for Young/Daly); None: never."""
        ...


@dataclass
class ProgressFile:
    """Incremental reader of the job's JSON-lines progress file."""

    path: Path
    _offset: int = 0
    _partial: str = ""
    events: list[ProgressEvent] = field(default_factory=list)

    def poll(self) -> list[ProgressEvent]:
        """Returns events appended since the last call (tolerates a half-written line)."""
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
            self._offset = fh.tell()
        text = self._partial + chunk
        lines = text.split("\n")
        self._partial = lines.pop()
        fresh = [
            ProgressEvent.from_line(line, source=str(self.path)) for line in lines if line.strip()
        ]
        self.events.extend(fresh)
        return fresh


class ProgressSource(Protocol):
    """Where a running job's progress events come from."""

    events: list[ProgressEvent]

    def poll(self) -> list[ProgressEvent]: ...


class LogProgress:
    """Progress events carried by a job's log stream, followed in a background thread.

    Cloud jobs print their progress lines (``SRIFTY_PROGRESS {...}``) to their log; the
    backend hands over a way to stream that log, and :meth:`poll` returns what arrived.
    Log chunks may split lines, so a partial line waits for the rest.

    A stream that breaks before its end (the API server restarted, the connection
    dropped) is opened again after ``reconnect_s`` seconds (``sleep``), doubling up to
    :data:`RECONNECT_MAX_S`, up to ``max_reconnects`` times in a row (about an hour);
    a reopened log starts from its beginning, so
    events already taken are skipped. :attr:`complete` tells whether the stream reached
    its end (the job's log is whole), which the SkyPilot backend uses to tell a job
    that failed from one whose notice never reached us.

    Args:
        stream: Opens the log stream: an iterator of text chunks, ``None`` at the end.
        source: Names the log in error messages.
        reconnect_s: Wait before reopening a broken stream.
        max_reconnects: Reopenings in a row without a new event before giving up.
        sleep: How to wait (tests pass a virtual clock's).
    """

    def __init__(
        self,
        stream: Callable[[], Iterable[str | None]],
        source: str,
        *,
        reconnect_s: float = 5.0,
        max_reconnects: int = 60,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.events: list[ProgressEvent] = []
        self._fresh: list[ProgressEvent] = []
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._source = source
        self._reconnect_s = reconnect_s
        self._max_reconnects = max_reconnects
        self._sleep = sleep
        self._stop = threading.Event()
        self.complete = False
        """The stream ended normally (``None``): every line of the log was read."""
        self.reconnects = 0
        self.received = 0
        """Characters of the log read so far (a reopened stream counts once it passes
        where the last one got to): what the job has written, progress lines or not."""
        self._thread = threading.Thread(
            target=self._follow, args=(stream,), name="srifty-log-progress", daemon=True
        )
        self._thread.start()

    def _follow(self, stream: Callable[[], Iterable[str | None]]) -> None:
        failures = 0
        last_try = False
        while True:
            partial = ""
            read = 0
            try:
                for chunk in stream():
                    if chunk is None:
                        break
                    read += len(chunk)
                    self.received = max(self.received, read)
                    lines = (partial + chunk).split("\n")
                    partial = lines.pop()
                    if self._take(lines):
                        failures = 0
                self._take([partial])
                self.complete = True
                return
            except (OSError, RuntimeError, ValueError, LaunchError) as exc:
                # The stream broke: requests' ConnectionError/ChunkedEncodingError are
                # OSErrors, the SDK raises RuntimeErrors (ApiServerConnectionError) when
                # the server is gone, and the backend turns "cluster not up" into
                # LaunchError. Once the attempt is over (stop()) the log is complete on
                # the server: it is read once more, from the start, and that is all.
                failures += 1
                self.reconnects += 1
                if self._stop.is_set():
                    if last_try:
                        # Expected once the attempt is over (its cluster may be down by
                        # now): not news, and never after the launcher's last line.
                        log.debug("stopped following %s: %s", self._source, exc)
                        return
                    last_try = True
                    continue
                if failures > self._max_reconnects:
                    log.info("gave up following %s: %s", self._source, exc)
                    return
                wait = min(self._reconnect_s * 2 ** min(failures - 1, 6), RECONNECT_MAX_S)
                log.info("lost %s (%s); reconnecting in %.0f s", self._source, exc, wait)
                self._sleep(wait)
                last_try = self._stop.is_set()

    def _take(self, lines: Sequence[str]) -> bool:
        """Keeps the new progress events in ``lines``; True when any was new."""
        found = []
        for line in lines:
            try:
                event = proto.progress_from_log_line(line, source=self._source)
            except SchemaError as exc:
                log.debug("ignoring a garbled progress line: %s", exc)
                continue
            if event is None:
                continue
            key = event.to_line()
            if key in self._seen:
                continue  # replayed by a reopened stream
            self._seen.add(key)
            found.append(event)
        with self._lock:
            self._fresh.extend(found)
        return bool(found)

    def stop(self) -> None:
        """The attempt is over: read what the current stream still delivers, but do not
        reopen it when it breaks."""
        self._stop.set()

    @property
    def saw_preemption(self) -> bool:
        """The job reported an emergency checkpoint and exit (``preempted`` event)."""
        with self._lock:
            fresh = list(self._fresh)
        return any(e.event == "preempted" for e in [*self.events, *fresh])

    def poll(self) -> list[ProgressEvent]:
        with self._lock:
            fresh, self._fresh = self._fresh, []
        self.events.extend(fresh)
        return fresh

    def wait(self, timeout_s: float) -> None:
        """Lets the stream catch up after the job ended (its last lines)."""
        self._thread.join(timeout_s)


def offer_keys(plan: Plan) -> frozenset[tuple[str, str]]:
    """(instance type, zone) of every group, the unit a preemption takes away."""
    return frozenset((g.offer.instance_type, g.offer.zone) for g in plan.cluster.groups)


@dataclass
class Controller:
    """Runs a plan to its target, migrating on preemptions."""

    backend: Backend
    script: str
    script_args: Sequence[str]
    run_dir: Path
    checkpoint_uri: str
    target_steps: int
    next_planner: NextPlanner
    expectation_for: Callable[[Plan], Expectation]
    """Predicted step time on the cluster that will really run the plan."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    preemptions: PreemptionSource | None = None
    on_update: Callable[[Plan, Snapshot], None] | None = None
    on_migration: Callable[[Migration], None] | None = None
    on_wait: Callable[[str, float], None] | None = None
    """Told when the policy waits for spot: its reason and the seconds it waits."""
    on_silence: Callable[[str], None] | None = None
    """Told once when a running job has been silent for half the stall timeout."""
    poll_s: float = 0.5
    max_attempts: int | None = None
    """Attempts before giving up (``--max-attempts``); ``None``: no cap."""
    max_stalled_attempts: int = 20
    """Attempts in a row that end without a new step (the job cannot start, or no
    capacity anywhere) before the run gives up; any progress resets the count."""
    grace_s: float = 30.0
    """SIGTERM to SIGKILL when a job is revoked or drained (SkyPilot waits 30 s)."""
    stall_timeout_s: float | None = STALL_TIMEOUT_S
    """The stall watchdog: a running job that has reported progress and then writes no
    progress line (step, validation heartbeat, checkpoint) for this long, or for
    :data:`STALL_STEPS` predicted steps when longer, hangs. Nothing else would end it
    (gloo waits 30 min, then fails the run). Before its first progress line a job hangs
    when it writes no output at all for this long, or for :data:`STARTUP_FACTOR` times
    the longest of :attr:`startups_s` (a hung start-up bills as long as a hung step).
    ``None``: never watched."""
    startups_s: Sequence[float] = ()
    """Start-ups of this job measured before this run loop (its profiling run's, a
    resumed run's earlier attempts'), in seconds; each attempt's own is added."""
    cooldown_attempts: int = 2
    """Attempts (or waits) during which a preempted offer counts as unavailable."""
    wait_s: float = 60.0
    """How long to wait when the policy chooses to wait for spot before asking again."""
    max_waits: int = 1000
    checkpoint_interval_s: float | None = None
    """Overrides the plan's Young/Daly interval (local runs with injected preemptions)."""
    progress_is_local: bool = True
    """The job's progress file is readable here (local backend); on cloud VMs it is not."""
    first_attempt: int = 1
    """Number of the first attempt (a resumed run continues after the earlier ones)."""
    start_step: int = 0
    """Step of the checkpoint the first attempt resumes from (progress counts from it)."""
    trainer_env_for: Callable[[Plan], Mapping[str, str]] | None = None
    """``PL_TRAINER_*`` defaults that shape the script's Trainer for a plan."""
    trainer_args_for: Callable[[Plan], Sequence[str]] | None = None
    """Arguments appended to the script's own for a plan (``--trainer.devices=...`` for
    a LightningCLI script, which overrides the ``PL_TRAINER_*`` defaults)."""
    target_epochs: float | None = None
    """``--epochs``: the job counts epochs itself (``target_steps`` is then an estimate)."""
    policy_every_s: float | None = None
    """While on on-demand, ask the policy again this often (``None``: never)."""
    refiner: Callable[[Plan, float, float, float, float], Decision | None] | None = None
    """Live refinement (:class:`~lightning_srifty.launch.refine.Refiner.check`): given
    the plan, its measured step, the remaining steps at the profiled scale, the elapsed
    hours and the attempt's start-up seconds, a better plan to move to, or ``None``."""
    refine_after_steps: int = 30
    """Steps an attempt runs before its mean step is trusted for re-planning."""
    keep_on_interrupt: bool = False
    """On Ctrl-C leave the running job's clusters up (``--keep-clusters``)."""
    ledger: StepLedger | None = None
    """The target in steps at the profiled scale and what each attempt's steps were worth;
    with :attr:`base_per_step`, each attempt gets the step at which its own processes
    reach the target (``None``: :attr:`target_steps` holds for every attempt)."""
    base_per_step: Callable[[Plan], float] | None = None
    """Steps at the profiled scale that one step of the processes running a plan is worth."""
    resume_step: Callable[[], int] | None = None
    """The step of the newest checkpoint, where the next attempt resumes."""
    on_startup: Callable[[float], None] | None = None
    """Told each attempt's measured start-up in seconds (the launcher keeps them in the
    run folder, so a ``--resume`` prices its moves at them too)."""
    ledger_path: Path | None = None
    """Where the ledger is kept between attempts (``--resume`` continues from it)."""
    step_limit_for: Callable[[Plan], int | None] | None = None
    """Where the script's own ``max_steps``/``max_epochs`` stop it on a plan's processes."""
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    wall: Callable[[], float] = time.time
    _cooling: dict[tuple[str, str], int] = field(default_factory=dict, init=False, repr=False)
    _measured_startups: list[float] = field(default_factory=list, init=False, repr=False)
    attempt: int = field(default=0, init=False)
    """Number of the attempt under way (attempts of a resumed run continue the count)."""
    expectation: Expectation | None = field(default=None, init=False)
    """What the attempt under way was promised (its progress is compared with it; on
    the local backend working it out measures the machine, so it is done once)."""

    def args_for(self, plan: Plan) -> tuple[str, ...]:
        """The script's arguments for an attempt on ``plan``."""
        extra = self.trainer_args_for(plan) if self.trainer_args_for is not None else ()
        return (*self.script_args, *extra)

    def env_for(self, attempt: int, plan: Plan) -> dict[str, str]:
        env = dict(self.extra_env)
        env[proto.ENV_MODE] = proto.MODE_TRAIN
        env[proto.ENV_CHECKPOINT_URI] = self.checkpoint_uri
        if self.target_epochs is not None:
            env[proto.ENV_TARGET_EPOCHS] = f"{self.target_epochs:g}"
        else:
            env[proto.ENV_TARGET_STEPS] = str(self.target_steps)
        if self.trainer_env_for is not None:
            env.update(self.trainer_env_for(plan))
        if self.progress_is_local:
            env[proto.ENV_PROGRESS_PATH] = str(self.progress_path(attempt))
        else:
            env[proto.ENV_PROGRESS_STDOUT] = "1"
        interval = self.checkpoint_interval_s or plan.checkpoint_interval_s
        if interval:
            env[proto.ENV_CHECKPOINT_INTERVAL_S] = f"{interval:.3f}"
        limit = (
            self._stall_limit_s(self.expectation)
            if self.expectation is not None
            else (self.stall_timeout_s or math.inf)
        )
        if math.isfinite(limit):
            # the job writes its stacks to its log itself, before it is stopped as hung
            env[proto.ENV_STALL_DUMP_S] = f"{proto.STALL_DUMP_SHARE * limit:.1f}"
        return env

    def probe(
        self,
        plan: Plan,
        index: int,
        *,
        steady_reports: int = 5,
        timeout_s: float = 600.0,
        max_steps: int = 1_000_000,
    ) -> ProbeReport:
        """Runs the job on ``plan`` from the newest checkpoint until its steady step is
        measured (``steady_reports`` reports after warm-up, at most ``max_steps`` steps
        or ``timeout_s``), then stops it. The job writes no checkpoint in probe mode."""
        start = self.resume_step() if self.resume_step is not None else self.start_step
        env = self.env_for(0, plan)
        env[proto.ENV_MODE] = proto.MODE_PROBE
        env.pop(proto.ENV_TARGET_EPOCHS, None)
        env.pop(proto.ENV_CHECKPOINT_INTERVAL_S, None)
        env[proto.ENV_TARGET_STEPS] = str(start + max_steps)
        path = self.run_dir / f"probe-{index}.jsonl"
        if self.progress_is_local:
            # A probe of the same number ran before (a resumed run probes again): its
            # lines would read as this probe's steady step before this one has started.
            path.unlink(missing_ok=True)
            env[proto.ENV_PROGRESS_PATH] = str(path)
        spec = LaunchSpec(
            script=self.script,
            script_args=self.args_for(plan),
            plan=plan,
            envs=env,
            name=f"srifty-probe-{index}",
        )
        handle = self.backend.launch(spec)
        follow = getattr(self.backend, "follow_progress", None)
        progress: ProgressSource = ProgressFile(path)
        if not self.progress_is_local and follow is not None:
            progress = follow(handle)
        t0 = self.clock()
        state = JobState.PENDING
        try:
            while True:
                state = self.backend.status(handle)
                progress.poll()
                if state.is_terminal or self.clock() - t0 > timeout_s:
                    break
                if steady_step_time(progress.events, min_reports=steady_reports) is not None:
                    break
                self.sleep(self.poll_s)
        finally:
            if isinstance(progress, LogProgress):
                progress.stop()
            self.backend.stop(handle)
        progress.poll()
        reached = max((e.step for e in progress.events), default=start)
        # The step the job says it started from: the controller's guess is 0 where no
        # store tells it the newest checkpoint, which would bill the probe the
        # profiling run's steps as well.
        began = next((e.step for e in progress.events if e.event in ("start", "resumed")), start)
        return ProbeReport(
            plan=plan,
            measured_step_s=steady_step_time(progress.events),
            spread_s=steady_spread(progress.events),
            steps=max(reached - began, 0),
            elapsed_s=self.clock() - t0,
            state=state,
            allreduce=next(
                (e.allreduce for e in reversed(progress.events) if e.event == "collective"), ()
            ),
        )

    @property
    def migration_log(self) -> Path:
        return self.run_dir / "migrations.jsonl"

    def _log_migration(self, move: Migration) -> None:
        """Appends one migration (why, from, to, time lost) to ``migrations.jsonl``."""
        self.migration_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.migration_log, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(move), separators=(",", ":")) + "\n")

    def progress_path(self, attempt: int) -> Path:
        return self.run_dir / f"progress-{attempt}.jsonl"

    def run(self, first_plan: Plan) -> RunSummary:
        """Runs attempts until the target is reached; raises on a genuine failure."""
        plan = first_plan
        attempts: list[AttemptReport] = []
        migrations: list[Migration] = []
        self._cooling = {}
        self._measured_startups = []
        started = self.clock()
        cost = 0.0
        preempted_at: float | None = None
        reached = self.start_step
        stalled = 0
        attempt = self.first_attempt - 1
        while True:
            attempt += 1
            if self.max_attempts is not None and attempt - self.first_attempt >= self.max_attempts:
                raise LaunchError(
                    f"gave up after {self.max_attempts} attempts (--max-attempts); continue "
                    f"with `srifty-launch --resume {self.run_dir}`"
                )
            self._begin_attempt(plan, reached)
            try:
                report = self._attempt(attempt, plan, started, reached)
            except CapacityError as exc:
                report = AttemptReport(
                    plan, JobState.PREEMPTED, (), 0.0, self.expectation_for(plan),
                    no_capacity=str(exc),
                )  # fmt: skip
            if report.startup_s is not None:
                self._measured_startups.append(report.startup_s)
                # the policy prices its next move at what this run's moves take
                self.next_planner.observe_startup(report.startup_s / 3600.0)
                if self.on_startup is not None:
                    self.on_startup(report.startup_s)
            stalled = 0 if report.last_step > reached else stalled + 1
            reached = max(reached, report.last_step)
            spot_event = plan.use_spot and report.state is JobState.PREEMPTED
            if plan.use_spot and report.moved_to is None:
                # What the spot market did; on-demand time says nothing about it.
                self.next_planner.record(plan_key(plan), report.elapsed_s / 3600.0, spot_event)
            attempts.append(report)
            cost += report.expectation.hourly_usd * report.elapsed_s / 3600.0
            if migrations and preempted_at is not None and not report.no_capacity:
                migrations[-1] = _with_resume(
                    migrations[-1], report, preempted_at, self.clock(), self.wall()
                )
                self._log_migration(migrations[-1])
                preempted_at = None
            if report.state is JobState.SUCCEEDED or report.finished:
                return RunSummary(
                    tuple(attempts),
                    tuple(migrations),
                    self.target_steps,
                    cost,
                    self.clock() - started,
                )
            still_moving = report.no_capacity and preempted_at is not None and migrations
            if report.moved_to is not None:
                new_plan = report.moved_to
                if report.move_reason.startswith(REPLANNED):
                    why = report.move_reason
                else:
                    why = f"policy move; {true_move(report.move_reason, plan, new_plan)}"
                preempted_at = self.clock()
            elif report.hung:
                if stalled >= HANGS_WITHOUT_PROGRESS:
                    raise LaunchError(
                        f"gave up: the job hung again without getting past step {reached} "
                        f"({report.hung}; {stalled + 1} hangs in a row on "
                        f"{plan.cluster.describe()}); logs are in {self.run_dir}; continue "
                        f"with `srifty-launch --resume {self.run_dir}`"
                    )
                new_plan = plan
                why = f"hung ({report.hung}); relaunched on the same plan"
                preempted_at = self.clock()
            else:
                if report.state is not JobState.PREEMPTED:
                    detail = f"; {report.detail}" if report.detail else ""
                    raise LaunchError(
                        f"training failed on {plan.cluster.describe()} (state "
                        f"{report.state.value}{detail}); logs are in {self.run_dir}"
                    )
                if stalled >= self.max_stalled_attempts:
                    raise LaunchError(
                        f"gave up: {stalled} attempts in a row ended without a new step "
                        f"(the last on {plan.cluster.describe()}); logs are in {self.run_dir}; "
                        f"continue with `srifty-launch --resume {self.run_dir}`"
                    )
                if not still_moving:
                    preempted_at = self.clock()
                self._cooling = _cool_down(self._cooling)
                if report.no_capacity or plan.use_spot:
                    for key in offer_keys(plan):
                        self._cooling[key] = self.cooldown_attempts
                new_plan, why = self._next_plan(
                    reached, started, preempted=spot_event and not report.no_capacity
                )
                why = f"{_interruption_kind(plan, report)}; {true_move(why, plan, new_plan)}"
            assert preempted_at is not None
            if still_moving:
                # The move after a preemption found no capacity where it went: the same
                # move continues elsewhere (time lost still counts from the preemption).
                migration = replace(
                    migrations[-1],
                    reason=f"{migrations[-1].reason}; then {why}",
                    to_plan=_describe(new_plan),
                )
                migrations[-1] = migration
            else:
                migration = Migration(
                    at_s=preempted_at - started,
                    reason=why,
                    from_plan=_describe(plan),
                    to_plan=_describe(new_plan),
                    step_at_preemption=report.last_step,
                    resumed_step=report.last_step,
                    saved_at_preemption=report.preempted_step == report.last_step,
                    lost_s=0.0,
                )
                migrations.append(migration)
            if self.on_migration:
                self.on_migration(migration)
            plan = new_plan

    def _begin_attempt(self, plan: Plan, reached: int) -> None:
        """Sets :attr:`target_steps` for an attempt on ``plan``: the step at which its own
        processes reach the run's target, from the checkpoint it resumes at."""
        if self.ledger is None or self.base_per_step is None:
            return
        start = self.resume_step() if self.resume_step is not None else reached
        self.target_steps = self.ledger.start(start, self.base_per_step(plan))
        if self.step_limit_for is not None:
            limit = self.step_limit_for(plan)
            if limit is not None:
                self.target_steps = min(self.target_steps, limit)
        if self.ledger_path is not None:
            write_json_atomic(self.ledger_path, self.ledger.to_dict())

    def _base_done(self, reached: int) -> int:
        """Steps at the profiled scale done when the job's counter reads ``reached``."""
        return int(self.ledger.base_at(reached)) if self.ledger is not None else reached

    def _next_plan(self, reached: int, started: float, *, preempted: bool) -> tuple[Plan, str]:
        """Asks the policy where to go, waiting (and asking again) while it says wait."""
        decision = self._decide(reached, started, preempted=preempted)
        waits = 0
        while decision.plan is None:
            waits += 1
            if waits > self.max_waits:
                raise LaunchError(
                    f"the spot policy kept waiting ({decision.reason}); logs are in {self.run_dir}"
                )
            if self.on_wait:
                self.on_wait(decision.reason, self.wait_s)
            self.sleep(self.wait_s)
            self._cooling = _cool_down(self._cooling)
            decision = self._decide(reached, started, preempted=False)
        return decision.plan, decision.reason

    def _decide(
        self, reached: int, started: float, *, preempted: bool, on_demand_now: bool = False
    ) -> Decision:
        now = self.clock()
        return self.next_planner.decide(
            steps_done=self._base_done(reached),
            elapsed_h=(now - started) / 3600.0,
            cooling=frozenset(self._cooling),
            preempted=preempted,
            on_demand_now=on_demand_now,
            spot_up=self._spot_up(now - started),
        )

    def _spot_up(self, total_elapsed_s: float) -> bool:
        """What the injected market says (a replayed trace); True when unknown."""
        available = getattr(self.preemptions, "spot_available", None)
        return True if available is None else bool(available(total_elapsed_s))

    def _attempt(self, attempt: int, plan: Plan, started: float, start_step: int) -> AttemptReport:
        self.attempt = attempt
        expect = self.expectation = self.expectation_for(plan)
        local_file = ProgressFile(self.progress_path(attempt))
        spec = LaunchSpec(
            script=self.script,
            script_args=self.args_for(plan),
            plan=plan,
            envs=self.env_for(attempt, plan),
            name=f"srifty-{attempt}",
        )
        launched = self.clock()  # a cloud launch blocks while it provisions
        handle = self.backend.launch(spec)
        follow = getattr(self.backend, "follow_progress", None)
        progress: ProgressSource = local_file
        if not self.progress_is_local and follow is not None:
            progress = follow(handle)
        t0 = self.clock()
        next_ask = t0 + (self.policy_every_s or 0.0)
        injected = False
        refined = self.refiner is None
        first_step_at: float | None = None
        began_at: float | None = None
        moved: Decision | None = None
        state = JobState.PENDING
        keep = False
        ended = False
        heard, heard_at = 0, t0
        output = -1  # how much the job has written, before its first progress line
        warned = False
        hung = ""
        try:
            while True:
                state = self.backend.status(handle)
                progress.poll()
                now = self.clock()
                if began_at is None and any(e.event in _BEGAN for e in progress.events):
                    began_at = now  # seen at this poll (a short job may end at the same)
                limit = self._stall_limit_s(expect)
                silent = now - heard_at
                if len(progress.events) != heard or state is not JobState.RUNNING:
                    heard, heard_at, warned = len(progress.events), now, False
                elif heard and not injected and moved is None:  # told to stop: saving
                    last = progress.events[-1].step  # steps only grow within an attempt
                    quiet = f"no progress line for {silent:.0f} s after step {last}"
                    hung, warned = self._judge_silence(
                        silent, limit, warned, quiet, "--stall-timeout"
                    )
                    if hung:
                        log.warning("the job hangs (%s): stopping it", hung)
                        break
                elif not injected and moved is None:  # running, no progress line yet
                    written = self._output_of(handle, progress)
                    if written != output:  # any output is a sign of life
                        output, heard_at, warned = written, now, False
                    limit = self._startup_limit_s()
                    silent = now - heard_at
                    quiet = f"no output for {silent:.0f} s before its first progress line"
                    hung, warned = self._judge_silence(
                        silent,
                        limit,
                        warned,
                        quiet,
                        f"--stall-timeout, or {STARTUP_FACTOR:g}x the longest start-up this "
                        "job measured",
                    )
                    if hung:
                        log.warning("the job's start-up hangs (%s): stopping it", hung)
                        break
                if self.on_update:
                    self.on_update(
                        plan,
                        snapshot(
                            progress.events, expect, elapsed_s=now - t0, start_step=start_step
                        ),
                    )
                if state.is_terminal:
                    break
                made_progress = any(e.event == "step" for e in progress.events)
                reached = max((e.step for e in progress.events), default=0)
                if made_progress and first_step_at is None:
                    first_step_at = now
                steady = steady_step_time(progress.events) if not refined else None
                if (
                    steady is not None
                    and moved is None
                    and first_step_at is not None
                    and reached - start_step >= self.refine_after_steps
                    and reached < self.target_steps
                ):
                    refined = True
                    assert began_at is not None  # a step line follows the start line
                    moved = self._refine(plan, steady, reached, started, began_at - launched)
                    if moved is not None:
                        self._drain(handle)
                        continue
                if (
                    not injected
                    and plan.use_spot  # the spot market revokes spot nodes only
                    and first_step_at is not None  # it made progress
                    and reached < self.target_steps
                    and self.preemptions is not None
                    and self.preemptions.should_preempt(
                        now - t0, now - started, training_s=now - first_step_at
                    )
                ):
                    injected = True
                    preempt = getattr(self.backend, "preempt", None)
                    if preempt is None:
                        raise LaunchError(
                            f"the {self.backend.name} backend cannot inject preemptions"
                        )
                    preempt(handle, grace_s=self.grace_s)
                    continue
                if (
                    moved is None
                    and self.policy_every_s
                    and not plan.use_spot
                    and made_progress
                    and now >= next_ask
                ):
                    next_ask = now + self.policy_every_s
                    self._cooling = _cool_down(self._cooling)
                    ask = self._decide(
                        max(reached, start_step), started, preempted=False, on_demand_now=True
                    )
                    if ask.plan is not None and ask.plan.use_spot:
                        moved = ask
                        self._drain(handle)
                        continue
                self.sleep(self.poll_s)
            ended = True
        except KeyboardInterrupt:
            keep = self.keep_on_interrupt
            raise
        finally:
            if isinstance(progress, LogProgress):
                progress.stop()  # no reconnecting from here on: one last full read
                if ended:
                    progress.wait(LOG_CATCH_UP_S)  # the log's last lines, before the down
            # Finished, failed or preempted: release what is left (billing stops; a
            # half-preempted cluster is torn down before the job moves elsewhere).
            if not keep:
                self.backend.stop(handle)
        progress.poll()
        describe = getattr(self.backend, "failure_detail", None)
        detail = describe(handle) if describe is not None and state is JobState.FAILED else ""
        count = getattr(self.backend, "recoveries", None)
        where = getattr(self.backend, "placements", None)
        return AttemptReport(
            plan,
            state,
            tuple(progress.events),
            self.clock() - t0,
            expect,
            moved_to=moved.plan if moved is not None else None,
            move_reason=moved.reason if moved is not None else "",
            detail=str(detail or ""),
            recoveries=int(count(handle)) if count is not None else 0,
            placements=tuple(where(handle)) if where is not None else (),
            startup_s=None if began_at is None else began_at - launched,
            hung=hung,
        )

    def _judge_silence(
        self, silent: float, limit: float, warned: bool, quiet: str, why_limit: str
    ) -> tuple[str, bool]:
        """``(hang, warned)`` for a job ``quiet`` (in words) for ``silent`` s against the
        watchdog's ``limit``: ``hang`` is ``quiet`` past the limit, else empty; past half
        of it the user is told once (``warned``) when it will be taken as a hang."""
        if silent > limit:
            return quiet, warned
        if silent > limit / 2 and not warned:
            (self.on_silence or log.warning)(
                f"{quiet}: taken as a hang and relaunched at {limit:.0f} s ({why_limit})"
            )
            return "", True
        return "", warned

    def _stall_limit_s(self, expect: Expectation) -> float:
        if self.stall_timeout_s is None:
            return float("inf")
        return max(self.stall_timeout_s, STALL_STEPS * expect.high_s)

    def _startup_limit_s(self) -> float:
        """Silence after which a job that has written no progress line yet is hung."""
        if self.stall_timeout_s is None:
            return float("inf")
        longest = max(self._startups(), default=0.0)
        return max(self.stall_timeout_s, STARTUP_FACTOR * longest)

    def _startups(self) -> list[float]:
        return [*self.startups_s, *self._measured_startups]

    def _output_of(self, handle: object, progress: ProgressSource) -> int:
        """How much the job has written so far (its node logs, its log stream)."""
        written = int(getattr(progress, "received", 0))
        measure = getattr(self.backend, "output_bytes", None)
        return written + (int(measure(handle)) if measure is not None else 0)

    def _refine(
        self,
        plan: Plan,
        measured: float,
        reached: int,
        started: float,
        startup_s: float,
    ) -> Decision | None:
        """Asks the refiner once, on this attempt's steady step time (warm-up left out)."""
        assert self.refiner is not None
        elapsed_h = (self.clock() - started) / 3600.0
        remaining = (
            self.ledger.remaining_base(reached)
            if self.ledger is not None
            else float(self.target_steps - reached)
        )
        return self.refiner(plan, measured, remaining, elapsed_h, startup_s)

    def _drain(self, handle: object) -> None:
        """Asks the running job to checkpoint and stop (it exits on the signal)."""
        drain = getattr(self.backend, "drain", None) or getattr(self.backend, "preempt", None)
        if drain is None:
            self.backend.stop(handle)
            return
        drain(handle, grace_s=self.grace_s)


_BEGAN = ("start", "resumed", "step", "done")
"""Progress lines that say training has begun (the callback's ``on_train_start``, after
the checkpoint loaded, writes the first; a step or the end stands in if it was lost)."""


def _cool_down(cooling: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """One attempt or wait later: offers whose cool-down ends become usable again."""
    return {key: left - 1 for key, left in cooling.items() if left > 1}


def _describe(plan: Plan) -> str:
    market = "spot" if plan.use_spot else "on-demand"
    zones = ",".join(sorted({g.offer.zone for g in plan.cluster.groups}))
    return f"{plan.cluster.describe()} {market} {zones}"


def _interruption_kind(plan: Plan, report: AttemptReport) -> str:
    """How a migration log names what ended the attempt."""
    if report.no_capacity:
        return f"no capacity ({report.no_capacity})"
    return "spot preemption" if plan.use_spot else "on-demand interruption"


def _with_resume(
    migration: Migration,
    report: AttemptReport,
    preempted_at: float,
    mono_now: float,
    wall_now: float,
) -> Migration:
    """Fills in where the next attempt resumed and how long the move took.

    Events carry wall time; ``preempted_at`` is monotonic, so it is placed on the wall
    clock through the pair of readings (``mono_now``, ``wall_now``) taken together.
    """
    first_progress = next((e for e in report.events if e.event in ("resumed", "step")), None)
    resumed_step = next(  # "start": no checkpoint yet, it began again
        (e.step for e in report.events if e.event in ("resumed", "start")), migration.resumed_step
    )
    lost = migration.lost_s
    if first_progress is not None:
        preempted_wall = wall_now - (mono_now - preempted_at)
        lost = max(first_progress.time - preempted_wall, 0.0)
    return replace(migration, resumed_step=resumed_step, lost_s=lost)
