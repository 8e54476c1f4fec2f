"""What the exercises' in-process checks share (ring.py, zero1_simulated.py, tp_simulation.py): the learner's
function run once per simulated rank, a thread each, until ONE deadline for them all; how long a rank waits for
another before the check calls it a deadlock; a cap on how often a rank communicates (a loop that never ends
is stopped there, not after minutes); and the learner's error in their own words — the lines of their function
in its traceback, and what a NameError means for a function that runs with only torch and math.

A simulated rank that neither communicates nor returns (`while True: pass`) cannot be stopped: Python has no
way to end a thread. Its thread is a daemon; the check ends at the deadline and says so."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from workbench.exercises.submission import GLOBALS_HINT

#: how long a simulated rank waits for another (a message, a collective) before the check calls it a deadlock
WAIT_S = 2.0
#: how long all the simulated ranks together may take: a correct answer takes well under a second here, a
#: deadlock ends each waiting rank after WAIT_S (they wait side by side, not one after another)
DEADLINE_S = 12.0
#: a rank may communicate this many times what the exercise takes before the check stops it
CAP_FACTOR = 4


class Deadlock(Exception):
    """A simulated rank waited WAIT_S at its communication number `k` (`what`: "exchange", "collective
    (all_gather)", …) for ranks that never came; `detail`: what the exercise's diagnosis wants to keep."""

    def __init__(self, *, rank: int, k: int, what: str, detail: Any = None) -> None:
        super().__init__(f"rank {rank} waits at its {what} {k}")
        self.rank, self.k, self.detail = rank, k, detail


class TooMany(Exception):
    """A simulated rank communicated more than CAP_FACTOR times what the exercise takes: stopped there."""

    def __init__(self, *, rank: int, expected: str, what: str, cap: int) -> None:
        super().__init__(
            f"rank {rank} made more than {expected} {what} (it was stopped at {cap}): a loop that does "
            "not end?"
        )
        self.rank = rank


class Hung(Exception):
    """A simulated rank that had not returned by the deadline: it computes without end."""

    def __init__(self, *, rank: int, deadline_s: float) -> None:
        super().__init__(
            f"rank {rank} did not return within {deadline_s:g} s: a loop that does not end? (it still runs "
            "in this kernel; restart the kernel)"
        )
        self.rank = rank


def cap(expected: int) -> int:
    """How many communications a rank may make when the exercise takes `expected`."""
    return CAP_FACTOR * expected


def run_ranks(
    main: Callable[[int], None], n: int, *, on_error: Callable[[int], None] | None = None
) -> dict[int, BaseException]:
    """Run main(r) for r in 0…n−1, each on a daemon thread, all joined by one deadline (DEADLINE_S from now);
    each rank's error (an exception it raised, or Hung where it was still running at the deadline).
    `on_error(r)` runs on rank r's thread after it raised (a barrier aborted, so the others stop waiting)."""
    errors: dict[int, BaseException] = {}

    def rank_main(r: int) -> None:
        try:
            main(r)
        except BaseException as e:  # the learner's error, kept for the message
            errors[r] = e
            if on_error is not None:
                on_error(r)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(n)]
    deadline_s = DEADLINE_S
    end = time.monotonic() + deadline_s
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.0, end - time.monotonic()))
    for r, t in enumerate(threads):
        if t.is_alive():
            errors[r] = Hung(rank=r, deadline_s=deadline_s)
    return errors


def stopped(errors: dict[int, BaseException]) -> str | None:
    """A rank that never returned or was stopped for communicating without end, said first: the others'
    deadlocks follow from it."""
    for kind in (Hung, TooMany):
        found = {r: e for r, e in errors.items() if isinstance(e, kind)}
        if found:
            return str(found[min(found)])
    return None


def your_lines(e: BaseException, fn: Any) -> str:
    """The lines of the learner's function in an exception's traceback ("line N of your function: …"; its
    source must be in linecache, as submission.load puts it), or ""."""
    code = getattr(fn, "__code__", None)
    frames = [
        f"line {f.lineno - code.co_firstlineno + 1} of your function: {f.line}"
        for f in traceback.extract_tb(e.__traceback__)
        if code is not None and f.filename == code.co_filename and f.lineno is not None
    ]
    return "; ".join(frames)


def raised(e: BaseException, fn: Any) -> str:
    """An exception from the learner's function: its type, its message, where in the function, and for a
    NameError, what names the function has."""
    said = f"{type(e).__name__}: {e} ({your_lines(e, fn) or 'in the workbench'})"
    return f"{said}. {GLOBALS_HINT}" if isinstance(e, NameError) else said
