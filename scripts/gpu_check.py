"""The GPU check, shaped for one call of a borrowed GPU (scripts/gpu_check.sh runs this; standard library only).

    bash scripts/gpu_check.sh              # on a machine with NVIDIA GPUs: ≤ 8 minutes on one H100 by default
    bash scripts/gpu_check.sh --rehearse   # here, on the CPU: every section's real command, tiny sizes

The sections, as data (SECTIONS), in the order of what a cut call should still bring back:

    preflight          the GPUs, torch's CUDA, the carried wheels installed, Triton's toolchain (a C compiler and
                       Python's headers) looked for before anything compiles
    headline eager     gpt2-small bf16 at 16 × 1024, sdpa: ours with fast steps (and every step measured) against
                       the plain PyTorch loop, interleaved (benchmarks/ours_vs_plain.py): tokens/s, MFU, ours/plain
                       with its 95 % interval, what a measured step costs
    headline compiled  the same, both sides compiled (only with the toolchain)
    cli run            gpt2-small through `workbench run`: the launch path, an evaluation through the prepared
                       batches, summary.json's MFU, doctor through NVML
    fast path          tests/gpu/test_fast_path.py but its compiled cases: a fast step's synchronisations, the fused
                       AdamW, the same training whatever is measured
    one GPU            tests/gpu/test_one_gpu.py: one GPU equals one CPU process, offload, recomputation, fp16,
                       resume, NVML
    rest of the suite  everything else under tests/gpu (compiled blocks, calibration, NCCL launches), 90 s
    gpt-1.3b compiled  only if its bound still fits: ours, then plain, each built on the device
    dp vs ddp          with two GPUs or more

Every section runs under its own bound and the whole check under TOTAL_S: a section starts if 20 s are left and is
cut at what is left; one marked "if time" (gpt-1.3b) starts only if its whole bound is left — at the default 480 s
it is not (its row says so): TOTAL_S=600 in a call of its own runs it. As each ends, its row goes into
OUT/sections.tsv and the summary table (scripts/gpu_summary.py) is rewritten to OUT/summary.txt: a call cut at any
point returns every row finished before.

--rehearse runs each section's command on the CPU (gloo, `tiny`, a round or two; the compiled sections eager, as
inductor's CPU compile would double make test's share, and tests/test_compiled.py compiles) under a fresh virtualenv
that holds only the packages the GPU machine's image lists (scripts/gpu_image_packages.txt) and the ones the check
carries as wheels (scripts/gpu_wheels.sh): every import resolves and every section writes its rows. Each
section's time on one H100 is then estimated as the host work measured here (start-up, imports, launches — the
GPU machine's cores are no slower) plus the section's device work, assumed per section from the one GPU run this
project has seen (ASSUMED below says where each figure comes from), and held against its bound.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOTAL_S = float(os.environ.get("TOTAL_S", 480))  # the whole check, wheels included: 8 minutes

#: device seconds of the real sections, which cannot be measured here. From the one GPU run seen (docs/guide/gpus.md):
#: gpt2-small at 8 × 1024 stepped in 54.5 ms, so ~0.11 s at 16 × 1024, and gpt-1.3b's 15.4k tokens/s is ~0.55 s
#: at 8 × 1024. From issue 48's reading of the suite (18 one-GPU cases and 17 NCCL launches in 150–300 s): ~8 s a
#: case, one launch each — CUDA's context, NCCL's set-up, the first kernels, a few steps — and so ~8 s for a
#: process to start. Compiling: gpt2-small's blocks ~60 s, gpt-1.3b's whole model 110–170 s (issue 48), both
#: assumptions no GPU has checked yet.
ASSUMED = {
    "step_s": 0.11,
    "big_step_s": 0.55,
    "start_s": 8.0,
    "compile_s": 60.0,
    "big_compile_s": 170.0,
    "case_s": 8.0,
}


@dataclass
class Section:
    name: str
    bound_s: float  # on one H100, at the real sizes
    real: list[str]  # the command (PY stands for the python that runs it)
    tiny: list[str]  # its rehearsal on the CPU
    # the real section's device work beyond what the rehearsal measures (ASSUMED)
    device_s: float = 0.0
    # a pytest section: ASSUMED["case_s"] per case the rehearsal collected, on top
    per_case: bool = False
    needs: str = ""  # "toolchain", "2 gpus": not run without it
    #: rehearsing, the section whose host time stands for this one's: a compiled section's time here is mostly the
    #: CPU compiler's, which the device estimate already counts as compile_s (its eager twin's start-up is the host's)
    host_like: str = ""
    if_time: bool = False  # run only if its whole bound still fits
    rows: list[str] = field(default_factory=list)


def bench(model: str, batch: int, *extra: str) -> tuple[list[str], list[str]]:
    common = [
        "PY",
        "benchmarks/ours_vs_plain.py",
        "--precision",
        "bf16",
        "--attention",
        "sdpa",
        *extra,
    ]
    return (
        [
            *common,
            "--backend",
            "nccl",
            "--model",
            model,
            "--global-batch",
            str(batch),
            "--rounds",
            "10",
            "--warmup",
            "2",
        ],
        [
            *common,
            "--backend",
            "gloo",
            "--model",
            "tiny",
            "--global-batch",
            "4",
            "--rounds",
            "2",
            "--warmup",
            "1",
        ],
    )


def cli_run(model: str, backend: str, batch: int, out: str) -> list[str]:
    return [
        "PY",
        "-m",
        "workbench.cli",
        "run",
        "--model",
        model,
        "--precision",
        "bf16",
        "--attention",
        "sdpa",
        "--backend",
        backend,
        "--global-batch",
        str(batch),
        "--lr",
        "3e-4",
        "--steps",
        "12",
        "--eval-every",
        "6",
        "--eval-batches",
        "2",
        "--out",
        out,
        "--force",
    ]


def suite(*args: str) -> list[str]:
    return ["PY", "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider", *args]


# three candidates over 12 rounds, and the loss check's steps on both sides
STEPS = 3 * (10 + 2) + 2 * 3
SECTIONS = [
    Section(
        "headline eager",
        75,
        *bench("gpt2-small", 16),
        device_s=ASSUMED["start_s"] + STEPS * ASSUMED["step_s"],
    ),
    Section(
        "headline compiled",
        120,
        bench("gpt2-small", 16, "--compile")[0],
        bench("gpt2-small", 16)[1],
        needs="toolchain",
        host_like="headline eager",
        device_s=ASSUMED["start_s"] + ASSUMED["compile_s"] + STEPS * ASSUMED["step_s"],
    ),
    Section(
        "cli run",
        45,
        cli_run("gpt2-small", "nccl", 16, "OUT/gpt2-small"),
        cli_run("tiny", "gloo", 4, "OUT/gpt2-small"),
        device_s=ASSUMED["start_s"] + 16 * ASSUMED["step_s"],
    ),
    Section(
        "fast path",
        70,
        suite("-k", "not compiled", "tests/gpu/test_fast_path.py"),
        suite("-k", "not compiled", "tests/gpu/test_fast_path.py"),
        per_case=True,
    ),
    Section(
        "one GPU",
        95,
        suite("tests/gpu/test_one_gpu.py"),
        suite("tests/gpu/test_one_gpu.py"),
        per_case=True,
    ),
    Section(
        "rest of the suite",
        90,
        suite(
            "tests/gpu",
            "--deselect",
            "tests/gpu/test_one_gpu.py",
            "-k",
            "not test_fast_path or compiled",
        ),
        suite(
            "tests/gpu",
            "--deselect",
            "tests/gpu/test_one_gpu.py",
            "-k",
            "not test_fast_path or compiled",
        ),
    ),
    Section(
        "gpt-1.3b compiled",
        300,
        bench("gpt-1.3b", 8, "--compile", "--one-side-at-a-time")[0],
        bench("gpt-1.3b", 8, "--one-side-at-a-time")[1],
        needs="toolchain",  # rehearsed eager: one compile will do
        if_time=True,
        device_s=ASSUMED["start_s"]
        + ASSUMED["compile_s"]
        + ASSUMED["big_compile_s"]
        + STEPS * ASSUMED["big_step_s"],
    ),
    Section(
        "dp vs ddp",
        60,
        [
            "PY",
            "benchmarks/dp_vs_ddp.py",
            "--backend",
            "nccl",
            "--ranks",
            "NGPU",
            "--model",
            "small",
            "--global-batch",
            "16",
            "--bucket-mb",
            "25",
            "--rounds",
            "20",
        ],
        [
            "PY",
            "benchmarks/dp_vs_ddp.py",
            "--backend",
            "gloo",
            "--ranks",
            "2",
            "--model",
            "tiny",
            "--global-batch",
            "4",
            "--rounds",
            "2",
        ],
        needs="2 gpus",
        device_s=ASSUMED["start_s"],
    ),
]


def toolchain() -> str:
    """'' when Triton can build its launchers (a C compiler and Python's headers), else what is missing."""
    missing = (
        []
        if (shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc"))
        else ["a C compiler (cc)"]
    )
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        missing.append(f"Python's headers ({headers})")
    return " and ".join(missing)


def gpu_count() -> int:
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class Check:
    def __init__(self, out: Path, py: str, rehearse: bool) -> None:
        self.out, self.py, self.rehearse = out, py, rehearse
        self.start = time.monotonic()
        self.gpus = gpu_count()
        self.missing_toolchain = toolchain()
        self.failed = False
        # rehearsing: the estimated seconds on one H100 of every section always run
        self.estimated = 0.0
        self.host_s: dict[str, float] = {}  # rehearsing: each section's time here

    def left(self) -> float:
        return TOTAL_S - (time.monotonic() - self.start)

    def row(
        self, name: str, state: str, seconds: float = 0.0, bound: float = 0.0, estimate: str = ""
    ) -> None:
        with open(self.out / "sections.tsv", "a") as f:
            f.write(f"{name}\t{state}\t{seconds:.0f}\t{bound:.0f}\t{estimate}\n")
        self.summary()

    def summary(self) -> None:
        result = subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "gpu_summary.py"),
                str(self.out),
                str(int(time.monotonic() - self.start)),
            ],
            capture_output=True,
            text=True,
        )
        (self.out / "summary.txt").write_text(result.stdout + result.stderr)

    def argv(self, section: Section) -> list[str]:
        words = section.tiny if self.rehearse else section.real
        swap = {"PY": self.py, "NGPU": str(self.gpus)}
        return [swap.get(w, w.replace("OUT/", f"{self.out}/")) for w in words]

    def why_not(self, section: Section) -> str:
        if section.needs == "toolchain" and self.missing_toolchain:
            return f"not run: --compile needs {self.missing_toolchain}"
        if section.needs == "2 gpus" and not self.rehearse and self.gpus < 2:
            return f"not run: needs two GPUs, this machine has {self.gpus}"
        return ""

    def run(self, section: Section) -> None:
        if why := self.why_not(section):
            return self.row(section.name, why)
        bound = section.bound_s
        if not self.rehearse and (self.left() < (bound if section.if_time else 20)):
            return self.row(section.name, f"not run: {self.left():.0f} s left of {TOTAL_S:.0f}")
        limit = bound if self.rehearse else min(bound, self.left() - 5)
        log = self.out / f"{section.name.replace(' ', '_')}.log"
        env = {**os.environ, "WB_BENCH_JSON": str(self.out / "bench.jsonl")}
        print(
            f"== {section.name} (bound {limit:.0f} s): {' '.join(self.argv(section))}", flush=True
        )
        t0 = time.monotonic()
        # a session of its own: a cut section's torchrun and ranks go with it
        with open(log, "w") as f:
            proc = subprocess.Popen(
                self.argv(section),
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = 124
        seconds = time.monotonic() - t0
        print(log.read_text()[-3000:], flush=True)
        state = {0: "passed", 124: "cut at its bound"}.get(rc, f"FAILED (exit {rc})")
        self.failed |= rc not in (0, 124)
        estimate = self.estimate(section, seconds, log) if self.rehearse else ""
        self.row(section.name, state, seconds, bound, estimate)
        if section.name == "cli run" and rc == 0:
            self.after_cli_run()
        return None

    def estimate(self, section: Section, seconds: float, log: Path) -> str:
        """On one H100: the host work measured here plus the section's assumed device work; against its bound."""
        self.host_s[section.name] = seconds
        seconds = self.host_s.get(section.host_like, seconds)
        device = section.device_s
        if section.per_case:
            words = log.read_text().split()
            cases = sum(
                int(words[i - 1])
                for i, w in enumerate(words)
                if w.rstrip(",") in ("skipped", "passed") and i > 0 and words[i - 1].isdigit()
            )
            device += cases * ASSUMED["case_s"]
        total = seconds + device
        if not section.if_time:
            self.estimated += total
        bound = section.bound_s
        verdict = "fits" if not bound or total <= bound else "OVER ITS BOUND"
        self.failed |= verdict != "fits"
        return f"{seconds:.0f} s here + {device:.0f} s on the device = {total:.0f} s: {verdict}"

    def after_cli_run(self) -> None:
        run = self.out / "gpt2-small"
        try:
            doctor = subprocess.run(
                [self.py, "-m", "workbench.cli", "doctor", str(run)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            (self.out / "doctor.log").write_text(doctor.stdout + doctor.stderr)
        except subprocess.TimeoutExpired:
            (self.out / "doctor.log").write_text("doctor did not answer within 60 s\n")
        if (run / "summary.json").exists():
            shutil.copy(run / "summary.json", self.out / "run_summary.json")
        shutil.make_archive(str(self.out / "gpt2_small_run"), "gztar", self.out, "gpt2-small")
        shutil.rmtree(run)
        self.summary()


def preflight(check: Check) -> bool:
    """The GPUs and torch's CUDA (or, rehearsing, that torch imports), the wheels, the toolchain: one row."""
    t0 = time.monotonic()
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    if wheels and not check.rehearse:
        subprocess.run(
            [
                check.py,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                "/tmp/site",
                *map(str, wheels),
            ],
            check=False,
        )
        os.environ["PYTHONPATH"] = f"{os.environ['PYTHONPATH']}:/tmp/site"
    probe = (
        "import torch; c = torch.cuda.is_available(); "
        "print('torch', torch.__version__, 'CUDA', torch.version.cuda, "
        "'NCCL', torch.cuda.nccl.version() if c else None, torch.cuda.get_device_name() if c else 'no GPU')"
    )
    got = subprocess.run(
        [check.py, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    gpus = (
        subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        if check.gpus
        else ""
    )
    (check.out / "gpus.txt").write_text(gpus + got.stdout + got.stderr[-2000:])
    tools = (
        f"toolchain missing: {check.missing_toolchain}"
        if check.missing_toolchain
        else "toolchain found"
    )
    ok = got.returncode == 0 and (check.rehearse or "no GPU" not in got.stdout)
    state = (
        "passed" if ok else "FAILED"
    ) + f" ({got.stdout.strip() or got.stderr.strip()[-200:]}; {tools})"
    took = time.monotonic() - t0
    if check.rehearse:  # there: the wheels installed, CUDA's first initialisation (ASSUMED's start)
        check.estimated += took + ASSUMED["start_s"]
    check.row("preflight", state, took, 40)
    return ok


def fresh_venv(where: Path) -> str:
    """A virtualenv of this Python with only the GPU image's packages and the carried ones, linked from the
    project's venv: the rehearsal's imports resolve only where the GPU machine's would."""
    import importlib.metadata as md

    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--clear", str(where)], check=True
    )
    site = Path(
        subprocess.run(
            [
                str(where / "bin" / "python"),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    allowed = {
        canon(n)
        for n in (ROOT / "scripts" / "gpu_image_packages.txt").read_text().split()
        if not n.startswith("#")
    } | {canon(n) for n in carried()}
    for dist in md.distributions():
        if canon(dist.metadata["Name"]) not in allowed:
            continue
        here = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            if (here / top).exists() and not (site / top).exists() and top != "__pycache__":
                (site / top).symlink_to(here / top)
    return str(where / "bin" / "python")


def canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def carried() -> list[str]:
    """The packages scripts/gpu_wheels.sh carries (its PKGS), by name."""
    text = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    body = text[text.index("PKGS=(") + 6 : text.index(")", text.index("PKGS=("))]
    return [w.split("==")[0] for w in body.split()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rehearse", action="store_true", help="on the CPU: every section's command at tiny sizes"
    )
    args = p.parse_args(argv)
    out = Path(os.environ.get("OUT") or "/tmp/gpu_check")
    out.mkdir(parents=True, exist_ok=True)
    for old in ("bench.jsonl", "sections.tsv"):
        (out / old).unlink(missing_ok=True)
    before = os.environ.get("PYTHONPATH")
    os.environ.update(
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT) + (os.pathsep + before if before else ""),
    )
    py = fresh_venv(out / "venv") if args.rehearse else os.environ.get("PY", "python3")
    check = Check(out, py, args.rehearse)
    if preflight(check):
        for section in SECTIONS:
            check.run(section)
    if args.rehearse:
        verdict = "fits" if check.estimated <= TOTAL_S else "OVER"
        check.failed |= verdict != "fits"
        check.row(
            "the whole check",
            f"{check.estimated:.0f} s estimated on one H100 of {TOTAL_S:.0f}: {verdict}",
        )
    check.summary()
    print((out / "summary.txt").read_text())
    if args.rehearse:
        shutil.rmtree(out / "venv", ignore_errors=True)
    return 1 if check.failed or "FAILED" in (out / "sections.tsv").read_text() else 0


if __name__ == "__main__":
    sys.exit(main())
