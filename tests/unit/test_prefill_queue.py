"""A replica's unconfirmed prefill: a FIFO drained at an assumed speed, caught up by first tokens."""

from __future__ import annotations

from engine.pool.prefill import PrefillQueue, WorkSamples

SPEED = 1e-3  # seconds per token: 1,000 tokens a second


def test_work_ahead_is_what_was_sent_and_not_yet_drained() -> None:
    queue = PrefillQueue()
    assert queue.add(1000, 0.0, SPEED)[1] == 0
    assert queue.add(1000, 0.0, SPEED)[1] == 1000   # a burst: the second waits for the first
    assert queue.tokens(0.0, SPEED) == 2000 and queue.requests == 2
    assert queue.tokens(0.5, SPEED) == 1500         # half a second at 1,000 tokens/s
    assert queue.tokens(5.0, SPEED) == 0            # the estimate never goes below zero


def test_progress_counts_the_requests_the_drain_covered_whole() -> None:
    queue = PrefillQueue()
    for tokens in (1000, 500, 0, 1000):
        queue.add(tokens, 0.0, SPEED)
    assert queue.progress(0.0, SPEED) == (2500, 0)
    assert queue.progress(0.9, SPEED) == (1600, 0)      # inside the first
    assert queue.progress(1.0, SPEED) == (1500, 1)
    assert queue.progress(1.6, SPEED) == (900, 3)       # the second, and the empty one after
    assert queue.progress(9.0, SPEED) == (0, 4)
    assert queue.requests == 4                          # none of them is settled by this


def test_a_first_token_says_everything_sent_before_it_is_prefilled() -> None:
    queue = PrefillQueue()
    tickets = [queue.add(1000, 0.0, SPEED)[0] for _ in range(4)]
    queue.settle(tickets[2], 0.1, SPEED, confirmed=True)   # the replica is faster than assumed
    assert queue.tokens(0.1, SPEED) == 1000                # only the fourth is left
    assert queue.requests == 3                             # the first two not settled yet
    queue.settle(tickets[0], 0.1, SPEED, confirmed=True)   # their own news changes nothing
    queue.settle(tickets[1], 0.1, SPEED, confirmed=True)
    assert queue.tokens(0.1, SPEED) == 1000 and queue.requests == 1
    queue.settle(tickets[3], 0.2, SPEED, confirmed=True)
    assert queue.tokens(0.2, SPEED) == 0 and queue.requests == 0


def test_a_request_that_leaves_unconfirmed_takes_only_its_own_place() -> None:
    queue = PrefillQueue()
    first, _ = queue.add(1000, 0.0, SPEED)
    second, _ = queue.add(1000, 0.0, SPEED)
    queue.add(1000, 0.0, SPEED)
    queue.settle(second, 0.5, SPEED, confirmed=False)      # the drain was within the first
    assert queue.tokens(0.5, SPEED) == 1500
    queue.settle(first, 1.5, SPEED, confirmed=False)       # the drain had passed it: 500 on
    assert queue.tokens(1.5, SPEED) == 500
    queue.settle(first, 1.5, SPEED, confirmed=True)        # settled twice: no-op
    assert queue.requests == 1


def test_an_idle_queue_does_not_bank_drain_for_later() -> None:
    queue = PrefillQueue()
    ticket, _ = queue.add(100, 0.0, SPEED)
    queue.settle(ticket, 0.05, SPEED, confirmed=True)
    assert queue.add(1000, 10.0, SPEED)[1] == 0
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
