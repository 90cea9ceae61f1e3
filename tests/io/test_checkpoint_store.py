"""Checkpoint stores: a local directory and S3 (moto's standalone server, real HTTP)."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from lightning_srifty.core.errors import CheckpointError, CredentialsError, StoreUnavailableError
from lightning_srifty.io.checkpoint_store import (
    ORPHAN_AGE_S,
    S3_CHECK_DEADLINE_S,
    CheckpointRef,
    CheckpointStore,
    LocalStore,
    S3Store,
    new_checkpoint_id,
    open_store,
    parse_s3_uri,
    sha256_of,
)
from tests.fakes import FaultyS3Proxy


@pytest.fixture(params=["local", "s3"])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("s3_uri"))


def _payload(tmp_path: Path, name: str, size: int = 50_000, seed: int = 0) -> Path:
    path = tmp_path / name
    path.write_bytes(bytes((i * 31 + seed) % 251 for i in range(size)))
    return path


def _corrupt(store: CheckpointStore, name: str, tmp_path: Path) -> None:
    """Overwrites one stored object with different bytes of the same size."""
    original = tmp_path / "orig.bin"
    store._get_file(name, original)  # noqa: SLF001 - the test plays the failing disk
    data = bytearray(original.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(data))
    store._put_file(bad, name)  # noqa: SLF001


def test_round_trip_newest_first_and_digest(store_uri: str, tmp_path: Path) -> None:
    store = open_store(store_uri, keep=5)
    store.check()
    assert store.fetch_latest(tmp_path / "empty") is None
    first = store.save(_payload(tmp_path, "a", seed=1), step=10, reason="periodic")
    second = store.save(
        _payload(tmp_path, "b", seed=2), step=20, reason="emergency", extra={"x": 1}
    )
    assert [r.id for r in store.refs()] == [second.id, first.id]
    assert second.id > first.id
    found = store.fetch_latest(tmp_path / "restore")
    assert found is not None
    path, ref = found
    assert ref == second
    assert ref.step == 20 and ref.reason == "emergency" and ref.extra == {"x": 1}
    assert path.read_bytes() == (tmp_path / "b").read_bytes()
    assert ref.sha256 == sha256_of(tmp_path / "b")


def test_retention_keeps_the_last_k(store_uri: str, tmp_path: Path) -> None:
    store = open_store(store_uri, keep=2)
    refs = [store.save(_payload(tmp_path, f"p{i}", seed=i), step=i, reason="p") for i in range(5)]
    assert [r.id for r in store.refs()] == [refs[4].id, refs[3].id]
    data = store._list("data")  # noqa: SLF001
    assert sorted(data) == sorted(f"{r.id}.ckpt" for r in refs[3:])


def test_corrupt_newest_falls_back_to_the_previous(store_uri: str, tmp_path: Path) -> None:
    store = open_store(store_uri)
    good = store.save(_payload(tmp_path, "good", seed=3), step=5, reason="p")
    newest = store.save(_payload(tmp_path, "new", seed=4), step=9, reason="p")
    _corrupt(store, newest.data_name, tmp_path)
    found = store.fetch_latest(tmp_path / "restore")
    assert found is not None
    assert found[1].id == good.id
    assert found[0].read_bytes() == (tmp_path / "good").read_bytes()


def test_truncated_or_missing_data_and_bad_manifest_are_skipped(
    store_uri: str, tmp_path: Path
) -> None:
    store = open_store(store_uri, keep=5)
    oldest = store.save(_payload(tmp_path, "o", seed=5), step=1, reason="p")
    truncated = store.save(_payload(tmp_path, "t", seed=6), step=2, reason="p")
    missing = store.save(_payload(tmp_path, "m", seed=7), step=3, reason="p")
    garbled = store.save(_payload(tmp_path, "g", seed=8), step=4, reason="p")
    short = tmp_path / "short"
    short.write_bytes((tmp_path / "t").read_bytes()[:100])
    store._put_file(short, truncated.data_name)  # noqa: SLF001
    store._delete(missing.data_name)  # noqa: SLF001
    store._put_bytes(b'{"schema_version": 1, "id": ', garbled.manifest_name)  # noqa: SLF001
    found = store.fetch_latest(tmp_path / "restore")
    assert found is not None and found[1].id == oldest.id


def test_future_manifest_version_is_not_trusted(store_uri: str, tmp_path: Path) -> None:
    store = open_store(store_uri)
    old = store.save(_payload(tmp_path, "o", seed=9), step=1, reason="p")
    new = store.save(_payload(tmp_path, "n", seed=10), step=2, reason="p")
    manifest = json.loads(store._get_bytes(new.manifest_name))  # noqa: SLF001
    manifest["schema_version"] = 99
    store._put_bytes(json.dumps(manifest).encode(), new.manifest_name)  # noqa: SLF001
    assert [r.id for r in store.refs()] == [old.id]


def test_orphaned_data_is_pruned_once_no_upload_can_still_be_on_it(
    store_uri: str, tmp_path: Path
) -> None:
    store = open_store(store_uri, keep=2)
    orphan_id = new_checkpoint_id(1, None)
    store._put_file(_payload(tmp_path, "orphan"), f"data/{orphan_id}.ckpt")  # noqa: SLF001
    kept = store.save(_payload(tmp_path, "k", seed=11), step=2, reason="p")
    young = sorted(store._list("data"))  # noqa: SLF001
    assert young == sorted([f"{orphan_id}.ckpt", f"{kept.id}.ckpt"])  # may be in flight
    later = time.time_ns() + int((ORPHAN_AGE_S + 60) * 1e9)
    store.now_ns = lambda: later
    newer = store.save(_payload(tmp_path, "k2", seed=12), step=3, reason="p")
    assert sorted(store._list("data")) == sorted(  # noqa: SLF001
        [f"{kept.id}.ckpt", f"{newer.id}.ckpt"]
    )


def test_two_writers_never_lose_the_one_further_ahead(store_uri: str, tmp_path: Path) -> None:
    """Writer B's upload is in flight (data, no manifest yet) while writer A, behind,
    saves and prunes; B's manifest then lands. A resume takes B's step, with its data."""
    a = open_store(store_uri, keep=1)
    b = open_store(store_uri, keep=1)
    a.save(_payload(tmp_path, "a100", seed=1), step=100, reason="p")
    b_id = new_checkpoint_id(120, None)
    b_data = _payload(tmp_path, "b120", seed=2)
    b._put_file(b_data, f"data/{b_id}.ckpt")  # noqa: SLF001 - B's upload, first half
    a.save(_payload(tmp_path, "a110", seed=3), step=110, reason="p")  # A prunes here
    ref = CheckpointRef(b_id, 120, "p", time.time(), b_data.stat().st_size,
                        sha256_of(b_data), {})  # fmt: skip
    b._put_bytes(json.dumps(ref.to_manifest()).encode(), ref.manifest_name)  # noqa: SLF001
    a.save(_payload(tmp_path, "a111", seed=4), step=111, reason="p")  # and again
    found = open_store(store_uri).fetch_latest(tmp_path / "restore")
    assert found is not None
    assert found[1].step == 120 and found[0].read_bytes() == b_data.read_bytes()


def test_ids_never_go_backwards_when_the_clock_does() -> None:
    later = new_checkpoint_id(5, None, now_ns=2_000_000_000_000_000_000)
    earlier_clock = new_checkpoint_id(6, later, now_ns=1_000_000_000_000_000_000)
    assert earlier_clock > later
    assert new_checkpoint_id(0, None, now_ns=5) < new_checkpoint_id(0, None, now_ns=6)


def test_local_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.save(_payload(tmp_path, "a"), step=1, reason="p")
    leftovers = [p for p in (tmp_path / "store").rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_unwritable_local_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match="not writable"):
        LocalStore(blocker / "store").check()


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("s3://", "not a valid S3 URI"),
        ("s3://Bad_Bucket/x", "not a valid S3 URI"),
        ("gs://bucket/x", "scheme 'gs' is not supported"),
        ("", "no checkpoint URI"),
    ],
)
def test_bad_uris_name_what_is_valid(uri: str, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        open_store(uri)


def test_parse_s3_uri() -> None:
    assert parse_s3_uri("s3://my-bucket/a/b/") == ("my-bucket", "a/b")
    assert parse_s3_uri("s3://my-bucket") == ("my-bucket", "")


# ------------------------------------------------------------------------- S3 faults
def test_missing_bucket_and_unreachable_endpoint(s3_env: dict[str, str]) -> None:
    with pytest.raises(CheckpointError, match="bucket srifty-no-such-bucket does not exist"):
        open_store("s3://srifty-no-such-bucket/x").check()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    store = S3Store("s3://srifty-any/x", endpoint_url=f"http://127.0.0.1:{closed}")
    with pytest.raises(CheckpointError, match="S3 check failed for s3://srifty-any/x") as info:
        store.check()
    assert "\n" not in str(info.value)


def test_missing_credentials_are_named(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    store = S3Store("s3://srifty-any/x", endpoint_url=moto_endpoint)
    with pytest.raises(CredentialsError, match="no usable AWS credentials"):
        store.check()


def test_throttling_and_dropped_connections_are_retried(s3_uri: str, tmp_path: Path) -> None:
    endpoint = os.environ["SRIFTY_S3_ENDPOINT_URL"]
    with FaultyS3Proxy(endpoint) as proxy:
        store = S3Store(s3_uri, endpoint_url=proxy.url)
        proxy.throttle_next = 2
        proxy.reset_next = 1
        ref = store.save(_payload(tmp_path, "a"), step=3, reason="p")
        assert proxy.faults == 3
        proxy.throttle_next = 1
        found = store.fetch_latest(tmp_path / "restore")
    assert found is not None and found[1] == ref
    assert proxy.faults == 4


def test_failed_upload_never_replaces_a_good_checkpoint(s3_uri: str, tmp_path: Path) -> None:
    endpoint = os.environ["SRIFTY_S3_ENDPOINT_URL"]
    good = open_store(s3_uri).save(_payload(tmp_path, "good", seed=1), step=7, reason="p")
    with FaultyS3Proxy(endpoint) as proxy:
        flaky = S3Store(s3_uri, endpoint_url=proxy.url, max_attempts=2)
        proxy.fail_puts_matching = "/data/"
        with pytest.raises(CheckpointError, match="S3 upload"):
            flaky.save(_payload(tmp_path, "new", seed=2), step=8, reason="p")
        proxy.fail_puts_matching = "/manifests/"
        with pytest.raises(CheckpointError):
            flaky.save(_payload(tmp_path, "new2", seed=3), step=9, reason="p")
    found = open_store(s3_uri).fetch_latest(tmp_path / "restore")
    assert found is not None and found[1] == good
    assert found[0].read_bytes() == (tmp_path / "good").read_bytes()


# ------------------------------------------------------- outages while resuming (issue 11)
def _three_checkpoints(uri: str, tmp_path: Path) -> list[str]:
    """Steps 100, 200, 300 written straight to moto; returns their ids, oldest first."""
    store = open_store(uri, keep=3)
    return [
        store.save(_payload(tmp_path, f"s{step}", seed=step % 251), step=step, reason="p").id
        for step in (100, 200, 300)
    ]


def test_an_outage_during_resume_is_waited_out_and_gives_the_newest(
    s3_uri: str, tmp_path: Path
) -> None:
    ids = _three_checkpoints(s3_uri, tmp_path)
    endpoint = os.environ["SRIFTY_S3_ENDPOINT_URL"]
    with FaultyS3Proxy(endpoint) as proxy:
        store = S3Store(s3_uri, keep=3, endpoint_url=proxy.url, max_attempts=2)
        proxy.outage_until = time.monotonic() + 4.0  # every connection reset for 4 s
        found = store.fetch_latest(tmp_path / "restore")
        assert proxy.faults >= 2  # the outage really hit the reads
    assert found is not None
    assert found[1].id == ids[-1] and found[1].step == 300
    assert open_store(s3_uri).checkpoint_ids() == ids[::-1]  # nothing deleted


def test_a_long_outage_is_a_clear_error_and_nothing_is_pruned_afterwards(
    s3_uri: str, tmp_path: Path
) -> None:
    ids = _three_checkpoints(s3_uri, tmp_path)
    endpoint = os.environ["SRIFTY_S3_ENDPOINT_URL"]
    waits: list[float] = []
    with FaultyS3Proxy(endpoint) as proxy:
        store = S3Store(s3_uri, keep=3, endpoint_url=proxy.url, max_attempts=2)
        store.patience_s = 6.0
        store.sleep = waits.append  # the backoff is recorded, not slept ...
        store.clock = lambda: sum(waits)  # ... and is all the time that passes
        proxy.fail_gets_matching = f"/data/{ids[-1]}"  # the newest data keeps failing (500)
        with pytest.raises(StoreUnavailableError) as error:
            store.fetch_latest(tmp_path / "restore")
        message = str(error.value)
        assert "stayed unreachable" in message and "nothing was deleted" in message
        assert "\n" not in message
        assert waits and waits == sorted(waits)  # backed off, growing
        assert sum(waits) == pytest.approx(store.patience_s, abs=0.5)  # for all its patience
        # Even a job that went on regardless deletes nothing with this store object.
        proxy.fail_gets_matching = None
        store.save(_payload(tmp_path, "after", seed=1), step=5, reason="p")
    left = open_store(s3_uri).checkpoint_ids()
    assert set(ids) <= set(left)
    found = open_store(s3_uri).fetch_latest(tmp_path / "again")
    assert found is not None and found[1].step == 300  # the most progress, all kept
    assert {int(i[-9:]) for i in left} == {5, 100, 200, 300}


def test_a_restart_from_scratch_never_prunes_checkpoints_further_ahead(
    store_uri: str, tmp_path: Path
) -> None:
    ids = _three_checkpoints(store_uri, tmp_path)
    fresh = open_store(store_uri, keep=3)  # a job that (wrongly) started at step 0
    for step in (5, 10, 15):
        fresh.save(_payload(tmp_path, f"n{step}", seed=step), step=step, reason="p")
    left = fresh.checkpoint_ids()
    assert set(ids) <= set(left), "pruning deleted checkpoints with more progress"
    assert fresh.verified_id in left  # its own newest is never pruned either
    assert [int(i[-9:]) for i in left] == [300, 200, 100, 15]


def test_missing_newest_data_still_falls_back(store_uri: str, tmp_path: Path) -> None:
    ids = _three_checkpoints(store_uri, tmp_path)
    store = open_store(store_uri, keep=3)
    store._delete(f"data/{ids[-1]}.ckpt")  # noqa: SLF001 - an upload that lost its data
    found = store.fetch_latest(tmp_path / "restore")
    assert found is not None and found[1].id == ids[1]
    assert store.verified_id == ids[1]
    assert not store.unavailable_seen


def test_s3_check_on_a_hung_endpoint_fails_within_15_s(s3_env: dict[str, str]) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # the kernel accepts connections; nobody ever answers
        port = listener.getsockname()[1]
        store = S3Store("s3://srifty-hung/x", endpoint_url=f"http://127.0.0.1:{port}")
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as error:
            store.check()
        took = time.monotonic() - started
    # Bounded by the check's hard deadline (botocore's own retries alone would take
    # minutes), plus the moment it takes to raise; no tighter: on a slow machine the
    # two 5 s tries run into the deadline, which is what it is there for.
    assert took < S3_CHECK_DEADLINE_S + 2.0, f"the check took {took:.1f} s"
    message = str(error.value)
    assert "S3 check failed for s3://srifty-hung/x" in message
    assert f"127.0.0.1:{port} did not answer" in message and "\n" not in message


def test_off_ec2_boto3_never_asks_the_metadata_service_for_credentials(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import boto3
    from botocore.exceptions import NoCredentialsError

    from tests.fakes import FakeImds, serve_fake_imds

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("AWS_EC2_METADATA_DISABLED", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with serve_fake_imds() as imds:
        # botocore's instance-role lookup goes where this says (instead of 169.254.169.254)
        monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds)
        store = S3Store("s3://srifty-any/x", endpoint_url=moto_endpoint)
        with pytest.raises(CredentialsError, match="no usable AWS credentials"):
            store.check()
        assert FakeImds.requests == []  # this machine is no EC2 instance: nothing sent
        # Control: a plain boto3 client does ask, so the test above could fail.
        plain = boto3.session.Session().client("s3", endpoint_url=moto_endpoint)
        with pytest.raises(NoCredentialsError):
            plain.head_bucket(Bucket="srifty-any")
        assert "PUT /latest/api/token" in FakeImds.requests
