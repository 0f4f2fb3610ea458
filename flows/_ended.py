"""The last event of a phsafe flow run: ``phsafe.flow-run.ended``, sent after its final state.

The automation that marks a run Crashed when its process stops sending heartbeats
(``deployments/automations.yaml``) waits, after each heartbeat, for the next heartbeat or a final
state. Heartbeats travel from the flow run's process through Prefect's event queue, while the
final state's event is made by the server itself: a heartbeat sent just before the run ended
can reach the server *after* the Failed or Completed event, open a new wait that nothing closes,
and fire on a run already final (a run refused in its first second always does). This event
leaves the flow run's process through the same queue as its heartbeats, after its final state
-- so after any heartbeat -- and the automation expects it too: a finished run is never taken
for a dead one.
"""

from __future__ import annotations

from typing import Any

ENDED = "phsafe.flow-run.ended"


def announce_end(flow: Any, flow_run: Any, state: Any) -> None:
    """A Prefect state hook: emit :data:`ENDED` for ``flow_run`` (never raises)."""
    try:
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
