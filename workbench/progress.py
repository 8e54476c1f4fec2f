"""A launch's progress as plain text: start-up as its own phase, then steps, then one line that stays.

    dp2: starting 2 ranks (torchrun, imports, process groups)…
    dp2: step 7/20 · 4.1 s
    dp2: 20 steps in 9.8 s (start-up 3.2 s, then 0.33 s/step)

In Jupyter the line is one display updated in place (text/plain, no widget: a saved notebook reopens with
the last line, never "Error displaying widget"); in a terminal it is rewritten with a carriage return on
stderr (only the last line when stderr is not a terminal). Start-up — torchrun, the ranks' imports, the
process groups — is shown apart because on a small run it is most of the time: a bar at 0/N would say
nothing.
"""

from __future__ import annotations

import sys
import time


def _in_jupyter() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class Progress:
    """Call `update(steps_done)` as metrics.jsonl grows, and `close(ok)` once at the end."""

    def __init__(self, name: str, steps: int, ranks: int, enabled: bool = True) -> None:
        self.name, self.steps, self.enabled = name, steps, enabled
        self.t0 = time.monotonic()
        self.first_step_at: float | None = None
        self.done = -1
        self.last_shown = 0.0
        self.handle = None
        self.jupyter = enabled and _in_jupyter()
        self._show(f"{name}: starting {ranks} rank{'s' if ranks > 1 else ''} (torchrun, imports, process groups)…",
                   force=True)

    def update(self, done: int) -> None:
        if done == self.done:
            return
        if done > 0 and self.first_step_at is None:
            self.first_step_at = time.monotonic()
        self.done = done
        if done > 0:
            self._show(f"{self.name}: step {done}/{self.steps} · {time.monotonic() - self.t0:.1f} s")

    def close(self, ok: bool = True) -> None:
        elapsed = time.monotonic() - self.t0
        if not ok:
            line = f"{self.name}: stopped after {max(self.done, 0)}/{self.steps} steps ({elapsed:.1f} s)"
        elif self.first_step_at is None or self.done < 1:
            line = f"{self.name}: {self.steps} steps in {elapsed:.1f} s"
        else:
            startup = self.first_step_at - self.t0
            per = (elapsed - startup) / max(self.done - 1, 1)
            line = (f"{self.name}: {self.steps} steps in {elapsed:.1f} s "
                    f"(start-up {startup:.1f} s, then {per:.2f} s/step)")
        self._show(line, force=True, final=True)

    def _show(self, line: str, force: bool = False, final: bool = False) -> None:
        if not self.enabled or (not force and time.monotonic() - self.last_shown < 0.25):
            return
        self.last_shown = time.monotonic()
        if self.jupyter:
            from IPython.display import Pretty, display

            if self.handle is None:
                self.handle = display(Pretty(line), display_id=True)
            else:
                self.handle.update(Pretty(line))
        elif sys.stderr.isatty():
            sys.stderr.write("\r\033[K" + line + ("\n" if final else ""))
            sys.stderr.flush()
        elif final:
            print(line, file=sys.stderr)
