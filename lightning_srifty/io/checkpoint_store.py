"""Checkpoint stores: a local directory or an S3 prefix, written so a crash never loses work.

Both stores share one layout and one algorithm; only the transport differs::

    <root>/data/<id>.ckpt         the checkpoint bytes, written first
    <root>/manifests/<id>.json    a small manifest (step, size, sha256), written last

A checkpoint exists once its manifest does. Writing the data first and the manifest
last means a crash or kill at any moment leaves either the previous set of manifests
(the half-written data is an orphan, removed later) or the new one; readers take the
newest manifest whose data verifies against its sha256 and fall back to the one before
on corruption. On a local disk each file is written under a temporary name, fsynced
and renamed; on S3 each PUT is atomic, and the manifest is only PUT after the data
upload succeeded, so a failed upload never replaces a good checkpoint.

Checkpoints are ordered by progress: the step, then the creation time (nanoseconds,
forced past the newest existing id so a VM with a slow clock cannot write an "older"
checkpoint). The newest is the one furthest ahead, so two writers on one prefix (a
duplicate job, a resumed run whose first job still lives) can never make a resume go
back to less work. Retention keeps the ``keep`` checkpoints furthest ahead; pruning
deletes a manifest before its data, so no manifest ever points at missing bytes, and
deletes data without a manifest only once it is :data:`ORPHAN_AGE_S` old: another
writer's upload in flight has its data and not yet its manifest, and must survive.

S3 connection errors and throttling are retried with exponential backoff by botocore's
``standard`` retry mode; anything still failing becomes a one-line
:class:`~lightning_srifty.core.errors.CheckpointError`.

Failures are told apart, because they call for opposite reactions when resuming:

* **missing or corrupt** (no such object, truncated, wrong sha256, unreadable manifest):
  that checkpoint is unusable, so the resume falls back to the previous verified one;
* **unavailable** (connection refused or reset, timeouts, 5xx, throttling:
  :class:`~lightning_srifty.core.errors.StoreUnavailableError`): nothing is known about
  the checkpoint, so the resume retries with backoff for ``patience_s`` and then stops
  with a clear error. Falling back here would restart from an older checkpoint, or from
  step 0, and the retention that follows would delete the good checkpoints.

Pruning never deletes the newest checkpoint this store object verified (restored with
a matching sha256, or uploaded itself), and deletes nothing at all once a read met an
unavailable store.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lightning_srifty.core.errors import (
    CheckpointError,
    CheckpointMissingError,
    CredentialsError,
    SchemaError,
    StoreUnavailableError,
)
from lightning_srifty.core.launch_protocol import ENV_S3_ENDPOINT_URL
from lightning_srifty.core.validate import Reader, check_version
from lightning_srifty.io.ec2 import is_ec2

log = logging.getLogger(__name__)

MANIFEST_SCHEMA_VERSION = 1
DATA_DIR = "data"
MANIFEST_DIR = "manifests"
DEFAULT_KEEP = 3
S3_MAX_ATTEMPTS = 8
"""botocore attempts per request (first try + retries) for training-time uploads."""
S3_CHECK_ATTEMPTS = 2
"""Attempts for the reachability check, which should fail fast with a clear message."""
S3_CHECK_CONNECT_TIMEOUT_S = 3.0
S3_CHECK_READ_TIMEOUT_S = 5.0
"""A hung endpoint (accepts, never answers) costs at most this per attempt."""
S3_CHECK_DEADLINE_S = 15.0
"""Wall-clock bound on the whole check, whatever botocore's timeouts do."""
RESUME_PATIENCE_S = 300.0
"""How long a resume keeps retrying an unavailable store before it stops."""
RESUME_BACKOFF_S = (1.0, 30.0)
"""First and longest wait between those retries (doubling in between)."""
_S3_UNAVAILABLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "TooManyRequestsException",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
    }
)
_S3_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})

ORPHAN_AGE_S = 6 * 3600.0
"""Data without a manifest is deleted only past this age. Longer than any upload, so
another writer's checkpoint whose manifest is still to come is never taken for the
leftover of an upload that died."""

_ID = re.compile(r"^(\d{20})-step(\d{9,})$")
_HASH_CHUNK = 8 * 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class CheckpointRef:
    """What a manifest says about one stored checkpoint."""

    id: str
    step: int
    reason: str
    created: float
    """Unix time the upload finished."""
    size: int
    sha256: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def data_name(self) -> str:
        return data_name(self.id)

    @property
    def manifest_name(self) -> str:
        return manifest_name(self.id)

    def to_manifest(self) -> dict[str, Any]:
        return {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "id": self.id,
            "step": self.step,
            "reason": self.reason,
            "created": self.created,
            "data": self.data_name,
            "size": self.size,
            "sha256": self.sha256,
            "extra": dict(self.extra),
        }

    @staticmethod
    def from_manifest(data: Any, *, source: str) -> CheckpointRef:
        r = Reader(data, source=source)
        check_version(r, MANIFEST_SCHEMA_VERSION, kind="checkpoint manifest")
        checkpoint_id = r.str("id")
        if not _ID.match(checkpoint_id):
            raise r.fail("id", f"is not a checkpoint id: {checkpoint_id!r}")
        digest = r.str("sha256")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise r.fail("sha256", f"is not a sha256 hex digest: {digest!r}")
        extra = r.raw("extra", {})
        if not isinstance(extra, dict):
            raise r.fail("extra", f"expected an object, got {type(extra).__name__}")
        return CheckpointRef(
            id=checkpoint_id,
            step=r.int("step", minimum=0),
            reason=r.str("reason", ""),
            created=r.float("created", minimum=0.0),
            size=r.int("size", minimum=0),
            sha256=digest,
            extra=extra,
        )


def _step_of(checkpoint_id: str) -> int:
    """The step encoded in a checkpoint id (``-1`` for a foreign name)."""
    match = _ID.match(checkpoint_id)
    return int(match.group(2)) if match else -1


def _stamp_of(checkpoint_id: str) -> int:
    """The creation time (ns) encoded in a checkpoint id (``-1`` for a foreign name)."""
    match = _ID.match(checkpoint_id)
    return int(match.group(1)) if match else -1


def _progress(checkpoint_id: str) -> tuple[int, int]:
    """Sort key: further ahead first by step, then by creation time."""
    return _step_of(checkpoint_id), _stamp_of(checkpoint_id)


def data_name(checkpoint_id: str) -> str:
    return f"{DATA_DIR}/{checkpoint_id}.ckpt"


def manifest_name(checkpoint_id: str) -> str:
    return f"{MANIFEST_DIR}/{checkpoint_id}.json"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def new_checkpoint_id(step: int, newest_existing: str | None, now_ns: int | None = None) -> str:
    """A sortable id, strictly after ``newest_existing`` whatever this machine's clock says."""
    stamp = time.time_ns() if now_ns is None else now_ns
    if newest_existing is not None:
        match = _ID.match(newest_existing)
        if match:
            stamp = max(stamp, int(match.group(1)) + 1)
    return f"{stamp:020d}-step{step:09d}"


class CheckpointStore(ABC):
    """Versioned, verified checkpoints under one root; subclasses move bytes."""

    def __init__(self, uri: str, keep: int):
        if keep < 1:
            raise CheckpointError(f"keep must be >= 1, got {keep}")
        self.uri = uri
        self.keep = keep
        self.verified_id: str | None = None
        """Newest checkpoint this object restored (sha256 checked) or uploaded itself."""
        self.unavailable_seen = False
        """A read met an unavailable store: pruning is off for this object's lifetime."""
        self.patience_s = RESUME_PATIENCE_S
        """How long :meth:`fetch_latest` retries an unavailable store."""
        self.sleep: Callable[[float], None] = time.sleep
        self.clock: Callable[[], float] = time.monotonic
        self.now_ns: Callable[[], int] = time.time_ns
        """Wall clock for new ids and the orphan age (tests move it)."""

    # ------------------------------------------------------------ transport
    @abstractmethod
    def check(self) -> None:
        """Raises a one-line :class:`CheckpointError` if the store cannot be used."""

    @abstractmethod
    def _put_file(self, local: Path, name: str) -> None:
        """Stores ``local`` at ``name`` atomically (readers see all of it or nothing)."""

    @abstractmethod
    def _put_bytes(self, data: bytes, name: str) -> None: ...

    @abstractmethod
    def _get_file(self, name: str, dest: Path) -> None: ...

    @abstractmethod
    def _get_bytes(self, name: str) -> bytes: ...

    @abstractmethod
    def _list(self, folder: str) -> list[str]:
        """Base names of the objects in ``folder`` (``data`` or ``manifests``)."""

    @abstractmethod
    def _delete(self, name: str) -> None: ...

    # ------------------------------------------------------------ algorithm
    def checkpoint_ids(self) -> list[str]:
        """Ids that have a manifest, furthest ahead first (manifests not yet verified)."""
        ids = [n[: -len(".json")] for n in self._list(MANIFEST_DIR) if n.endswith(".json")]
        return sorted((i for i in ids if _ID.match(i)), key=_progress, reverse=True)

    def refs(self) -> list[CheckpointRef]:
        """Readable manifests, newest first; unreadable ones are skipped with a warning."""
        out = []
        for checkpoint_id in self.checkpoint_ids():
            ref = self._read_manifest(checkpoint_id)
            if ref is not None:
                out.append(ref)
        return out

    def save(
        self,
        local: str | os.PathLike[str],
        *,
        step: int,
        reason: str,
        extra: Mapping[str, Any] | None = None,
    ) -> CheckpointRef:
        """Uploads the file at ``local`` as the newest checkpoint, then prunes old ones.

        Raises:
            CheckpointError: The upload failed; the previous newest checkpoint is intact.
        """
        path = Path(local)
        ids = self.checkpoint_ids()
        latest = max(ids, key=_stamp_of) if ids else None
        checkpoint_id = new_checkpoint_id(step, latest, now_ns=self.now_ns())
        size = path.stat().st_size
        digest = sha256_of(path)
        self._put_file(path, data_name(checkpoint_id))
        ref = CheckpointRef(
            checkpoint_id, step, reason, time.time(), size, digest, dict(extra or {})
        )
        self._put_bytes(json.dumps(ref.to_manifest(), indent=1).encode(), ref.manifest_name)
        self.verified_id = ref.id
        try:
            self.prune()
        except CheckpointError as exc:
            log.warning("checkpoint %s saved, but pruning old ones failed: %s", ref.id, exc)
        return ref

    def fetch_latest(self, folder: str | os.PathLike[str]) -> tuple[Path, CheckpointRef] | None:
        """Downloads the newest checkpoint whose bytes match its manifest into ``folder``.

        Only a checkpoint that is *missing or corrupt* (manifest unreadable, data absent,
        size or sha256 wrong) is skipped for the previous one. An unavailable store is
        retried with backoff for :attr:`patience_s`; if it stays unavailable this raises,
        because falling back would silently restart from older work.

        Returns:
            ``(local path, ref)``, or ``None`` when the store holds no usable checkpoint.

        Raises:
            StoreUnavailableError: the store stayed unreachable; nothing was deleted.
            CheckpointError: any other failure (access denied, bad configuration).
        """
        dest_dir = Path(folder)
        dest_dir.mkdir(parents=True, exist_ok=True)
        started = self.clock()
        for ref in self._patiently(self.refs, "listing checkpoints", started):
            dest = dest_dir / f"{ref.id}.ckpt"
            try:
                self._patiently(
                    functools.partial(self._get_file, ref.data_name, dest),
                    f"downloading checkpoint {ref.id}",
                    started,
                )
            except CheckpointMissingError as exc:
                log.warning("checkpoint %s in %s is missing (%s); trying the previous one",
                            ref.id, self.uri, exc)  # fmt: skip
                continue
            actual_size = dest.stat().st_size
            actual = sha256_of(dest) if actual_size == ref.size else ""
            if actual != ref.sha256:
                log.warning(
                    "checkpoint %s in %s is corrupt (%d bytes, sha256 %s; manifest says %d "
                    "bytes, %s); trying the previous one",
                    ref.id, self.uri, actual_size, actual[:12] or "-", ref.size, ref.sha256[:12],
                )  # fmt: skip
                dest.unlink(missing_ok=True)
                continue
            self.verified_id = ref.id
            return dest, ref
        return None

    def _patiently(self, op: Callable[[], T], what: str, started: float) -> T:
        """Runs ``op``, retrying :class:`StoreUnavailableError` with backoff until
        :attr:`patience_s` after ``started``; then raises one clear error."""
        wait, longest = RESUME_BACKOFF_S
        while True:
            try:
                return op()
            except StoreUnavailableError as exc:
                self.unavailable_seen = True
                waited = self.clock() - started
                left = self.patience_s - waited
                if left <= 0:
                    raise StoreUnavailableError(
                        f"{self.uri} stayed unreachable for {waited:.0f} s while {what} "
                        f"({exc}); stopping instead of resuming from an older checkpoint "
                        "or from scratch, and nothing was deleted - retry when the store "
                        "is reachable"
                    ) from None
                pause = min(wait, left)
                log.warning("%s: store unavailable (%s); retrying in %.0f s", what, exc, pause)
                self.sleep(pause)
                wait = min(wait * 2, longest)

    def prune(self) -> None:
        """Keeps the ``keep`` checkpoints furthest ahead and removes orphaned data.

        Orphans are data objects without a manifest that are older than
        :data:`ORPHAN_AGE_S`: uploads that died before their manifest was written (a
        younger one may be another writer's upload whose manifest is still to come).
        Never removed:
        the newest verified checkpoint, and any checkpoint further ahead (a higher step)
        than it, so a job that somehow started behind what is stored cannot prune away
        the progress it failed to read. Nothing is removed once a read met an
        unavailable store (what is stored is then not known well enough to delete).
        """
        if self.unavailable_seen:
            log.warning("not pruning %s: a read found the store unavailable earlier", self.uri)
            return
        ids = self.checkpoint_ids()
        protected: set[str] = set()
        if self.verified_id:
            floor = _step_of(self.verified_id)
            protected = {i for i in ids if _step_of(i) > floor} | {self.verified_id}
        for old in ids[self.keep :]:
            if old in protected:
                continue
            self._delete(manifest_name(old))
            self._delete(data_name(old))
        manifested = set(ids)  # pruned ones lost their data above
        cutoff = self.now_ns() - int(ORPHAN_AGE_S * 1e9)
        for name in self._list(DATA_DIR):
            stem = name[: -len(".ckpt")] if name.endswith(".ckpt") else name
            if _ID.match(stem) and stem not in manifested and _stamp_of(stem) < cutoff:
                self._delete(f"{DATA_DIR}/{name}")

    def _read_manifest(self, checkpoint_id: str) -> CheckpointRef | None:
        name = manifest_name(checkpoint_id)
        source = f"{self.uri.rstrip('/')}/{name}"
        try:
            raw = self._get_bytes(name)
            return CheckpointRef.from_manifest(json.loads(raw), source=source)
        except (CheckpointMissingError, SchemaError, ValueError) as exc:
            # Missing or garbled: this checkpoint is unusable. An unavailable store
            # (StoreUnavailableError) propagates: the manifest may be perfectly good.
            log.warning("skipping unreadable checkpoint manifest %s: %s", source, exc)
            return None


# ------------------------------------------------------------------------------ local
class LocalStore(CheckpointStore):
    """Checkpoints in a directory (a local disk or a shared file system)."""

    def __init__(self, root: str | os.PathLike[str], *, keep: int = DEFAULT_KEEP):
        self.root = Path(root).expanduser().resolve()
        super().__init__(str(self.root), keep)

    def check(self) -> None:
        try:
            for folder in (DATA_DIR, MANIFEST_DIR):
                (self.root / folder).mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=self.root, prefix=".probe-", delete=True)
            probe.close()
        except OSError as exc:
            raise CheckpointError(
                f"checkpoint directory {self.root} is not writable ({exc.strerror or exc})"
            ) from None

    @contextmanager
    def _atomic(self, name: str) -> Iterator[Path]:
        """Yields a temporary path next to ``name``; renames it into place on success."""
        target = self.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                        dir=target.parent)  # fmt: skip
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            yield tmp
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        except OSError as exc:
            raise CheckpointError(f"cannot write {target}: {exc.strerror or exc}") from None
        finally:
            tmp.unlink(missing_ok=True)

    def _put_file(self, local: Path, name: str) -> None:
        with self._atomic(name) as tmp:
            shutil.copyfile(local, tmp)

    def _put_bytes(self, data: bytes, name: str) -> None:
        with self._atomic(name) as tmp:
            tmp.write_bytes(data)

    def _get_file(self, name: str, dest: Path) -> None:
        source = self.root / name
        dest.unlink(missing_ok=True)
        try:
            # A hard link is instant and survives pruning of the stored copy.
            os.link(source, dest)
        except FileNotFoundError:
            raise CheckpointMissingError(f"{source} is missing") from None
        except OSError:
            try:
                shutil.copyfile(source, dest)
            except OSError as exc:
                raise CheckpointError(f"cannot read {source}: {exc.strerror or exc}") from None

    def _get_bytes(self, name: str) -> bytes:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            raise CheckpointMissingError(f"{self.root / name} is missing") from None
        except OSError as exc:
            raise CheckpointError(
                f"cannot read {self.root / name}: {exc.strerror or exc}"
            ) from None

    def _list(self, folder: str) -> list[str]:
        try:
            return [p.name for p in (self.root / folder).iterdir() if not p.name.startswith(".")]
        except FileNotFoundError:
            return []

    def _delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    """Makes a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------- S3
def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``."""
    match = re.fullmatch(r"s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?", uri)
    if not match:
        raise CheckpointError(
            f"--checkpoint-uri {uri!r} is not a valid S3 URI: use s3://bucket[/prefix] "
            "(bucket names are 3-63 lowercase letters, digits, dots and hyphens)"
        )
    return match.group(1), (match.group(2) or "").strip("/")


class S3Store(CheckpointStore):
    """Checkpoints under an S3 prefix, through boto3.

    Args:
        uri: ``s3://bucket/prefix``.
        keep: How many checkpoints to retain.
        endpoint_url: An S3-compatible endpoint (default: ``$SRIFTY_S3_ENDPOINT_URL`` or
            AWS's own); credentials come from boto3's usual chain and are never logged.
        max_attempts: botocore attempts per request, with exponential backoff.
        env: Environment to read the endpoint from (tests pass their own).
    """

    def __init__(
        self,
        uri: str,
        *,
        keep: int = DEFAULT_KEEP,
        endpoint_url: str | None = None,
        max_attempts: int = S3_MAX_ATTEMPTS,
        env: Mapping[str, str] | None = None,
    ):
        self.bucket, self.prefix = parse_s3_uri(uri)
        super().__init__(f"s3://{self.bucket}/{self.prefix}".rstrip("/"), keep)
        environ = os.environ if env is None else env
        self.endpoint_url = endpoint_url or environ.get(ENV_S3_ENDPOINT_URL) or None
        self.max_attempts = max_attempts
        self._client_cache: Any = None

    def _client(
        self,
        max_attempts: int | None = None,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
    ) -> Any:
        import boto3
        from botocore.config import Config

        if max_attempts is None and self._client_cache is not None:
            return self._client_cache
        config = Config(
            # total_max_attempts counts the first try; botocore's max_attempts does not.
            retries={"total_max_attempts": max_attempts or self.max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
        )
        session = boto3.session.Session()
        if not is_ec2():
            # botocore's last credential source asks 169.254.169.254 for a role; off EC2
            # that is a packet to nowhere and a timeout, so it is left out.
            resolver = session._session.get_component("credential_provider")  # noqa: SLF001
            resolver.remove("iam-role")
        client = session.client("s3", endpoint_url=self.endpoint_url, config=config)
        if max_attempts is None:
            self._client_cache = client
        return client

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Runs one boto3 call, turning its failures into one-line errors.

        Missing objects become :class:`CheckpointMissingError`; connection failures,
        timeouts, 5xx answers and throttling (after botocore's own retries) become
        :class:`StoreUnavailableError`; everything else a plain :class:`CheckpointError`.
        """
        from boto3.exceptions import RetriesExceededError, S3UploadFailedError
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        try:
            return fn()
        except (NoCredentialsError, PartialCredentialsError):
            raise CredentialsError(
                f"no usable AWS credentials for {self.uri}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run on an instance with a role"
            ) from None
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "?"))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if code in ("NoSuchBucket",) or (code == "404" and what == "check"):
                raise CheckpointError(f"bucket {self.bucket} does not exist ({self.uri})") from None
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise CheckpointError(
                    f"access to {self.uri} denied ({code}); check the bucket policy and "
                    "your credentials"
                ) from None
            detail = f"{code} {error.get('Message', '')}".rstrip()
            if code in _S3_MISSING_CODES:
                raise CheckpointMissingError(f"S3 {what} of {self.uri}: {detail}") from None
            if code in _S3_UNAVAILABLE_CODES or status >= 500 or status == 429:
                raise StoreUnavailableError(f"S3 {what} failed for {self.uri}: {detail}") from None
            raise CheckpointError(f"S3 {what} failed for {self.uri}: {detail}") from None
        except S3UploadFailedError as exc:
            raise CheckpointError(f"S3 upload to {self.uri} failed: {exc}") from None
        except (ConnectionError, HTTPClientError, RetriesExceededError) as exc:
            # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError,
            # ConnectionClosedError ... : nothing was learnt about the object.
            raise StoreUnavailableError(f"S3 {what} failed for {self.uri}: {exc}") from None
        except BotoCoreError as exc:
            raise CheckpointError(f"S3 {what} failed for {self.uri}: {exc}") from None

    def check(self) -> None:
        """Fails within :data:`S3_CHECK_DEADLINE_S` with one line when S3 is unusable.

        Short timeouts and two attempts bound a hung endpoint (one that accepts the
        connection and never answers) to about 11 s; building the client and the HEAD
        run in a worker thread joined with a hard deadline, so neither a stack of
        retries nor a slow machine's botocore set-up can take longer.
        """
        from concurrent.futures import ThreadPoolExecutor
        from concurrent.futures import TimeoutError as FutureTimeout

        def head() -> Any:
            client = self._client(
                max_attempts=S3_CHECK_ATTEMPTS,
                connect_timeout=S3_CHECK_CONNECT_TIMEOUT_S,
                read_timeout=S3_CHECK_READ_TIMEOUT_S,
            )
            return self._call("check", lambda: client.head_bucket(Bucket=self.bucket))

        where = self.endpoint_url or "AWS S3"
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="srifty-s3-check")
        future = pool.submit(head)
        try:
            future.result(timeout=S3_CHECK_DEADLINE_S)
        except FutureTimeout:
            raise StoreUnavailableError(
                f"S3 check failed for {self.uri}: {where} did not answer within "
                f"{S3_CHECK_DEADLINE_S:.0f} s; check the network and SRIFTY_S3_ENDPOINT_URL"
            ) from None
        except StoreUnavailableError as exc:
            raise StoreUnavailableError(
                f"{exc}; {where} did not answer (tried {S3_CHECK_ATTEMPTS} times, "
                f"{S3_CHECK_READ_TIMEOUT_S:.0f} s each) - check the network and "
                "SRIFTY_S3_ENDPOINT_URL"
            ) from None
        finally:
            pool.shutdown(wait=False)

    def _put_file(self, local: Path, name: str) -> None:
        client = self._client()
        self._call("upload", lambda: client.upload_file(str(local), self.bucket, self._key(name)))

    def _put_bytes(self, data: bytes, name: str) -> None:
        client = self._client()
        self._call(
            "upload",
            lambda: client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data),
        )

    def _get_file(self, name: str, dest: Path) -> None:
        client = self._client()
        tmp = dest.with_name(dest.name + ".part")
        try:
            self._call(
                "download",
                lambda: client.download_file(self.bucket, self._key(name), str(tmp)),
            )
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def _get_bytes(self, name: str) -> bytes:
        client = self._client()
        response = self._call(
            "download", lambda: client.get_object(Bucket=self.bucket, Key=self._key(name))
        )
        return bytes(response["Body"].read())

    def _list(self, folder: str) -> list[str]:
        client = self._client()
        prefix = self._key(folder) + "/"
        paginator = client.get_paginator("list_objects_v2")

        def collect() -> list[str]:
            names = []
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    names.append(str(item["Key"])[len(prefix) :])
            return [n for n in names if n and "/" not in n]

        return self._call("list", collect)

    def _delete(self, name: str) -> None:
        client = self._client()
        self._call("delete", lambda: client.delete_object(Bucket=self.bucket, Key=self._key(name)))


def open_store(
    uri: str, *, keep: int = DEFAULT_KEEP, env: Mapping[str, str] | None = None
) -> CheckpointStore:
    """The store behind ``uri``: ``s3://bucket/prefix``, ``file:///path`` or a path."""
    if not uri:
        raise CheckpointError("no checkpoint URI given")
    if uri.startswith("s3://"):
        return S3Store(uri, keep=keep, env=env)
    if "://" in uri and not uri.startswith("file://"):
        scheme = uri.split("://", 1)[0]
        raise CheckpointError(
            f"--checkpoint-uri scheme {scheme!r} is not supported: use s3://bucket/prefix, "
            "file:///path or a directory path"
        )
    return LocalStore(uri.removeprefix("file://"), keep=keep)
