"""The end event of a flow run leaves after its last heartbeat, even when Prefect stops waiting
for the heartbeat thread (it waits two seconds): run against Prefect's own heartbeat thread."""

from __future__ import annotations

import threading
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from prefect.flow_engine import _send_heartbeats

from flows._ended import ENDED, announce_end, stopped_heartbeat_threads


class _Engine:
    """What Prefect's heartbeat thread reads of a flow run engine; its heartbeat is sent only
    once ``gate`` opens (a slow first heartbeat: the events client being opened)."""

    heartbeat_seconds = 5

    def __init__(self, sent: list[str], gate: threading.Event) -> None:
        self.flow_run = SimpleNamespace(id=uuid.uuid4(), flow_id=uuid.uuid4(), name="run",
                                        state=SimpleNamespace(is_final=lambda: False))
        self.logger = SimpleNamespace(debug=lambda *a, **k: None)
        self._sent, self._gate = sent, gate

    def _build_heartbeat_event_template(self) -> tuple[dict[str, str], list[Any]]:
        return {"prefect.resource.id": f"prefect.flow-run.{self.flow_run.id}"}, []

    def _emit_flow_run_heartbeat(self, resource: Any, related: Any) -> None:
        self._gate.wait(60)
        self._sent.append(f"heartbeat {self.flow_run.id}")


def test_the_end_event_follows_a_heartbeat_prefect_stopped_waiting_for(monkeypatch: pytest.MonkeyPatch) -> None:
    import prefect.events

    sent: list[str] = []
    monkeypatch.setattr(prefect.events, "emit_event",
                        lambda event, resource, **_: sent.append(f"{event} {resource['prefect.resource.id']}"))
    gate, parent_gate = threading.Event(), threading.Event()
    parent_gate.set()
    parent = _Engine(sent, parent_gate)
    parent.heartbeat_seconds = 3600  # a parent run still running: its thread is not waited for
    run = _Engine(sent, gate)
    with _send_heartbeats(parent):
        with _send_heartbeats(run):
            pass  # the run ends at once; its first heartbeat is still being sent
        # Prefect gave up waiting for the thread after two seconds: it is live, and stopped.
        (thread,) = stopped_heartbeat_threads(run.flow_run.id)
        assert thread.is_alive() and stopped_heartbeat_threads(parent.flow_run.id) == []
        threading.Timer(0.5, gate.set).start()
        announce_end(SimpleNamespace(name="sdhc-us"), run.flow_run, SimpleNamespace(type=SimpleNamespace(value="FAILED")))
        ours = [line for line in sent if str(run.flow_run.id) in line]
        assert ours == [f"heartbeat {run.flow_run.id}", f"{ENDED} prefect.flow-run.{run.flow_run.id}"], sent
