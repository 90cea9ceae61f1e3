"""Every error lightning-srifty raises on purpose.

One hierarchy so the CLI can turn any of them into a one-line message and a non-zero
exit code without a traceback, while genuine bugs (anything else) still surface.
"""

from __future__ import annotations


class SriftyError(Exception):
    """Base class: a problem the user can fix, described in one line."""

    exit_code: int = 2


class ConfigError(SriftyError):
    """A bad flag, option or argument value."""


class SchemaError(SriftyError):
    """A document on disk (profile, calibration, plan) is malformed.

    The message names the file and the field so the user knows where to look.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        where = []
        if source:
            where.append(source)
        if field:
            where.append(f"field '{field}'")
        prefix = ": ".join([", ".join(where)]) + ": " if where else ""
        super().__init__(f"{prefix}{message}")


class ProfileError(SchemaError):
    """A profile file is malformed, truncated or of a future schema version."""


class CatalogError(SchemaError):
    """A catalog or spec table is malformed, or an instance type is unknown."""


class TraceError(SchemaError):
    """A measurement or spot trace file is malformed (missing column, bad row)."""


class CalibrationError(SchemaError):
    """A calibration document is malformed or cannot be fitted."""


class PredictionError(SriftyError):
    """A prediction cannot be made (for example the model does not fit in memory)."""


class InfeasibleError(SriftyError):
    """No plan meets the constraints; the message says what is achievable."""


class ScriptLimitsReachedError(InfeasibleError):
    """The script's own Trainer limits leave no step to train from where the run is
    priced: a resume there only loads the checkpoint and ends, so there is nothing to
    rank plans by (the launcher then prices that end, not the target)."""


class MetadataUnavailableError(SriftyError):
    """The EC2 instance metadata service did not answer (used inside the job only)."""


class MetadataTokenError(MetadataUnavailableError):
    """No IMDSv2 session token came back (the token PUT timed out or failed).

    In a Docker container on an instance whose metadata hop limit is 1 the reply is
    dropped one hop short of the container, so this is what the job sees there.
    """


class CheckpointError(SriftyError):
    """A checkpoint store cannot be reached, written or read."""


class CheckpointMissingError(CheckpointError):
    """A stored object is not there (deleted, or an upload that never finished).

    Missing and corrupt checkpoints are the only reasons a resume may fall back to the
    previous verified checkpoint.
    """


class StoreUnavailableError(CheckpointError):
    """The store did not answer (connection refused or reset, timeout, 5xx, throttling).

    Transient by nature: it is retried, and a resume that still meets it stops with this
    error rather than start from an older checkpoint or from scratch.
    """


class LaunchError(SriftyError):
    """The launcher cannot start, monitor or stop a job."""


class CredentialsError(LaunchError):
    """Cloud credentials are missing or unusable."""


class CapacityError(LaunchError):
    """The cloud has no capacity for the requested resources right now.

    For the controller this is a preemption of length zero: the offer cools down and the
    spot policy chooses again.
    """


class ApiUnavailableError(LaunchError):
    """The SkyPilot API server stayed unreachable for longer than the launcher waits."""
