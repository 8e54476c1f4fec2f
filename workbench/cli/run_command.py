"""`workbench run`: its flags generated from RunConfig's fields by tyro (torchtitan's choice) — every field a
flag, its help the field's comment, its type and default the field's — beside the launch's own options.

    workbench run --dp 2 --steps 20 --model tiny --out traces/dp2
    workbench run --config run.yaml --steps 40        # a file's settings, flags over them
    workbench run --dp 2 --print-config > run.yaml    # the resolved settings, which --config loads back the same

A flag is a field's name with dashes (`global_batch` → `--global-batch`); a boolean is `--x` / `--no-x`
(`--no-trace`, `--no-prefetch`); `--model` takes a preset or JSON changes to one. Three spellings of the
hand-written CLI that came before stay: `--timeout` (timeout_s), `--wandb` without a project ('workbench'),
`--grad-clip 0` (no clipping).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field
from typing import Literal

import tyro
from tyro.constructors import ConstructorRegistry, PrimitiveConstructorSpec, PrimitiveTypeInfo

from workbench.config import ConfigError, ModelConfig, RunConfig
from workbench.config.files import read_config
from workbench.config.model_config import model_from_dict


@dataclass(kw_only=True)
class LaunchOptions:
    """Where the run goes and which machines take part."""

    #: run directory (default traces/<name>, or traces/run-<time>)
    out: str | None = None
    #: torchrun, or ray: the ranks as Ray Train workers (a local Ray unless --ray-address; pip install 'ray[train]')
    launcher: Literal["torchrun", "ray"] = "torchrun"
    #: a running Ray cluster (--launcher ray)
    ray_address: str | None = None
    #: replace an earlier run in --out (without it, an existing run directory is an error)
    force: bool = False
    #: machines: a count, or MIN:MAX for elastic membership (the run re-forms its group, and dp, when a machine
    #: leaves or joins; needs --checkpoint-every and --max-restarts)
    nnodes: str = "1"
    #: this machine's index among them
    node_rank: int = 0
    #: HOST:PORT of the first machine
    rdzv_endpoint: str | None = None
    #: a cluster on this machine (workbench cluster up --name NAME): one torchrun agent in each of its nodes
    #: (--launcher ray: a Ray head in node 0, a Ray worker node in each other, the driver in node 0)
    cluster: str | None = None
    #: no progress line
    quiet: bool = False
    #: refuse a run whose checkpoints, traces and metrics would not fit on out's filesystem (--no-check-disk: go)
    check_disk: bool = True
    #: refuse a run whose predicted peak memory would not fit in this machine's free memory (--no-check-memory: go)
    check_memory: bool = True
    #: a YAML or TOML file of RunConfig's fields (config/files.py); the flags given beside it change it
    config: str | None = None
    #: print the resolved settings as YAML — a file --config loads back the same — and start nothing
    print_config: bool = False


@dataclass
class RunCommand:
    """Run a training with torchrun: every RunConfig field is a flag (config/run_config.py says what each does)."""

    run: RunConfig = field(default_factory=RunConfig)
    launch: LaunchOptions = field(default_factory=LaunchOptions)


def _model_rule(info: PrimitiveTypeInfo) -> PrimitiveConstructorSpec | None:
    """`--model`: a preset's name, or JSON changes to one ('{"base": "small", "layers": 8}')."""
    if info.type != (str | ModelConfig):
        return None

    def parse(args: list[str]) -> str | ModelConfig:
        text = args[0]
        if not text.lstrip().startswith("{"):
            return text
        try:
            return model_from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise ValueError(f"--model {text!r}: not a preset's name nor JSON ({e})") from None

    return PrimitiveConstructorSpec(
        nargs=1,
        metavar="PRESET|JSON",
        instance_from_str=parse,
        is_instance=lambda x: isinstance(x, str | ModelConfig),
        str_from_instance=lambda x: [
            x if isinstance(x, str) else json.dumps(dataclasses.asdict(x))
        ],
    )


REGISTRY = ConstructorRegistry()
REGISTRY.primitive_rule(_model_rule)


def legacy(argv: list[str]) -> list[str]:
    """The hand-written CLI's spellings, in the generated one's: --timeout S → --timeout-s S; a bare --wandb →
    --wandb workbench; --grad-clip 0 → --grad-clip None."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if arg == "--timeout":
            arg = "--timeout-s"
        elif arg.startswith("--timeout="):
            arg = "--timeout-s=" + arg.split("=", 1)[1]
        if arg == "--wandb" and (nxt is None or nxt.startswith("--")):
            out += [arg, "workbench"]
            continue
        if out and out[-1] == "--grad-clip" and arg in ("0", "0.0"):
            arg = "None"
        out.append(arg)
    return out


def _check_model_json(argv: list[str]) -> None:
    """A --model given as JSON that does not parse: said plainly, exit status 2 (argparse's), before tyro."""
    for i, arg in enumerate(argv):
        value = (
            argv[i + 1]
            if arg == "--model" and i + 1 < len(argv)
            else arg[8:]
            if arg.startswith("--model=")
            else None
        )
        if value is not None and value.lstrip().startswith("{"):
            try:
                json.loads(value)
            except json.JSONDecodeError as e:
                print(
                    f"workbench run: error: --model {value!r} is not valid JSON ({e}); give a preset's name or "
                    f'JSON changes to one, e.g. \'{{"base": "small", "layers": 8}}\'',
                    file=sys.stderr,
                )
                raise SystemExit(2) from None


def _config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def parse_run(argv: list[str], prog: str = "workbench run") -> tuple[RunConfig, LaunchOptions]:
    """`workbench run`'s arguments → (RunConfig, LaunchOptions), not yet validated. With --config, the file's
    settings are the defaults the flags change. tyro exits (status 2) on a flag it cannot parse."""
    argv = legacy(argv)
    _check_model_json(argv)
    path = _config_path(argv)
    base = read_config(path) if path else RunConfig()
    default = RunCommand(run=base, launch=LaunchOptions(config=path))
    with REGISTRY:
        parsed = tyro.cli(
            RunCommand,
            args=argv,
            prog=prog,
            default=default,
            config=(tyro.conf.OmitArgPrefixes, tyro.conf.OmitSubcommandPrefixes),
        )
    return parsed.run, parsed.launch


__all__ = ["ConfigError", "LaunchOptions", "RunCommand", "legacy", "parse_run"]
