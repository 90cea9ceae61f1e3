"""``<run-dir>/clusters.json``: every cluster and managed job a run started, and its fate.

A cluster is written down *before* it is asked for and marked down only once SkyPilot
confirmed the teardown, so whatever happens to the launcher (Ctrl-C, a crash, an API
server that stayed away) the file lists what may still be billing, and
``srifty down RUN_DIR`` can finish the job. Versioned JSON, replaced atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lightning_srifty.core.errors import SchemaError
from lightning_srifty.core.validate import Reader, check_version

LEDGER_SCHEMA_VERSION = 1
LEDGER_NAME = "clusters.json"
KINDS = ("cluster", "managed-job")
STATES = ("launching", "up", "down")


@dataclass(frozen=True)
class LedgerEntry:
    """One cluster (or managed job) of the run."""

    name: str
    kind: str = "cluster"
    state: str = "launching"
    job_id: int | None = None
    """The managed job's id (``kind == "managed-job"``)."""
    updated: float = 0.0
    request_id: str | None = None
    """The SkyPilot API request launching it, while that may still run: a teardown
    cancels it first, so provisioning cannot bring the cluster back afterwards."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "state": self.state,
            "job_id": self.job_id,
            "updated": self.updated,
            "request_id": self.request_id,
        }


class ClusterLedger:
    """Reads and updates one run's ``clusters.json``."""

    def __init__(self, run_dir: str | os.PathLike[str], run_id: str = ""):
        self.path = Path(run_dir) / LEDGER_NAME
        self.run_id = run_id

    def entries(self) -> list[LedgerEntry]:
        """What the file says (an absent file: nothing was launched)."""
        if not self.path.exists():
            return []
        source = str(self.path)
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SchemaError(f"cannot read the cluster ledger ({exc})", source=source) from None
        r = Reader(data, source=source)
        check_version(r, LEDGER_SCHEMA_VERSION, kind="cluster ledger")
        out = []
        for e in r.children("entries", []):
            job_id = e.raw("job_id", None)
            if job_id is not None and not isinstance(job_id, int):
                raise e.fail("job_id", f"expected an integer, got {job_id!r}")
            request_id = e.raw("request_id", None)
            if request_id is not None and not isinstance(request_id, str):
                raise e.fail("request_id", f"expected a string, got {request_id!r}")
            out.append(
                LedgerEntry(
                    name=e.str("name"),
                    kind=e.choice("kind", KINDS),
                    state=e.choice("state", STATES),
                    job_id=job_id,
                    updated=e.float("updated", 0.0),
                    request_id=request_id,
                )
            )
        if not self.run_id:
            self.run_id = str(r.raw("run_id", "") or "")
        return out

    def not_down(self) -> list[LedgerEntry]:
        """Entries that may still be up (launching or up)."""
        return [e for e in self.entries() if e.state != "down"]

    def entry(self, name: str, kind: str = "cluster") -> LedgerEntry | None:
        """``name``'s entry, if the run recorded it."""
        return next((e for e in self.entries() if e.name == name and e.kind == kind), None)

    def mark(
        self,
        name: str,
        state: str,
        *,
        kind: str = "cluster",
        job_id: int | None = None,
        request_id: str | None = None,
    ) -> None:
        """Records ``name``'s new state (adding it when new); written atomically.

        ``request_id`` names the launch request in flight; it is kept only while the
        entry is ``launching``."""
        if state not in STATES:
            raise ValueError(f"unknown ledger state {state!r}")
        entries = self.entries()
        now = time.time()
        found = False
        for i, entry in enumerate(entries):
            if entry.name == name and entry.kind == kind:
                request = request_id if request_id is not None else entry.request_id
                entries[i] = replace(
                    entry, state=state, job_id=job_id if job_id is not None else entry.job_id,
                    updated=now, request_id=request if state == "launching" else None,
                )  # fmt: skip
                found = True
        if not found:
            request = request_id if state == "launching" else None
            entries.append(LedgerEntry(name, kind, state, job_id, now, request))
        self._write(entries)

    def _write(self, entries: list[LedgerEntry]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "schema_version": LEDGER_SCHEMA_VERSION,
            "run_id": self.run_id,
            "entries": [e.to_dict() for e in entries],
        }
        fd, tmp = tempfile.mkstemp(prefix=".clusters-", suffix=".tmp", dir=self.path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(body, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
