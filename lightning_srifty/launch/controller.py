"""The run loop of ``srifty-launch``: launch, watch, survive preemptions, migrate.

The controller owns no policy and no UI. It launches a plan through a
:class:`~lightning_srifty.launch.backend.Backend`, follows the job's progress file,
and on a preemption asks a re-planner for the best plan available now (the preempted
offer cooling down), then relaunches; training resumes from the newest checkpoint in
the store. Every migration is logged with why, from where, to where and time lost.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.cluster import Plan
from lightning_srifty.core.errors import LaunchError, SchemaError
from lightning_srifty.core.launch_protocol import ProgressEvent
from lightning_srifty.core.monitor import Expectation, Snapshot, snapshot
from lightning_srifty.launch.backend import Backend, JobState, LaunchSpec
from lightning_srifty.launch.migration import Decision, plan_key, true_move

log = logging.getLogger(__name__)

LOG_CATCH_UP_S = 10.0
"""How long to let a cloud job's log stream deliver its last lines after the job ended."""


@dataclass(frozen=True)
class Migration:
    """One move from a preempted cluster to a new plan."""

    at_s: float
    """Seconds since the launcher started the first training attempt."""
    reason: str
    from_plan: str
    to_plan: str
    step_at_preemption: int
    resumed_step: int
    lost_s: float
    """Wall time from the preemption until the new attempt reported progress."""


@dataclass(frozen=True)
class AttemptReport:
    """One launch of the job on one plan."""

    plan: Plan
    state: JobState
    events: tuple[ProgressEvent, ...]
    elapsed_s: float
    expectation: Expectation
    handle: object = field(default=None, compare=False, repr=False)
    """The backend's handle of the attempt (to ask it why a failed job failed)."""

    @property
    def resumed_from(self) -> str:
        return next((e.checkpoint for e in self.events if e.event == "resumed"), "")

    @property
    def last_step(self) -> int:
        return max((e.step for e in self.events), default=0)

    @property
    def finished(self) -> bool:
        """The job reported ``done`` (target reached, final checkpoint saved), even if
        the node was revoked while it was shutting down."""
        return any(e.event == "done" for e in self.events)


@dataclass(frozen=True)
class RunSummary:
    """What the whole run did, for the final table."""

    attempts: tuple[AttemptReport, ...]
    migrations: tuple[Migration, ...]
    target_steps: int
    cost_usd: float
    elapsed_s: float

    @property
    def final(self) -> AttemptReport:
        return self.attempts[-1]

    @property
    def steps_done(self) -> int:
        return max((a.last_step for a in self.attempts), default=0)


class NextPlanner(Protocol):
    """Chooses where the job goes after a preemption (see :mod:`.migration`)."""

    def record(self, key: tuple[str, str], ran_hours: float, preempted: bool) -> None: ...

    def decide(
        self,
        *,
        steps_done: int,
        elapsed_h: float,
        cooling: frozenset[tuple[str, str]],
        preempted: bool,
    ) -> Decision: ...


class PreemptionSource(Protocol):
    """Decides when to revoke the running job (injection on the local backend)."""

    def should_preempt(self, attempt_elapsed_s: float, total_elapsed_s: float) -> bool: ...

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

    Args:
        stream: Opens the log stream: an iterator of text chunks, ``None`` at the end.
        source: Names the log in error messages.
    """

    def __init__(self, stream: Callable[[], Iterable[str | None]], source: str):
        self.events: list[ProgressEvent] = []
        self._fresh: list[ProgressEvent] = []
        self._lock = threading.Lock()
        self._source = source
        self._thread = threading.Thread(
            target=self._follow, args=(stream,), name="srifty-log-progress", daemon=True
        )
        self._thread.start()

    def _follow(self, stream: Callable[[], Iterable[str | None]]) -> None:
        partial = ""
        try:
            for chunk in stream():
                if chunk is None:
                    break
                lines = (partial + chunk).split("\n")
                partial = lines.pop()
                self._take(lines)
        except (OSError, RuntimeError, ValueError) as exc:  # the SDK's stream broke
            log.info("stopped following %s: %s", self._source, exc)
        self._take([partial])

    def _take(self, lines: Sequence[str]) -> None:
        found = []
        for line in lines:
            try:
                event = proto.progress_from_log_line(line, source=self._source)
            except SchemaError as exc:
                log.debug("ignoring a garbled progress line: %s", exc)
                continue
            if event is not None:
                found.append(event)
        with self._lock:
            self._fresh.extend(found)

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
    poll_s: float = 0.5
    max_attempts: int = 10
    grace_s: float = 20.0
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
    target_epochs: float | None = None
    """``--epochs``: the job counts epochs itself (``target_steps`` is then an estimate)."""

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
        return env

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
        cooling: dict[tuple[str, str], int] = {}
        started = time.monotonic()
        cost = 0.0
        preempted_at: float | None = None
        reached = self.start_step
        for attempt in range(self.first_attempt, self.first_attempt + self.max_attempts):
            report = self._attempt(attempt, plan, started, reached)
            reached = max(reached, report.last_step)
            self.next_planner.record(
                plan_key(plan), report.elapsed_s / 3600.0, report.state is JobState.PREEMPTED
            )
            attempts.append(report)
            cost += report.expectation.hourly_usd * report.elapsed_s / 3600.0
            if migrations and preempted_at is not None:
                migrations[-1] = _with_resume(migrations[-1], report, preempted_at)
                self._log_migration(migrations[-1])
            if report.state is JobState.SUCCEEDED or report.finished:
                return RunSummary(
                    tuple(attempts),
                    tuple(migrations),
                    self.target_steps,
                    cost,
                    time.monotonic() - started,
                )
            if report.state is not JobState.PREEMPTED:
                why = _failure_reason(self.backend, report)
                raise LaunchError(
                    f"training failed on {plan.cluster.describe()} (state {report.state.value})"
                    f"{': ' + why if why else ''}; logs are in {self.run_dir}"
                )
            preempted_at = time.monotonic()
            cooling = _cool_down(cooling)
            for key in offer_keys(plan):
                cooling[key] = self.cooldown_attempts
            decision = self.next_planner.decide(
                steps_done=reached,
                elapsed_h=(preempted_at - started) / 3600.0,
                cooling=frozenset(cooling),
                preempted=True,
            )
            waits = 0
            while decision.plan is None:
                waits += 1
                if waits > self.max_waits:
                    raise LaunchError(
                        f"the spot policy kept waiting ({decision.reason}); logs are in "
                        f"{self.run_dir}"
                    )
                if self.on_wait:
                    self.on_wait(decision.reason, self.wait_s)
                time.sleep(self.wait_s)
                cooling = _cool_down(cooling)
                decision = self.next_planner.decide(
                    steps_done=reached,
                    elapsed_h=(time.monotonic() - started) / 3600.0,
                    cooling=frozenset(cooling),
                    preempted=False,
                )
            new_plan = decision.plan
            migration = Migration(
                at_s=preempted_at - started,
                reason=f"spot preemption; {true_move(decision.reason, plan, new_plan)}",
                from_plan=_describe(plan),
                to_plan=_describe(new_plan),
                step_at_preemption=report.last_step,
                resumed_step=report.last_step,
                lost_s=0.0,
            )
            migrations.append(migration)
            if self.on_migration:
                self.on_migration(migration)
            plan = new_plan
        raise LaunchError(f"gave up after {self.max_attempts} attempts; logs are in {self.run_dir}")

    def _attempt(self, attempt: int, plan: Plan, started: float, start_step: int) -> AttemptReport:
        expect = self.expectation_for(plan)
        local_file = ProgressFile(self.progress_path(attempt))
        spec = LaunchSpec(
            script=self.script,
            script_args=tuple(self.script_args),
            plan=plan,
            envs=self.env_for(attempt, plan),
            name=f"srifty-{attempt}",
        )
        handle = self.backend.launch(spec)
        follow = getattr(self.backend, "follow_progress", None)
        progress: ProgressSource = local_file
        if not self.progress_is_local and follow is not None:
            progress = follow(handle)
        t0 = time.monotonic()
        injected = False
        state = JobState.PENDING
        try:
            while True:
                state = self.backend.status(handle)
                progress.poll()
                now = time.monotonic()
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
                if (
                    not injected
                    and made_progress
                    and reached < self.target_steps
                    and self.preemptions is not None
                    and self.preemptions.should_preempt(now - t0, now - started)
                ):
                    injected = True
                    preempt = getattr(self.backend, "preempt", None)
                    if preempt is None:
                        raise LaunchError(
                            f"the {self.backend.name} backend cannot inject preemptions"
                        )
                    preempt(handle, grace_s=self.grace_s)
                    continue
                time.sleep(self.poll_s)
        finally:
            # Finished, failed or preempted: release what is left (billing stops; a
            # half-preempted cluster is torn down before the job moves elsewhere).
            self.backend.stop(handle)
        if isinstance(progress, LogProgress):
            progress.wait(LOG_CATCH_UP_S)
        progress.poll()
        return AttemptReport(
            plan, state, tuple(progress.events), time.monotonic() - t0, expect, handle
        )


def _failure_reason(backend: Backend, report: AttemptReport) -> str:
    """The one-line reason the job left before failing, where the backend can read it."""
    reason = getattr(backend, "failure_reason", None)
    handle = getattr(report, "handle", None)
    if reason is None or handle is None:
        return ""
    return str(reason(handle) or "")


def _cool_down(cooling: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """One attempt or wait later: offers whose cool-down ends become usable again."""
    return {key: left - 1 for key, left in cooling.items() if left > 1}


def _describe(plan: Plan) -> str:
    market = "spot" if plan.use_spot else "on-demand"
    zones = ",".join(sorted({g.offer.zone for g in plan.cluster.groups}))
    return f"{plan.cluster.describe()} {market} {zones}"


def _with_resume(migration: Migration, report: AttemptReport, preempted_at: float) -> Migration:
    """Fills in where the next attempt resumed and how long the move took."""
    first_progress = next((e for e in report.events if e.event in ("resumed", "step")), None)
    resumed_step = next(
        (e.step for e in report.events if e.event == "resumed"), migration.resumed_step
    )
    lost = migration.lost_s
    if first_progress is not None:
        lost = max(first_progress.time - (time.time() - (time.monotonic() - preempted_at)), 0.0)
    return replace(migration, resumed_step=resumed_step, lost_s=lost)
