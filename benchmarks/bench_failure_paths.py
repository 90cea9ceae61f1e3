"""The real-cloud failure paths, measured in one run.

1. The SkyPilot scenario table (tests/launch/test_sky_scenarios.py) through the real
   controller on the fake API server: outcome, attempts, moves, clusters left up.
2. An S3 outage while resuming (the fault proxy in front of moto's real server):
   a short outage is waited out and gives the newest checkpoint; a long one is a clear
   error and nothing is deleted.
3. The S3 start-up check against an endpoint that accepts and never answers (<= 15 s).
4. The EC2 metadata look-up: off EC2 nothing is sent; a silent endpoint costs little.

    .venv/bin/python benchmarks/bench_failure_paths.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")
os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")


def scenarios() -> None:
    import logging

    logging.disable(logging.WARNING)  # the outage rows log every retry
    from lightning_srifty.launch import sky_runtime

    runtime = sky_runtime.prepare_offline_runtime(tempfile.mkdtemp(prefix="srifty-sky-"))
    sky_runtime.activate_in_process(runtime)
    from tests.fakes import ClusterScript
    from tests.launch import test_sky_scenarios as table

    print("SkyPilot scenarios (virtual time; real controller, SkyBackend/SkyJobsBackend):")
    print(f"  {'scenario':<40} {'outcome':<44} {'att':>3} {'moves':>5} {'left up':>7}")
    left_total = 0
    for managed, rows in ((False, table.SCENARIOS), (True, table.MANAGED)):
        for name, (scripts, options, check) in rows.items():
            with tempfile.TemporaryDirectory() as tmp:
                started = time.perf_counter()
                o = table.run(
                    Path(tmp), [ClusterScript(**vars(s)) for s in scripts], managed=managed,
                    **options,
                )  # fmt: skip
                check(o)  # the same checks as the test: raises if a row is wrong
                took = time.perf_counter() - started
            left = len(o.fake.left_up())
            left_total += left
            if o.summary is not None:
                what = f"completed {o.summary.steps_done} steps"
                attempts = len(o.summary.attempts)
                moves = len(o.summary.migrations) + o.summary.recoveries
            else:
                what = o.error.split("; ", 1)[-1][:44] if "state" in o.error else o.error[:44]
                attempts, moves = 0, 0
            label = ("managed: " if managed else "") + name
            print(f"  {label:<40} {what:<44} {attempts:>3} {moves:>5} {left:>7}"
                  f"   ({o.fake.clock.now / 3600:.2f} h virtual, {took:.2f} s real)")  # fmt: skip
    print(f"  clusters left up after all scenarios: {left_total}")
    logging.disable(logging.NOTSET)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def s3_paths() -> None:
    import boto3

    from lightning_srifty.core.errors import StoreUnavailableError
    from lightning_srifty.io.checkpoint_store import S3Store, open_store
    from tests.fakes import FaultyS3Proxy

    port = _free_port()
    moto = subprocess.Popen(  # noqa: S603 - fixed argv
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )  # fmt: skip
    try:
        for _ in range(150):
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):  # noqa: S310
                    break
            except OSError:
                time.sleep(0.2)
        bucket = "srifty-" + uuid.uuid4().hex[:12]
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/run"
        with tempfile.TemporaryDirectory() as tmp:
            payload = Path(tmp) / "ckpt"
            payload.write_bytes(os.urandom(200_000))
            direct = S3Store(uri, endpoint_url=endpoint, keep=3)
            ids = [direct.save(payload, step=s, reason="p").id for s in (100, 200, 300)]
            print("S3 outage while resuming (fault proxy in front of moto):")
            with FaultyS3Proxy(endpoint) as proxy:
                store = S3Store(uri, endpoint_url=proxy.url, max_attempts=2, keep=3)
                proxy.outage_until = time.monotonic() + 4.0
                started = time.monotonic()
                found = store.fetch_latest(Path(tmp) / "r1")
                took = time.monotonic() - started
                assert found is not None
                print(f"  4 s outage: resumed from step {found[1].step} (newest) after "
                      f"{took:.1f} s, {proxy.faults} requests reset")  # fmt: skip
                store = S3Store(uri, endpoint_url=proxy.url, max_attempts=2, keep=3)
                store.patience_s = 8.0
                proxy.fail_gets_matching = f"/data/{ids[-1]}"
                started = time.monotonic()
                try:
                    store.fetch_latest(Path(tmp) / "r2")
                    outcome = "resumed (unexpected)"
                except StoreUnavailableError as exc:
                    outcome = f"error after {time.monotonic() - started:.1f} s: {exc}"
                proxy.fail_gets_matching = None
                store.save(payload, step=5, reason="p")  # a job that went on regardless
            left = open_store(uri, env={"SRIFTY_S3_ENDPOINT_URL": endpoint}).checkpoint_ids()
            kept = sorted(int(i[-9:]) for i in left)
            print(f"  newest keeps failing (patience 8 s): {outcome[:150]}")
            print(f"  checkpoints afterwards: steps {kept} (100/200/300 all kept)")
        with socket.socket() as hung:
            hung.bind(("127.0.0.1", 0))
            hung.listen(16)
            store = S3Store(uri, endpoint_url=f"http://127.0.0.1:{hung.getsockname()[1]}")
            started = time.monotonic()
            try:
                store.check()
            except StoreUnavailableError as exc:
                message = str(exc)
            took = time.monotonic() - started
        print(f"S3 check on a hung endpoint: failed in {took:.1f} s (target <= 15 s): "
              f"{message[:120]}")  # fmt: skip
    finally:
        moto.terminate()
        moto.wait(timeout=10)


def imds() -> None:
    from lightning_srifty.capture.environment import detect_placement, query_imds
    from tests.fakes import FakeImds, serve_fake_imds, silent_endpoint

    with serve_fake_imds() as endpoint, tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sys_vendor").write_text("LENOVO\n")
        detect_placement({}, endpoint=endpoint, dmi_dir=Path(tmp),
                         hypervisor_uuid=Path(tmp) / "none")  # fmt: skip
        sent = len(FakeImds.requests)
    with silent_endpoint() as endpoint:
        started = time.monotonic()
        query_imds(endpoint, timeout_s=0.2)
        took = time.monotonic() - started
    print(f"EC2 metadata: off EC2 {sent} requests sent; a silent endpoint costs {took:.2f} s")


def main() -> int:
    scenarios()
    s3_paths()
    imds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
