"""Preemption notices in the job: SIGTERM and the EC2 spot notice (IMDSv2)."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from lightning_srifty.capture.preemption import (
    PreemptionWatcher,
    fetch_spot_notice,
    finish_preempted,
)
from lightning_srifty.core import launch_protocol as proto
from tests.fakes import FakeImds, serve_fake_imds


def _wait_for(condition: object, timeout_s: float = 5.0) -> bool:
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


def test_spot_notice_from_imds_raises_the_flag() -> None:
    with serve_fake_imds() as endpoint:
        watcher = PreemptionWatcher({}, endpoint=endpoint, poll_s=0.05)
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


def test_no_metadata_service_means_no_polling_and_no_flag() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    notice, token = fetch_spot_notice(f"http://127.0.0.1:{closed}", timeout_s=0.2)
    assert notice is None and token is None
    watcher = PreemptionWatcher({}, endpoint=f"http://127.0.0.1:{closed}", poll_s=0.01)
    watcher.start()
    try:
        assert watcher._thread is not None  # noqa: SLF001
        watcher._thread.join(timeout=5)  # noqa: SLF001 - gives up after the first miss
        assert not watcher._thread.is_alive()  # noqa: SLF001
        assert not watcher.should_checkpoint()
    finally:
        watcher.close()


def test_imds_off_sends_nothing() -> None:
    with serve_fake_imds() as endpoint:
        watcher = PreemptionWatcher({"SRIFTY_IMDS": "off"}, endpoint=endpoint, poll_s=0.01)
        watcher.start()
        time.sleep(0.1)
        watcher.close()
        assert FakeImds.requests == []


def test_finish_preempted_leaves_the_marker(tmp_path: Path) -> None:
    assert finish_preempted(tmp_path / "state") == proto.PREEMPTED_EXIT_CODE
    assert (tmp_path / "state" / proto.PREEMPTED_MARKER).exists()
    assert finish_preempted(None) == proto.PREEMPTED_EXIT_CODE
