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
    if name.startswith("csv:") and p > 1:
        _check_csv(cfg)
    elif v > 1 and name not in ("interleaved", *TWO_STAGES):
        raise ConfigError(
            f"virtual_stages={v} needs schedule='interleaved' (or zbv, dualpipe, dualpipev, with 2); "
            f"{name} runs one stage per rank"
        )
    if name in ("dualpipe", "dualpipev") and p > 1:
        _check_dualpipe(cfg)
    if (v > 1 or name in SPLIT_BACKWARD) and p == 1:
        raise ConfigError(f"schedule={name!r} with virtual_stages={v} needs pp > 1")
    if name in SPLIT_BACKWARD and cfg.zero == 3:
        raise ConfigError(
            f"schedule={name!r} defers weight gradients, which ZeRO-3 reduces as each layer's backward "
            f"ends: use zero ≤ 2 with it, or schedule 1f1b/interleaved with zero=3"
        )
    stages = p if name == "dualpipe" else p * v  # DualPipe: each copy of the model in pp parts
    if m.layers % stages:
        valid = divisors(m.layers)
        raise ConfigError(
            f"model.layers={m.layers} cannot be split into pp×virtual_stages={stages} equal "
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


def _check_dualpipe(cfg: RunConfig) -> None:
    p, mb, name = cfg.pp, cfg.microbatches, cfg.schedule
    if name == "dualpipe" and p % 2:
        raise ConfigError(
            f"schedule='dualpipe' folds its row of ranks in two (rank r pairs with pp − 1 − r): pp must be "
            f"even, got pp={p}; valid: {p - 1} or {p + 1}, or schedule='dualpipev'"
        )
    if name == "dualpipe" and mb % 2:
        raise ConfigError(
            f"schedule='dualpipe' sends half the microbatches from each end: microbatches must be even, "
            f"got {mb}"
        )
    if mb < 2 * p:
        raise ConfigError(
            f"schedule={name!r} needs at least one microbatch per stage (2·pp = {2 * p}): "
            f"microbatches={mb}; valid: {2 * p} or more"
        )
    if name == "dualpipe" and cfg.zero > 0:
        raise ConfigError(
            f"schedule='dualpipe' sums each copy's whole gradients with its twin's after backward: "
            f"zero={cfg.zero} shards them first; use zero=0 with it, or schedule='dualpipev'"
        )


def _check_csv(cfg: RunConfig) -> None:
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
