"""RunConfig's pipeline rules: the schedule, its stages and microbatches, checked before any process
starts, each error naming the bad value and what would be valid. No torch.

    gpipe, 1f1b       one stage per rank (virtual_stages = 1)
    interleaved       virtual_stages > 1 chunks per rank, microbatches a multiple of pp
    zbh1              1F1B with the backward split in I and W (schedules/zero_bubble.py), one stage per rank
    zbv               two stages per rank in a V: virtual_stages is 2 (RunConfig sets it when left at 1)
    dualpipev         DeepSeek's DualPipeV: a V (virtual_stages 2), microbatches ≥ 2·pp
    dualpipe          DeepSeek's DualPipe: two pipelines over two copies of the model, pp even,
                      microbatches even and ≥ 2·pp, the layers cut in pp parts; zero=0 (each copy's whole
                      gradients are summed with its twin's: parallel/twin_grads.py)
    csv:FILE          a schedule in torch pipelining's CSV form (schedules/torch_csv.py): the file must
                      exist, parse, validate, and match pp and microbatches

The zero-bubble schedules (and DualPipe's tails) defer each Linear's weight gradient, which ZeRO-3 (it
frees and reduces a layer's gradients as its backward ends) does not allow: zero=3 is refused with them.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from workbench.config.model_config import ConfigError, divisors

if TYPE_CHECKING:  # the rules take the RunConfig whose validate() calls them
    from workbench.config.run_config import RunConfig

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zbh1", "zbv", "dualpipe", "dualpipev")
SPLIT_BACKWARD = ("zbh1", "zbv", "dualpipe", "dualpipev")
TWO_STAGES = ("zbv", "dualpipe", "dualpipev")  # per rank


def check_schedule_name(name: str) -> None:
    if name in SCHEDULES:
        return
    if isinstance(name, str) and name.startswith("csv:"):
        if not os.path.isfile(name[4:]):
            raise ConfigError(
                f"schedule={name!r}: no such file {name[4:]!r} (a torch pipelining CSV: one row per "
                f"rank of actions such as 0F0, 0I0, 0W0, 0B0)"
            )
        return
    raise ConfigError(f"schedule={name!r}: valid are {', '.join(SCHEDULES)}, or csv:FILE")


def check_pipeline(cfg: RunConfig) -> None:
    m, p, v, mb = cfg.model_config, cfg.pp, cfg.virtual_stages, cfg.microbatches
    name = cfg.schedule
    if name == "interleaved" and p > 1 and v == 1:
        raise ConfigError(
            "schedule='interleaved' needs virtual_stages > 1 (with one chunk per rank it is 1f1b)"
        )
    if name in TWO_STAGES and v != 2:
        raise ConfigError(
            f"schedule={name!r} runs two stages per rank: virtual_stages must be 2, got {v}"
        )
    dual, split = name == "dualpipe", name in SPLIT_BACKWARD
    if name.startswith("csv:") and p > 1:
        dual, split = _check_csv(cfg)  # a CSV's rules follow from its own actions
    elif v > 1 and name not in ("interleaved", *TWO_STAGES):
        raise ConfigError(
            f"virtual_stages={v} needs schedule='interleaved' (or zbv, dualpipe, dualpipev, with 2); "
            f"{name} runs one stage per rank"
        )
    if name in ("dualpipe", "dualpipev") and p > 1:
        _check_microbatches(cfg)
    if dual and p > 1:
        _check_two_copies(cfg)
    if (v > 1 or split) and p == 1:
        raise ConfigError(f"schedule={name!r} with virtual_stages={v} needs pp > 1")
    if split and cfg.zero == 3:
        raise ConfigError(
            f"schedule={name!r} defers weight gradients, which ZeRO-3 reduces as each layer's backward "
            f"ends: use zero ≤ 2 with it, or schedule 1f1b/interleaved with zero=3"
        )
    stages = p if dual else p * v  # DualPipe: each copy of the model in pp parts
    if m.layers % stages:
        valid = divisors(m.layers)
        raise ConfigError(
            f"model.layers={m.layers} cannot be split into "
            f"{'pp (DualPipe: parts a copy)' if dual else 'pp×virtual_stages'}={stages} equal "
            f"stages; the stage count must divide the layers: valid {valid}"
        )
    if cfg.local_batch % mb:
        valid = divisors(cfg.local_batch)
        raise ConfigError(
            f"microbatches={mb} does not divide the per-rank batch global_batch/dp = "
            f"{cfg.local_batch}; valid microbatches: {valid}"
        )
    if name == "interleaved" and p > 1 and mb % p:
        raise ConfigError(
            f"interleaved 1F1B sends microbatches round the ranks in groups of pp: "
            f"microbatches={mb} must be a multiple of pp={p}"
        )
    if p > 1 and not name.startswith("csv:"):
        if problems := generated_problems(name, p, mb, v):
            raise ConfigError(f"schedule={name!r} at pp={p}, microbatches={mb}: {problems[0]}")


@functools.lru_cache(maxsize=64)
def generated_problems(name: str, p: int, m: int, v: int) -> tuple[str, ...]:
    """The generated schedule validated (coverage, matched transfers, no deadlock under NCCL's rule)
    before any process starts: the generators are tested on samples of sizes, this checks the one run
    (0.1 s at pp 8, 64 microbatches)."""
    from workbench.schedules.build import build_schedule, validate

    try:
        return tuple(validate(build_schedule(name, p, m, v)))
    except ValueError as e:
        return (str(e),)


def splits_backward(cfg: RunConfig) -> bool:
    """Whether the run's schedule splits backward into I and W: by name, or a CSV with I actions."""
    if cfg.pp > 1 and cfg.schedule.startswith("csv:"):
        return _check_csv(cfg)[1]
    return cfg.pp > 1 and cfg.schedule in SPLIT_BACKWARD


def _check_microbatches(cfg: RunConfig) -> None:
    p, mb, name = cfg.pp, cfg.microbatches, cfg.schedule
    if mb < 2 * p:
        step = 2 if name == "dualpipe" else 1
        raise ConfigError(
            f"schedule={name!r} needs at least one microbatch per stage (2·pp = {2 * p}): "
            f"microbatches={mb}; valid: {2 * p}, {2 * p + step}, {2 * p + 2 * step} …"
        )


def _check_two_copies(cfg: RunConfig) -> None:
    """DualPipe's rules (its own name, or a CSV whose stages are its two pipelines)."""
    p, mb, name = cfg.pp, cfg.microbatches, cfg.schedule
    if p % 2:
        raise ConfigError(
            f"schedule={name!r} (DualPipe) folds its row of ranks in two (rank r pairs with pp − 1 − r): "
            f"pp must be even, got pp={p}; valid: {p - 1} or {p + 1}, or schedule='dualpipev'"
        )
    if mb % 2:
        raise ConfigError(
            f"schedule={name!r} (DualPipe) sends half the microbatches from each end: microbatches "
            f"must be even, got {mb}; valid: {mb - 1} or {mb + 1}"
        )
    if cfg.zero > 0:
        raise ConfigError(
            f"schedule={name!r} (DualPipe) sums each copy's whole gradients with its twin's after "
            f"backward: zero={cfg.zero} shards them first; use zero=0 with it, or schedule='dualpipev'"
        )
    if cfg.model_config.experts:
        raise ConfigError(
            f"schedule={name!r} (DualPipe) with model.experts={cfg.model_config.experts}: each copy "
            f"would count its own half of the tokens per expert (the router's bias and the reported "
            f"load), which is not built; use schedule='dualpipev' with experts"
        )


def _check_csv(cfg: RunConfig) -> tuple[bool, bool]:
    """The CSV read and validated; (DualPipe's two pipelines, a split backward) from its actions."""
    from workbench.schedules.torch_csv import read_csv  # validation only

    try:
        sched = read_csv(cfg.schedule[4:], cfg.microbatches)
    except ValueError as e:
        raise ConfigError(f"schedule={cfg.schedule!r}: {e}") from None
    if sched.p != cfg.pp or sched.v != cfg.virtual_stages:
        raise ConfigError(
            f"schedule={cfg.schedule!r} has {sched.p} ranks and {sched.v} stage(s) per rank: run it "
            f"with pp={sched.p} and virtual_stages={sched.v} (got pp={cfg.pp}, "
            f"virtual_stages={cfg.virtual_stages})"
        )
    split = any(a.kind == "I" for acts in sched.actions for a in acts)
    return sched.placement == "dual", split
