"""Stop requests (SIGINT, SIGTERM) under nested stop scopes: the release flow's block around its
two datasets' runs, each run's own block; an orchestrator's handler in between is restored."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from phsafe import interrupt


@pytest.fixture(autouse=True)
def _main_thread():
    # Python runs signal handlers in the main thread only: a SIGTERM sent where no handler of
    # ours is installed would end the test process.
    assert threading.current_thread() is threading.main_thread()


def _wait_for(predicate, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_before_spending_a_request_interrupts_at_once():
    with interrupt.stop_at_safe_points():
        with pytest.raises(interrupt.RunInterrupted) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted at once, long before this ends
    assert str(stopped.value) == ("stopped by a signal (SIGTERM) before any budget was spent: nothing to resume, "
                                  "run again when ready")
    assert not stopped.value.could_spend


def test_once_spending_a_request_waits_for_the_next_safe_point_and_is_said_once():
    said: list[str] = []
    with interrupt.stop_at_safe_points(on_request=said.append):
        interrupt.spending()
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal changes nothing: the first is the request
        _wait_for(lambda: said)
        assert interrupt.requested() == "SIGINT"
        with pytest.raises(interrupt.RunInterrupted) as stopped:
            interrupt.check()
        assert str(stopped.value) == "stopped by a signal (SIGINT) at a safe point (no spend after it)"
        assert stopped.value.could_spend
    assert said == ["SIGINT"]
    assert interrupt.requested() is None  # the outermost block ended: nothing left requested
    interrupt.check()  # outside any block: a no-op


def test_nested_blocks_keep_the_request_and_restore_an_orchestrators_handler_in_between():
    def orchestrators(signum, frame):  # noqa: ANN001 -- e.g. Prefect's around a subflow
        raise AssertionError("the orchestrator's handler ran inside a run's block")

    with interrupt.stop_at_safe_points(at_once=False):  # the release flow: only records
        previous = signal.signal(signal.SIGTERM, orchestrators)
        try:
            with interrupt.stop_at_safe_points():  # the US run: its own block reinstalls ours
                interrupt.spending()
                os.kill(os.getpid(), signal.SIGTERM)
                _wait_for(lambda: interrupt.requested() is not None)
                with pytest.raises(interrupt.RunInterrupted):
                    interrupt.check()
            assert signal.getsignal(signal.SIGTERM) is orchestrators  # restored as found
        finally:
            signal.signal(signal.SIGTERM, previous)
        assert interrupt.requested() == "SIGTERM"  # the release sees it: Puerto Rico is not started
        with interrupt.stop_at_safe_points():  # had it started, it would stop before any spend
            with pytest.raises(interrupt.RunInterrupted, match="before any budget was spent"):
                interrupt.check()
    assert interrupt.requested() is None


def test_a_check_from_another_thread_sees_the_request():
    with interrupt.stop_at_safe_points():
        interrupt.spending()
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for(lambda: interrupt.requested() is not None)
        raised: list[BaseException] = []

        def measure() -> None:
            try:
                interrupt.check()
            except interrupt.RunInterrupted as exc:
                raised.append(exc)

        worker = threading.Thread(target=measure)
        worker.start()
        worker.join()
        assert len(raised) == 1 and raised[0].could_spend
