"""A launch's progress as plain text: start-up as its own phase, then steps, then one line that stays.

    dp2: starting 2 ranks (torchrun, imports, process groups)…
    dp2: step 7/20 · 4.1 s · 1.2k tokens/s
    dp2: 20 steps in 9.8 s (start-up 3.2 s, then 0.33 s/step)
    gpt2: step 9/20 · 12.5 s · 352k tokens/s · MFU 41 %          (a CUDA run: formulas/flops.py)

In Jupyter the line is one display updated in place (text/plain, no widget: a saved notebook reopens with
the last line, never "Error displaying widget"); in a terminal it is rewritten with a carriage return on
stderr (only the last line when stderr is not a terminal). Start-up — torchrun, the ranks' imports, the
process groups — is shown apart because on a small run it is most of the time: a bar at 0/N would say
nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time

from workbench.predict.formulas.flops import mfu
from workbench.predict.hardware import PEAK_ENV, peak_flops


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
        self.speed: str | None = None  # the last step's tokens/s (and MFU on GPUs): Speed.line
        self.last_shown = 0.0
        self.handle = None
        self.jupyter = enabled and _in_jupyter()
        self._show(
            f"{name}: starting {ranks} rank{'s' if ranks > 1 else ''} (torchrun, imports, process groups)…",
            force=True,
        )

    def update(self, done: int, speed: str | None = None) -> None:
        if done == self.done:
            return
        if done > 0 and self.first_step_at is None:
            self.first_step_at = time.monotonic()
        self.done = done
        self.speed = speed or self.speed
        if done > 0:
            tail = f" · {self.speed}" if self.speed else ""
            self._show(
                f"{self.name}: step {done}/{self.steps} · {time.monotonic() - self.t0:.1f} s{tail}"
            )

    def close(self, ok: bool = True) -> None:
        elapsed = time.monotonic() - self.t0
        if not ok:
            line = f"{self.name}: stopped after {max(self.done, 0)}/{self.steps} steps ({elapsed:.1f} s)"
        elif self.first_step_at is None or self.done < 1:
            line = f"{self.name}: {self.steps} steps in {elapsed:.1f} s"
        else:
            startup = self.first_step_at - self.t0
            per = (elapsed - startup) / max(self.done - 1, 1)
            line = (
                f"{self.name}: {self.steps} steps in {elapsed:.1f} s "
                f"(start-up {startup:.1f} s, then {per:.2f} s/step)"
            )
            if self.speed:
                line += f"; last step {self.speed}"
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


class Speed:
    """The last step's tokens/s from metrics.jsonl rows and, once rank 0's config.json says the ranks are on
    CUDA, its MFU (predict/formulas/flops.py over the device's peak: predict/hardware.py)."""

    def __init__(self, run_dir: str, config) -> None:  # a RunConfig
        self.run_dir, self.config = run_dir, config
        self.peak: float | None = None
        self.looked = False

    def line(self, rows: bytes) -> str | None:
        lines = [x for x in rows.splitlines() if x.strip()]
        if not lines:
            return None
        try:
            tps = float(json.loads(lines[-1])["tokens_per_s"])
        except (ValueError, KeyError):
            return None
        text = f"{tps / 1e3:,.1f}k tokens/s" if tps >= 1e3 else f"{tps:,.0f} tokens/s"
        val = last_val_loss(lines)
        if val is not None:
            text = f"val {val:.3f} · " + text
        peak = self._peak()
        if peak:
            text += f" · MFU {mfu(self.config.model_config, tps, peak, self.config.world_size):.0%}"
        return text

    def _peak(self) -> float | None:
        """The devices' peak FLOP/s, read once from config.json (None on the CPU or an unknown GPU)."""
        if self.looked:
            return self.peak
        path = os.path.join(self.run_dir, "config.json")
        if not os.path.exists(path):
            return None
        self.looked = True
        with open(path) as f:
            resolved = json.load(f)
        if resolved.get("device") == "cuda":
            self.peak = peak_flops(
                resolved.get("device_name", ""), self.config.precision, os.environ.get(PEAK_ENV)
            )
        return self.peak


def last_val_loss(lines: list[bytes]) -> float | None:
    """The latest held-out loss among metrics.jsonl's rows (None before the first evaluation)."""
    for raw in reversed(lines):
        try:
            value = json.loads(raw).get("val_loss")
        except ValueError:
            continue
        if value is not None:
            return float(value)
    return None
