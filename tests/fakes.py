"""The only fakes in the test suite: stand-ins for parts that cannot run here.

Everything else in tests is real (Lightning Trainer, torch.distributed on gloo,
sky.Task/sky.Resources, boto3 against moto's standalone server).
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# ---------------------------------------------------------------------------------------
# SkyPilot SDK (owned by the SkyPilot adapter, lightning_srifty/launch/sky_backend.py)
#
# Every sky.* SDK call goes to a SkyPilot API server that provisions cloud VMs, which
# cannot run here. FakeSkySdk stands in for exactly that surface (launch, status,
# job_status, down, enabled_clouds and the request/result round trip). The tasks it
# receives are the real sky.Task objects the backend built; it records them untouched.
# ---------------------------------------------------------------------------------------


class FakeSkyHandle:
    """The two attributes of SkyPilot's CloudVmRayResourceHandle the backend reads."""

    def __init__(self, internal_ips: list[str], external_ips: list[str]):
        self.cached_internal_ips = internal_ips
        self.head_ip = external_ips[0]


class FakeSkySdk:
    """A SkyPilot API server that "provisions" clusters instantly and records requests.

    Args:
        enabled: Clouds the server reports as enabled (as ``sky check`` would).
        fail_launch_of: Cluster names whose launch raises ``launch_error``.
        launch_error: The SkyPilot exception a failing launch raises.
    """

    def __init__(
        self,
        enabled: tuple[str, ...] = ("AWS",),
        *,
        fail_launch_of: tuple[str, ...] = (),
        launch_error: BaseException | None = None,
    ):
        self.enabled = enabled
        self.fail_launch_of = fail_launch_of
        self.launch_error = launch_error
        self.launched: list[tuple[str, object, dict[str, object]]] = []
        """(cluster name, the sky.Task given, the other keyword arguments)."""
        self.downed: list[str] = []
        self.clusters: dict[str, object] = {}
        """Cluster name -> sky ClusterStatus."""
        self.jobs: dict[str, object] = {}
        """Cluster name -> sky JobStatus of its job 1."""
        self.job_log: list[str] = []
        """Chunks every job's log streams (``tail_logs``), in order."""
        self.job_progression: list[object] = []
        """Job states every newly launched cluster's job 1 goes through, one per poll."""
        self._progress: dict[str, list[object]] = {}
        self._results: dict[str, tuple[bool, object]] = {}
        self._next_request = 0

    def _request(self, value: object = None, error: BaseException | None = None) -> str:
        self._next_request += 1
        request_id = f"req-{self._next_request}"
        self._results[request_id] = (error is None, error if error is not None else value)
        return request_id

    def get(self, request_id: str) -> object:
        ok, value = self._results.pop(request_id)
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        return value

    def stream_and_get(self, request_id: str) -> object:
        return self.get(request_id)

    def enabled_clouds(self) -> str:
        return self._request(list(self.enabled))

    def launch(self, task: object, **kwargs: object) -> str:
        import sky
        from sky.skylet import job_lib
        from sky.utils import status_lib

        assert isinstance(task, sky.Task), f"launch got {type(task).__name__}, not sky.Task"
        name = str(kwargs["cluster_name"])
        self.launched.append((name, task, dict(kwargs)))
        if name in self.fail_launch_of:
            error = self.launch_error or sky.exceptions.ResourcesUnavailableError("no capacity")
            return self._request(error=error)
        index = len(self.clusters) + 1
        internal = [f"10.0.{index}.{node + 1}" for node in range(task.num_nodes)]
        external = [f"203.0.113.{10 * index + node}" for node in range(task.num_nodes)]
        self.clusters[name] = status_lib.ClusterStatus.UP
        self.jobs[name] = job_lib.JobStatus.PENDING
        self._progress[name] = list(self.job_progression)
        return self._request((1, FakeSkyHandle(internal, external)))

    def status(self, cluster_names: list[str], **kwargs: object) -> str:
        records = [
            {"name": name, "status": self.clusters[name]}
            for name in cluster_names
            if name in self.clusters
        ]
        return self._request(records)

    def job_status(self, cluster_name: str, job_ids: list[int] | None = None) -> str:
        import sky

        if cluster_name not in self.clusters:
            return self._request(error=sky.exceptions.ClusterDoesNotExist(cluster_name))
        upcoming = self._progress.get(cluster_name)
        if upcoming:
            self.jobs[cluster_name] = upcoming.pop(0)
        return self._request({job_id: self.jobs[cluster_name] for job_id in job_ids or [1]})

    def down(self, cluster_name: str) -> str:
        import sky

        if cluster_name not in self.clusters:
            return self._request(error=sky.exceptions.ClusterDoesNotExist(cluster_name))
        del self.clusters[cluster_name]
        self.jobs.pop(cluster_name, None)
        self.downed.append(cluster_name)
        return self._request()

    def tail_logs(
        self, cluster_name: str, job_id: int | None, follow: bool, tail: int = 0, **kwargs: object
    ) -> object:
        """The job's log as chunks then ``None``, like ``preload_content=False``."""
        assert kwargs.get("preload_content") is False
        return iter([*self.job_log, None])

    def reclaim(self, cluster_name: str) -> None:
        """AWS takes the spot instances back: the cluster disappears from the server."""
        del self.clusters[cluster_name]
        self.jobs.pop(cluster_name, None)


# ---------------------------------------------------------------------------------------
# EC2 instance metadata service (owned by capture/imds.py, used by capture/environment.py
# and capture/preemption.py)
#
# 169.254.169.254 exists only on EC2. FakeImds answers the IMDSv2 calls we make, the
# way AWS documents them ("Use IMDSv2", "Instance metadata categories"): a PUT to
# /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds (1..21600) returns a token
# valid for that many seconds; a GET without a valid token is 401; the spot
# instance-action path is 404 until AWS schedules an interruption. It can also hang:
# the first `hang_next` requests are accepted and never answered (a service or network
# that does not respond), which is what a client must survive.
# ---------------------------------------------------------------------------------------


class FakeImds(BaseHTTPRequestHandler):
    """IMDSv2 on 127.0.0.1: expiring tokens, instance type, region and the spot notice."""

    requests: list[str] = []
    answered: list[int] = []
    spot_notice: dict[str, str] | None = None
    """Set to e.g. ``{"action": "terminate", "time": "..."}`` to issue a notice."""
    hang_next = 0
    tokens: dict[str, float] = {}
    """Token -> expiry (``time.monotonic()``)."""
    release = threading.Event()

    def do_PUT(self) -> None:  # noqa: N802
        self.requests.append(f"PUT {self.path}")
        if self._hang():
            return
        raw = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        ok = self.path == "/latest/api/token" and raw.isdigit() and 1 <= int(raw) <= 21600
        if not ok:
            self._reply("", 400)
            return
        token = f"t0k3n-{len(self.tokens)}"
        self.tokens[token] = time.monotonic() + int(raw)
        self._reply(token, 200)

    def do_GET(self) -> None:  # noqa: N802
        self.requests.append(f"GET {self.path}")
        if self._hang():
            return
        expiry = self.tokens.get(self.headers.get("X-aws-ec2-metadata-token", ""))
        if expiry is None or time.monotonic() >= expiry:
            self._reply("", 401)
            return
        answers = {
            "/latest/meta-data/instance-type": "p3.8xlarge",
            "/latest/meta-data/placement/region": "us-west-2",
        }
        if self.spot_notice is not None:
            answers["/latest/meta-data/spot/instance-action"] = json.dumps(self.spot_notice)
        self._reply(answers.get(self.path, ""), 200 if self.path in answers else 404)

    def _hang(self) -> bool:
        """Accepts the request and never answers it (until the server stops)."""
        cls = type(self)
        if cls.hang_next <= 0:
            return False
        cls.hang_next -= 1
        self.answered.append(0)
        cls.release.wait(60)
        self.close_connection = True
        return True

    def _reply(self, body: str, status: int) -> None:
        self.answered.append(status)
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@contextmanager
def serve_fake_imds() -> Iterator[str]:
    """Runs :class:`FakeImds` on a free port; yields its endpoint URL."""
    FakeImds.requests = []
    FakeImds.answered = []
    FakeImds.spot_notice = None
    FakeImds.hang_next = 0
    FakeImds.tokens = {}
    FakeImds.release = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeImds)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        FakeImds.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        FakeImds.spot_notice = None


@contextmanager
def silent_endpoint() -> Iterator[str]:
    """A socket on 127.0.0.1 that accepts connections and never answers; yields its URL."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel completes handshakes; nothing is ever read
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


# ---------------------------------------------------------------------------------------
# S3 faults (owned by io/checkpoint_store.py)
#
# The S3 API itself is real (moto's standalone server, started by tests/conftest.py).
# What cannot be produced on demand is a network that drops connections or an S3 that
# throttles. FaultyS3Proxy sits between boto3 and the moto server, forwards every
# request over real HTTP, and injects those faults on a schedule.
# ---------------------------------------------------------------------------------------

_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


class FaultyS3Proxy:
    """A forwarding proxy in front of an S3 endpoint that injects faults.

    Attributes (set them between calls):
        throttle_next: the next N requests get ``503 SlowDown``.
        reset_next: the next N requests have their connection closed without a reply.
        fail_puts_matching: every PUT whose path contains this text gets
            ``500 InternalError`` (``None``: none).
        fail_gets_matching: the same for GETs (a store whose reads keep failing).
        outage_until: ``time.monotonic()`` before which every request has its
            connection closed without a reply (an outage of the network or of S3).
        faults: how many faults were injected so far.
    """

    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.throttle_next = 0
        self.reset_next = 0
        self.fail_puts_matching: str | None = None
        self.fail_gets_matching: str | None = None
        self.outage_until = 0.0
        self.faults = 0
        self.requests: list[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._fault_for(self.command, self.path)
                if fault == "reset":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if fault in ("throttle", "internal"):
                    payload = _SLOW_DOWN if fault == "throttle" else _INTERNAL
                    self.send_response(503 if fault == "throttle" else 500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(
                    proxy.upstream.hostname, proxy.upstream.port, timeout=30
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream.netloc
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for key, value in resp.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815

            def log_message(self, format: str, *args: object) -> None:
                """Quiet."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _fault_for(self, method: str, path: str) -> str | None:
        with self._lock:
            self.requests.append(f"{method} {path}")
            if time.monotonic() < self.outage_until:
                self.faults += 1
                return "reset"
            if self.reset_next > 0:
                self.reset_next -= 1
                self.faults += 1
                return "reset"
            if self.throttle_next > 0:
                self.throttle_next -= 1
                self.faults += 1
                return "throttle"
            if method == "PUT" and self.fail_puts_matching and self.fail_puts_matching in path:
                self.faults += 1
                return "internal"
            if method == "GET" and self.fail_gets_matching and self.fail_gets_matching in path:
                self.faults += 1
                return "internal"
            return None

    def __enter__(self) -> FaultyS3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------------------------------
# The person at the terminal (owned by launch/launcher.py's LauncherUI)
#
# srifty-launch asks for confirmation and draws a live display; a test has nobody to
# answer and no screen. RecordingUI answers with a fixed choice and keeps what it was
# shown, so tests can assert on the journey.
# ---------------------------------------------------------------------------------------
class RecordingUI:
    """A LauncherUI that confirms (or refuses) and records every call."""

    def __init__(self, confirm: bool = True):
        self.answer = confirm
        self.messages: list[str] = []
        self.profiles: list[object] = []
        self.plans: list[object] = []
        self.dry_runs: list[object] = []
        self.updates: list[tuple[object, object, object]] = []
        self.migrations: list[object] = []
        self.summaries: list[object] = []

    def info(self, message: str) -> None:
        self.messages.append(message)

    def show_profile(self, run: object) -> None:
        self.profiles.append(run)

    def show_plan(self, result: object, request: object) -> None:
        self.plans.append(result)

    def confirm(self, plan: object) -> bool:
        return self.answer

    def show_dry_run(self, report: object) -> None:
        self.dry_runs.append(report)

    def progress(self, plan: object, snap: object, expect: object) -> None:
        self.updates.append((plan, snap, expect))

    def migration(self, move: object) -> None:
        self.migrations.append(move)

    def summary(self, outcome: object) -> None:
        self.summaries.append(outcome)
