"""A replica's unconfirmed prefill: a virtual FIFO draining at the replica's speed."""

from __future__ import annotations

from engine.prefill import PrefillQueue, WorkSamples

SPEED = 1e-3  # seconds per token: 1,000 tokens a second


def test_work_ahead_is_what_was_sent_and_not_yet_drained() -> None:
    queue = PrefillQueue()
    assert queue.add(1000, 0.0, SPEED) == 0
    assert queue.add(1000, 0.0, SPEED) == 1000      # a burst: the second waits for the first
    assert queue.tokens(0.0, SPEED) == 2000 and queue.requests == 2
    assert queue.tokens(0.5, SPEED) == 1500         # half a second at 1,000 tokens/s
    assert queue.tokens(5.0, SPEED) == 0            # the estimate never goes below zero


def test_a_confirmation_takes_its_request_out_and_keeps_the_others() -> None:
    queue = PrefillQueue()
    queue.add(1000, 0.0, SPEED)
    queue.add(1000, 0.0, SPEED)
    queue.settle(1000, 0.2, SPEED)                  # the first confirmed sooner than estimated
    assert queue.tokens(0.2, SPEED) == 1000         # the second is all still to do
    assert queue.requests == 1
    queue.settle(1000, 0.3, SPEED)
    assert queue.tokens(0.3, SPEED) == 0 and queue.requests == 0


def test_a_late_confirmation_does_not_take_out_more_than_it_brought() -> None:
    queue = PrefillQueue()
    for _ in range(3):
        queue.add(1000, 0.0, SPEED)
    queue.settle(1000, 1.5, SPEED)                  # estimate: 1,500 drained, 500 of the second
    assert queue.tokens(1.5, SPEED) == 1500
    queue.add(200, 1.5, SPEED)
    assert queue.tokens(1.5, SPEED) == 1700


def test_an_idle_queue_does_not_bank_drain_for_later() -> None:
    queue = PrefillQueue()
    queue.add(100, 0.0, SPEED)
    queue.settle(100, 0.05, SPEED)
    assert queue.add(1000, 10.0, SPEED) == 0
    assert queue.tokens(10.0, SPEED) == 1000


def test_samples_fit_a_line_and_forget_the_oldest() -> None:
    samples = WorkSamples(window=4)
    for work in (0.0, 1000.0, 2000.0, 3000.0):
        samples.add(work, 0.1 + 0.001 * work)
    line = samples.line()
    assert line is not None and abs(line.intercept - 0.1) < 1e-9
    assert line.slope is not None and abs(line.slope - 0.001) < 1e-12
    for work in (0.0, 1000.0, 2000.0, 3000.0):
        samples.add(work, 0.002 * work)             # the window now holds only these
    line = samples.line()
    assert line is not None and line.slope is not None and abs(line.slope - 0.002) < 1e-9
    alike = WorkSamples(window=4)
    for _ in range(4):
        alike.add(500.0, 0.3)
    flat = alike.line()
    assert flat is not None and flat.slope is None and abs(flat.expected(9000.0) - 0.3) < 1e-9
