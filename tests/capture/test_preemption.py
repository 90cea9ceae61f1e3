"""Preemption notices in the job: SIGTERM and the EC2 spot notice (IMDSv2)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from lightning_srifty.capture.imds import ImdsClient
from lightning_srifty.capture.preemption import (
    PreemptionWatcher,
    SpotNotice,
    fetch_spot_notice,
    finish_preempted,
)
from lightning_srifty.core import launch_protocol as proto
from lightning_srifty.core.errors import MetadataUnavailableError
from tests.fakes import FakeImds, serve_fake_imds, silent_endpoint


def _wait_for(condition: object, timeout_s: float = 30.0) -> bool:
    """Polls until ``condition`` holds; the timeout only bounds a hang (each wait here
    is for something that happens, so a loaded machine only makes it come later)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_sigterm_raises_the_flag_and_close_restores_the_handler() -> None:
    def previous(signum: int, frame: object) -> None:
        raise AssertionError("the watcher should have taken SIGTERM")

    original = signal.signal(signal.SIGTERM, previous)
    try:
        watcher = PreemptionWatcher({"SRIFTY_IMDS": "off"})
        watcher.start()
        assert not watcher.should_checkpoint()
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait_for(watcher.should_checkpoint)
        assert watcher.reason == "SIGTERM"
        assert watcher.noticed_at is not None
        watcher.close()
        assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, original)


def test_the_sigterm_handler_takes_no_lock() -> None:
    """A handler runs between two bytecodes of the main thread, and a second SIGTERM
    can land inside the first one (a local rank gets one from the launcher and one from
    torchrun's ``killpg``). With a ``threading.Event`` the first handler held the
    event's lock inside ``set()`` when the second asked for it again: the rank hung for
    good and saved nothing (a node log's stack dump showed ``_on_sigterm`` >
    ``Event.set`` > ``__enter__`` twice on one thread). So the handler must take no
    lock: every C call it makes is recorded, and none may be a lock's."""
    import sys

    watcher = PreemptionWatcher({"SRIFTY_IMDS": "off"})
    taken: list[str] = []

    def record(frame: object, event: str, arg: object) -> None:
        owner = getattr(arg, "__self__", None)
        if event == "c_call" and "lock" in type(owner).__name__.lower():
            taken.append(f"{type(owner).__name__}.{getattr(arg, '__name__', '?')}")

    sys.setprofile(record)
    try:
        watcher._on_sigterm(signal.SIGTERM, None)
        watcher._on_sigterm(signal.SIGTERM, None)  # the second notice of the same signal
    finally:
        sys.setprofile(None)
    assert watcher.should_checkpoint() and watcher.reason == "SIGTERM"
    assert taken == []


FORCED = {"SRIFTY_IMDS": "on"}  # the test's local service stands in for EC2's


def test_the_aws_sdk_endpoint_override_points_the_watcher_at_another_service() -> None:
    with serve_fake_imds() as endpoint:
        env = {**FORCED, "AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint + "/"}
        watcher = PreemptionWatcher(env, poll_s=0.05)
        assert watcher.endpoint == endpoint
        FakeImds.spot_notice = {"action": "stop", "time": "2026-11-23T01:02:03Z"}
        watcher.start()
        try:
            assert _wait_for(watcher.should_checkpoint)
            assert "stop at" in watcher.reason
        finally:
            watcher.close()
    assert PreemptionWatcher(FORCED).endpoint == "http://169.254.169.254"


def test_spot_notice_from_imds_raises_the_flag() -> None:
    with serve_fake_imds() as endpoint:
        watcher = PreemptionWatcher(FORCED, endpoint=endpoint, poll_s=0.05)
        watcher.start()
        try:
            time.sleep(0.2)
            assert not watcher.should_checkpoint()  # 404: no notice yet
            FakeImds.spot_notice = {"action": "terminate", "time": "2026-11-23T01:02:03Z"}
            assert _wait_for(watcher.should_checkpoint)
            assert "EC2 spot notice (terminate at 2026-11-23T01:02:03Z)" in watcher.reason
            assert FakeImds.requests[0] == "PUT /latest/api/token"
            assert "GET /latest/meta-data/spot/instance-action" in FakeImds.requests
        finally:
            watcher.close()


def test_off_ec2_the_watcher_sends_nothing(tmp_path: Path) -> None:
    laptop = tmp_path / "dmi"
    laptop.mkdir()
    (laptop / "sys_vendor").write_text("Dell Inc.\n")
    with serve_fake_imds() as endpoint:
        for env in ({}, {"SRIFTY_IMDS": "auto"}, {"SRIFTY_IMDS": "off"}):
            watcher = PreemptionWatcher(
                env,
                endpoint=endpoint,
                poll_s=0.01,
                dmi_dir=laptop,
                hypervisor_uuid=tmp_path / "none",
            )
            watcher.start()
            time.sleep(0.1)
            watcher.close()
            assert watcher._thread is None  # noqa: SLF001 - no poller at all
        assert FakeImds.requests == []


def test_a_hung_token_request_is_retried_not_given_up() -> None:
    with serve_fake_imds() as endpoint:
        FakeImds.hang_next = 2  # the first two requests are accepted and never answered
        client = ImdsClient(endpoint, timeout_s=0.3, attempts=3, backoff_s=0.05)
        watcher = PreemptionWatcher(FORCED, endpoint=endpoint, poll_s=0.05, client=client)
        watcher.start()
        try:
            assert _wait_for(lambda: "GET /latest/meta-data/spot/instance-action"
                             in FakeImds.requests)  # fmt: skip
            FakeImds.spot_notice = {"action": "stop", "time": "2026-11-23T01:02:03Z"}
            assert _wait_for(watcher.should_checkpoint)
        finally:
            watcher.close()
    assert FakeImds.requests[:3] == ["PUT /latest/api/token"] * 3
    assert FakeImds.answered[:3] == [0, 0, 200]  # two hangs, then a token


def test_the_token_is_refreshed_before_its_ttl_runs_out() -> None:
    with serve_fake_imds() as endpoint:
        client = ImdsClient(endpoint, timeout_s=1.0, token_ttl_s=1)
        watcher = PreemptionWatcher(FORCED, endpoint=endpoint, poll_s=0.05, client=client)
        watcher.start()
        try:
            time.sleep(3.0)
            assert not watcher.should_checkpoint()
        finally:
            watcher.close()
    puts = FakeImds.requests.count("PUT /latest/api/token")
    gets = FakeImds.requests.count("GET /latest/meta-data/spot/instance-action")
    assert puts >= 3 and gets > puts  # a new token about every 0.9 s of a 1 s TTL
    assert 401 not in FakeImds.answered  # never used an expired token
    assert watcher.failed_polls == 0


def test_a_silent_metadata_service_keeps_the_watcher_trying() -> None:
    with silent_endpoint() as endpoint:
        client = ImdsClient(endpoint, timeout_s=0.1, attempts=2, backoff_s=0.01)
        watcher = PreemptionWatcher(FORCED, endpoint=endpoint, poll_s=0.02, client=client)
        watcher.start()
        try:
            assert _wait_for(lambda: watcher.failed_polls >= 2)
            assert watcher._thread is not None and watcher._thread.is_alive()  # noqa: SLF001
            assert not watcher.should_checkpoint()
        finally:
            watcher.close()
        assert watcher._thread is not None  # noqa: SLF001
        watcher._thread.join(timeout=10)  # noqa: SLF001 - close() ends the backoff wait
        assert not watcher._thread.is_alive()  # noqa: SLF001


def test_fetch_spot_notice_reads_the_notice() -> None:
    with serve_fake_imds() as endpoint:
        client = ImdsClient(endpoint, timeout_s=1.0)
        assert fetch_spot_notice(client) is None
        FakeImds.spot_notice = {"action": "hibernate", "time": "t"}
        assert fetch_spot_notice(client) == SpotNotice("hibernate", "t")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    with pytest.raises(MetadataUnavailableError, match="after 2 tries"):
        fetch_spot_notice(ImdsClient(f"http://127.0.0.1:{closed}", attempts=2, backoff_s=0.01))


def test_finish_preempted_leaves_the_marker(tmp_path: Path) -> None:
    assert finish_preempted(tmp_path / "state") == proto.PREEMPTED_EXIT_CODE
    assert (tmp_path / "state" / proto.PREEMPTED_MARKER).exists()
    assert finish_preempted(None) == proto.PREEMPTED_EXIT_CODE


def test_a_dropped_token_reply_degrades_to_sigterm_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Docker hop-limit case: token PUTs go unanswered, SIGTERM still works."""
    original = signal.getsignal(signal.SIGTERM)
    with serve_fake_imds() as endpoint:
        FakeImds.drop_token_replies = True
        client = ImdsClient(endpoint, timeout_s=0.1, attempts=1)
        watcher = PreemptionWatcher(FORCED, endpoint=endpoint, poll_s=0.01, client=client)
        with caplog.at_level(logging.DEBUG, logger="lightning_srifty.capture.preemption"):
            watcher.start()
            try:
                assert _wait_for(lambda: watcher.failed_polls >= 3, timeout_s=20)
                assert "no IMDSv2 token" in watcher.degraded
                os.kill(os.getpid(), signal.SIGTERM)
                assert _wait_for(watcher.should_checkpoint)
                assert watcher.reason == "SIGTERM"
            finally:
                watcher.close()
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1
        message = warnings[0].getMessage()
        assert "the job still saves on SIGTERM" in message
        assert "hop limit is 1" in message and "--http-put-response-hop-limit 2" in message
        assert set(FakeImds.requests) == {"PUT /latest/api/token"}  # never got further
    assert signal.getsignal(signal.SIGTERM) == original


def test_the_watcher_says_when_the_notice_is_reachable_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with serve_fake_imds() as endpoint:
        FakeImds.drop_token_replies = True
        client = ImdsClient(endpoint, timeout_s=0.1, attempts=1)
        watcher = PreemptionWatcher(FORCED, endpoint=endpoint, poll_s=0.01, client=client)
        with caplog.at_level(logging.WARNING, logger="lightning_srifty.capture.preemption"):
            watcher.start()
            try:
                assert _wait_for(lambda: watcher.failed_polls >= 1, timeout_s=20)
                FakeImds.drop_token_replies = False  # the hop limit was raised
                FakeImds.spot_notice = {"action": "terminate", "time": "t"}
                assert _wait_for(watcher.should_checkpoint, timeout_s=20)
            finally:
                watcher.close()
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 3, messages
        assert "unavailable" in messages[0] and "reachable again" in messages[1]
        assert "EC2 spot interruption notice" in messages[2]
        assert watcher.degraded == ""
