"""The one table scripts/gpu_check.py rewrites after every section, read from what the sections left in OUT:

    python scripts/gpu_summary.py OUT [SECONDS]

sections.tsv (each section's result — passed, FAILED, cut at its bound, not run and why —, its seconds, its
bound and, rehearsing, its estimate on one H100), each suite section's log (pytest's last line), bench.jsonl
(benchmarks/ours_vs_plain.py: tokens/s and MFU of our fast steps, our measured steps and the plain loop, ours/plain
with its 95 % interval), run_summary.json (the CLI run's summary.json: its MFU and what measuring cost). Each
throughput row names issue 35's goal beside it.
"""

from __future__ import annotations

import json
import os
import sys

#: issue 35's goals for one H200-class GPU: (model, compiled) → MFU of our fast steps; ours/plain at most 1.10
MFU_GOALS = {("gpt2-small", False): 0.30, ("gpt2-small", True): 0.40, ("gpt-1.3b", True): 0.45}
RATIO_GOAL = 1.10


def last_line(path: str) -> str:
    if not os.path.exists(path):
        return "no log"
    lines = [x.strip() for x in open(path) if x.strip()]
    return lines[-1] if lines else "empty log"


def throughput_rows(out: str) -> list[str]:
    path = os.path.join(out, "bench.jsonl")
    if not os.path.exists(path):
        return ["  (no benchmark finished)"]
    rows = []
    for line in open(path):
        b = json.loads(line)
        name = f"{b['model']} {'compiled' if b['compiled'] else 'eager'}{', one side' if b.get('sequential') else ''}"
        goal = MFU_GOALS.get((b["model"], b["compiled"]))
        for key, label in (
            ("ours_fast", "ours, fast steps"),
            ("ours_measured", "ours, every step measured"),
            ("plain", "plain PyTorch loop"),
        ):
            s = b["speed"][key]
            mfu = f"{s['mfu']:.1%}" if s["mfu"] is not None else "n/a"
            mark = ""
            if key == "ours_fast" and goal is not None and s["mfu"] is not None:
                mark = f"goal ≥ {goal:.0%}: {'met' if s['mfu'] >= goal else 'NOT met'}"
            speed = f"{s['tokens_per_s']:>12,.0f} {mfu:>7} {s['step_s'] * 1e3:>9.1f}"
            rows.append(f"  {name:<22} {label:<27} {speed}  {mark}")
        for key, label in (
            ("ratio_fast", "ours fast / plain"),
            ("ratio_measured", "ours measured / plain"),
        ):
            r = b[key]
            mark = ""
            if key == "ratio_fast" and goal is not None:
                mark = f"goal ≤ {RATIO_GOAL}: {'met' if r['median'] <= RATIO_GOAL else 'NOT met'}"
            interval = f"95 % [{r['low']:.3f}, {r['high']:.3f}]"
            rows.append(f"  {name:<22} {label:<27} {r['median']:>12.3f}  {interval}  {mark}")
    return rows


SUITE_LOGS = ("fast_path", "one_GPU", "rest_of_the_suite")


def main(out: str, seconds: str | None = None) -> None:
    gpus = last_line(os.path.join(out, "gpus.txt"))
    print(f"\n=== GPU check: {gpus}{f' — {int(seconds) / 60:.1f} min' if seconds else ''}")
    print(f"sections {'':<20} {'s':>4} {'bound':>5}  result")
    if os.path.exists(os.path.join(out, "sections.tsv")):
        for line in open(os.path.join(out, "sections.tsv")):
            name, state, took, bound, estimate = line.rstrip("\n").split("\t")
            print(
                f"  {name:<26} {took:>4} {bound:>5}  {state}{f'; on one H100: {estimate}' if estimate else ''}"
            )
    for log in SUITE_LOGS:
        if os.path.exists(os.path.join(out, f"{log}.log")):
            print(f"  {log.replace('_', ' ')}: {last_line(os.path.join(out, f'{log}.log'))}")
    print(f"throughput (bf16, sdpa)          {'':<27} {'tokens/s':>12} {'MFU':>7} {'step ms':>9}")
    print("\n".join(throughput_rows(out)))
    run = os.path.join(out, "run_summary.json")
    if os.path.exists(run):
        s = json.load(open(run))
        mfu = (s.get("mfu") or {}).get("value")
        r0 = s["ranks"][0]
        cost = r0.get("measure_cost")
        print(
            f"cli run (12 steps, an evaluation every 6): step {s['step_time_s'] * 1e3:.1f} ms "
            f"({r0.get('step_time_from')}), MFU {f'{mfu:.1%}' if mfu else 'n/a'}; "
            f"{f'a measured step costs {cost:.2f}× a fast one' if cost else 'no fast/measured pair'}"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
