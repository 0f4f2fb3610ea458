"""The last event of a phsafe flow run: ``phsafe.flow-run.ended``, sent after its final state.

The automation that marks a run Crashed when its process stops sending heartbeats
(``deployments/automations.yaml``) waits, after each heartbeat, for the next heartbeat or a final
state. Heartbeats travel from the flow run's process through Prefect's event queue, while the
final state's event is made by the server itself: a heartbeat sent just before the run ended
can reach the server *after* the Failed or Completed event, open a new wait that nothing closes,
and fire on a run already final (a run refused in its first second always does). This event
leaves the flow run's process through the same queue as its heartbeats, after its final state
and after the run's heartbeat thread has finished -- so after any heartbeat -- and the
automation expects it too: a finished run is never taken for a dead one.
"""

from __future__ import annotations

import threading
from typing import Any

ENDED = "phsafe.flow-run.ended"

HEARTBEAT_LOOP = "_send_heartbeats.<locals>.heartbeat_loop"
"""Prefect's heartbeat thread runs this function (``prefect.flow_engine``, 3.8; pinned)."""
HEARTBEAT_WAIT_SECONDS = 30.0
"""At most this long for a run's stopped heartbeat thread to finish before :data:`ENDED` is sent."""


def stopped_heartbeat_threads(flow_run_id: Any) -> list[threading.Thread]:
    """The live heartbeat threads of ``flow_run_id`` that were told to stop.

    Prefect stops a run's heartbeat thread before its final state but waits at most two seconds
    for it: a heartbeat being sent then (its first, say, which opens the events client) is queued
    after the final state -- and after :data:`ENDED`, unless that waits for the thread. Found by
    what the thread runs (an unknown Prefect finds none: then nothing is waited for)."""
    found = []
    for thread in threading.enumerate():
        args = getattr(thread, "_args", None) or ()
        loop = args[0] if args else None
        if getattr(loop, "__qualname__", None) != HEARTBEAT_LOOP or not getattr(loop, "__closure__", None):
            continue
        try:
            cells = dict(zip(loop.__code__.co_freevars, (c.cell_contents for c in loop.__closure__)))
        except ValueError:  # an empty cell
            continue
        engine, stop = cells.get("engine"), cells.get("stop_event")
        run = getattr(engine, "flow_run", None)
        if run is not None and run.id == flow_run_id and isinstance(stop, threading.Event) and stop.is_set():
            found.append(thread)
    return found


def announce_end(flow: Any, flow_run: Any, state: Any) -> None:
    """A Prefect state hook: emit :data:`ENDED` for ``flow_run`` (never raises), after the run's
    last heartbeat (:func:`stopped_heartbeat_threads`)."""
    try:
        for thread in stopped_heartbeat_threads(flow_run.id):
            thread.join(HEARTBEAT_WAIT_SECONDS)
        from prefect.events import emit_event

        emit_event(
            event=ENDED,
            resource={"prefect.resource.id": f"prefect.flow-run.{flow_run.id}",
                      "prefect.resource.name": flow_run.name or ""},
            related=[{"prefect.resource.id": f"prefect.flow.{flow_run.flow_id}", "prefect.resource.role": "flow",
                      "prefect.resource.name": getattr(flow, "name", "") or ""}],
            payload={"state": state.type.value if state is not None else None},
        )
    except Exception:  # noqa: BLE001 -- an event that cannot be sent must not change the run's end
        pass


END_HOOKS: dict[str, list[Any]] = {"on_completion": [announce_end], "on_failure": [announce_end],
                                   "on_crashed": [announce_end], "on_cancellation": [announce_end]}
"""The keyword arguments of ``prefect.flow`` that send :data:`ENDED` whatever the run's end."""
