"""The only fakes in the test suite: stand-ins for parts that cannot run here.

Everything else in tests is real (Lightning Trainer, torch.distributed on gloo,
sky.Task/sky.Resources, boto3 against moto's standalone server).
"""

from __future__ import annotations

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
        return self._request({job_id: self.jobs[cluster_name] for job_id in job_ids or [1]})

    def down(self, cluster_name: str) -> str:
        import sky

        if cluster_name not in self.clusters:
            return self._request(error=sky.exceptions.ClusterDoesNotExist(cluster_name))
        del self.clusters[cluster_name]
        self.jobs.pop(cluster_name, None)
        self.downed.append(cluster_name)
        return self._request()

    def reclaim(self, cluster_name: str) -> None:
        """AWS takes the spot instances back: the cluster disappears from the server."""
        del self.clusters[cluster_name]
        self.jobs.pop(cluster_name, None)
