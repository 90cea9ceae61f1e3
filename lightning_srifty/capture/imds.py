"""The EC2 instance metadata service (IMDSv2), asked only on EC2 and never through a proxy.

Two parts of the job read it: the profiling run (instance type and region) and the
preemption watcher (the spot interruption notice, polled every 5 s). Both go through
:class:`ImdsClient`, which is careful in the ways a long-running poller must be:

* **Only on EC2.** 169.254.169.254 exists only there; anywhere else (a laptop, CI,
  ``make demo``) a request is a packet to nowhere and a timeout. :func:`is_ec2` asks the
  machine the way AWS documents it ("Detect whether a host is an EC2 instance", as
  cloud-init's ``ds-identify`` and ``amazon-ec2-utils`` do): the DMI vendor
  (``/sys/devices/virtual/dmi/id/board_vendor`` or ``sys_vendor``) is ``Amazon EC2`` on
  Nitro instances, and ``/sys/hypervisor/uuid`` starts with ``ec2`` on older Xen ones.
  ``SRIFTY_IMDS=on`` forces the service on, ``off`` forbids it; the default ``auto``
  trusts the DMI check.
* **No proxy.** A ``HTTP_PROXY`` in the environment must not see metadata requests
  (AWS's SDKs add 169.254.169.254 to ``NO_PROXY`` for the same reason); the client's
  opener has no proxy handler at all.
* **Retries.** A timeout is retried with backoff instead of disabling the poller for
  good; the token is refreshed *before* its TTL runs out, and a 401 (token rejected)
  fetches a new one once.
"""

from __future__ import annotations

import functools
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from lightning_srifty.core.errors import MetadataTokenError, MetadataUnavailableError
from lightning_srifty.core.launch_protocol import ENV_IMDS
from lightning_srifty.io.ec2 import DMI_DIR, HYPERVISOR_UUID, is_ec2

__all__ = [
    "DMI_DIR",
    "ENV_IMDS_ENDPOINT",
    "HYPERVISOR_UUID",
    "IMDS_ENDPOINT",
    "ImdsClient",
    "imds_allowed",
    "imds_endpoint",
    "is_ec2",
]

IMDS_ENDPOINT = "http://169.254.169.254"
ENV_IMDS_ENDPOINT = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
"""The AWS SDKs' override of the metadata endpoint (botocore and the CLI read it too);
honoured here so the job asks the same service they do (and tests a local one)."""
TOKEN_TTL_S = 21600
"""IMDSv2 tokens live at most six hours."""
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"


def imds_mode(env: Mapping[str, str]) -> str:
    """``on``, ``off`` or ``auto`` from ``SRIFTY_IMDS`` (unknown values mean ``auto``)."""
    raw = env.get(ENV_IMDS, "auto").strip().lower()
    if raw in ("off", "0", "false", "no"):
        return "off"
    if raw in ("on", "1", "true", "yes", "force"):
        return "on"
    return "auto"


def imds_endpoint(env: Mapping[str, str]) -> str:
    """The metadata service to ask: ``AWS_EC2_METADATA_SERVICE_ENDPOINT`` or the default."""
    raw = env.get(ENV_IMDS_ENDPOINT, "").strip()
    return raw.rstrip("/") if raw else IMDS_ENDPOINT


def imds_allowed(
    env: Mapping[str, str],
    *,
    dmi_dir: Path = DMI_DIR,
    hypervisor_uuid: Path = HYPERVISOR_UUID,
) -> bool:
    """Whether the metadata service may be asked at all (see the module docstring)."""
    mode = imds_mode(env)
    if mode == "off":
        return False
    if mode == "on":
        return True
    return is_ec2(dmi_dir, hypervisor_uuid)


class ImdsClient:
    """IMDSv2 requests with retries, proactive token refresh and no proxy.

    Args:
        endpoint: The service (tests point it at 127.0.0.1).
        timeout_s: Per-request timeout.
        attempts: Tries per call before :class:`MetadataUnavailableError`.
        backoff_s: First wait between tries (doubling).
        token_ttl_s: TTL asked for each token; it is refreshed after 90 % of it.
        clock: Monotonic clock (tests pass their own).
        sleep: How to wait between tries.
    """

    def __init__(
        self,
        endpoint: str = IMDS_ENDPOINT,
        *,
        timeout_s: float = 1.0,
        attempts: int = 3,
        backoff_s: float = 0.25,
        token_ttl_s: int = TOKEN_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s
        self.attempts = max(attempts, 1)
        self.backoff_s = backoff_s
        self.token_ttl_s = max(int(token_ttl_s), 1)
        self._clock = clock
        self._sleep = sleep
        # No ProxyHandler: metadata requests never go through HTTP(S)_PROXY.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._token: str | None = None
        self._refresh_at = 0.0

    def token(self) -> str:
        """A valid session token, fetched anew once 90 % of its TTL has passed."""
        if self._token is None or self._clock() >= self._refresh_at:
            issued = self._clock()
            try:
                body = self._retrying(
                    lambda: self._open(
                        "PUT", "/latest/api/token", {TTL_HEADER: str(self.token_ttl_s)}
                    )
                )
            except _Unauthorized:
                raise MetadataTokenError("the metadata service refused a token") from None
            except MetadataUnavailableError as exc:
                raise MetadataTokenError(f"no IMDSv2 token: {exc}") from None
            if body is None:
                raise MetadataTokenError("the metadata service issued no token")
            self._token = body
            self._refresh_at = issued + 0.9 * self.token_ttl_s
        return self._token

    def get(self, path: str) -> str | None:
        """The text at ``/latest/meta-data/<path>``; ``None`` when it does not exist (404).

        Raises:
            MetadataUnavailableError: no answer after :attr:`attempts` tries.
        """
        url = f"/latest/meta-data/{path.lstrip('/')}"
        for renewed in (False, True):
            headers = {TOKEN_HEADER: self.token()}
            try:
                return self._retrying(functools.partial(self._open, "GET", url, headers))
            except _Unauthorized:
                if renewed:
                    break
                self._token = None  # rejected early (service restarted): one fresh token
        raise MetadataUnavailableError(f"the metadata service rejected a new token for {url}")

    def _retrying(self, request: Callable[[], str | None]) -> str | None:
        wait = self.backoff_s
        last = ""
        for attempt in range(self.attempts):
            try:
                return request()
            except _Unauthorized:
                raise
            except MetadataUnavailableError as exc:
                last = str(exc)
                if attempt + 1 < self.attempts:
                    self._sleep(wait)
                    wait *= 2
        raise MetadataUnavailableError(
            f"no answer from {self.endpoint} after {self.attempts} tries ({last})"
        )

    def _open(self, method: str, path: str, headers: Mapping[str, str]) -> str | None:
        request = urllib.request.Request(
            f"{self.endpoint}{path}", method=method, headers=dict(headers)
        )
        try:
            with self._opener.open(request, timeout=self.timeout_s) as resp:
                return str(resp.read().decode(errors="replace"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            if exc.code == 401:
                raise _Unauthorized() from None
            raise MetadataUnavailableError(f"HTTP {exc.code} for {path}") from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets
            raise MetadataUnavailableError(f"{type(exc).__name__}: {exc}") from None


class _Unauthorized(MetadataUnavailableError):
    """The token was refused (expired or the service restarted)."""
