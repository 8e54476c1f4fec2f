"""The planner: search dp × tp × pp (× cp) × ZeRO × microbatches for a model on a cluster, keep what fits in
memory, rank by estimated step time, and say why.

    plan(GPT3_175B, Cluster(nodes=96, hardware=A100_80GB), global_batch=1536, zero_stages=(0,),
         recompute="selective").best        # tp 8, pp 12, dp 8: the brief's (and Megatron's) layout

Rules, the field's: tensor parallelism stays inside a node (t divides the GPUs per node and the heads);
pipeline stages divide the layers; 1F1B with microbatches of `micro_batch` sequences (or each of
`schedules` where it is valid: `pipeline_schedules`); memory per GPU must fit `usable_memory` of the
device (allocator and workspace headroom).

    plan(model, cluster, global_batch=512, schedules=("1f1b", "zbv", "dualpipev", "dualpipe"))
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from workbench.config import ConfigError, ModelConfig
from workbench.config.model_config import tp_indivisible
from workbench.predict.estimator import Estimate, Hardware, estimate
from workbench.predict.run_layout import RunLayout, uneven


@dataclass(frozen=True)
class Cluster:
    """`nodes` machines of `hardware` (each with hardware.devices_per_node GPUs): Cluster(64, A100_80GB) is
    64 nodes × 8 = 512 GPUs."""

    nodes: int
    hardware: Hardware

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise ConfigError(
                f"Cluster(nodes={self.nodes!r}): a number of machines ≥ 1 (each with "
                f"{self.hardware.devices_per_node} devices); for a GPU count g, nodes = g // "
                f"{self.hardware.devices_per_node}"
            )

    def __str__(self) -> str:
        return f"{self.nodes} nodes × {self.hardware.devices_per_node} = {self.gpus} × {self.hardware.name}"

    @property
    def gpus(self) -> int:
        return self.nodes * self.hardware.devices_per_node


@dataclass(kw_only=True)
class Plan:
    candidates: pd.DataFrame  # every layout tried: sizes, memory, fit, estimated step time
    best: dict | None
    explanation: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return "\n".join(self.explanation)


def _terms(e: Estimate) -> dict[str, float]:
    """The step time's split (seconds): compute, tensor-parallel, the context-parallel ring's exposed part,
    pipeline (bubble and transfers) and exposed data-parallel communication, and the rest (optimizer, ZeRO
    traffic, offload, fixed costs)."""
    main = {
        "compute_s": "compute",
        "tp_s": "tp",
        "cp_s": "cp",
        "ep_s": "ep",
        "pipeline_s": "pipeline",
        "dp_s": "dp",
    }
    out = {col: e.step_terms.get(term, 0.0) for col, term in main.items()}
    out["other_s"] = sum(e.step_terms.values()) - sum(out.values())
    return out


def _layouts(
    model: ModelConfig,
    hw: Hardware,
    *,
    world: int,
    global_batch: int,
    micro_batch: int,
    cps: tuple[int, ...],
    uneven_stages: bool = False,
) -> Iterator[tuple[int, int, int, int, int, int]]:
    """(tp, pp, cp, dp, ep, microbatches) of every grid the field's rules allow: tp inside a node and dividing
    the heads (and K/V heads), pp dividing the layers (or, `uneven_stages`, Llama 3's uneven split:
    run_layout.uneven), cp cutting the sequence into 2·cp equal chunks (head-tail), dp the rest of the world
    with a whole number of microbatches; with experts, every ep dividing dp and E."""

    def stages_ok(p: int) -> bool:
        return model.layers % p == 0 or (uneven_stages and uneven(model, p) is not None)

    for tp in (
        t
        for t in range(1, hw.devices_per_node + 1)
        if hw.devices_per_node % t == 0 and not tp_indivisible(model, t)
    ):
        for pp in (p for p in range(1, model.layers + 1) if stages_ok(p) and world % (tp * p) == 0):
            for cp in (
                c for c in cps if world % (tp * pp * c) == 0 and model.seq_len % (2 * c) == 0
            ):
                dp = world // (tp * pp * cp)
                if global_batch % (dp * micro_batch):
                    continue
                for ep in (
                    e for e in range(1, dp + 1) if dp % e == 0 and (model.experts or 1) % e == 0
                ):
                    yield tp, pp, cp, dp, ep, global_batch // (dp * micro_batch)


#: the schedules the planner can try (interleaved needs a chunk count of its own: not searched)
PLANNED = ("gpipe", "1f1b", "zbh1", "zbv", "dualpipe", "dualpipev")


def pipeline_schedules(
    names: tuple[str, ...], *, model: ModelConfig, pp: int, m: int, zero: int
) -> list[tuple[str, int]]:
    """(schedule, virtual stages) of each of `names` valid for this layout (config/pipeline_rules.py's
    rules): ZB-H1 and ZBV, which defer weight gradients, with ZeRO ≤ 2; ZBV and DualPipeV with 2·pp equal
    stages dividing the layers; DualPipeV with m ≥ 2·pp; DualPipe with pp and m even, m ≥ 2·pp, pp dividing the
    layers and zero = 0 (its twin copies sum whole gradients). Without a pipeline, one: ("1f1b", 1)."""
    if pp == 1:
        return [("1f1b", 1)]
    out = []
    for name in names:
        two = name in ("zbv", "dualpipe", "dualpipev")
        stages = pp if name == "dualpipe" else 2 * pp
        # one stage a rank: the layouts' own rule (uneven stages included); two: equal stages only
        if (two and model.layers % stages) or (name in ("zbh1", "zbv") and zero > 2):
            continue
        if name == "dualpipev" and m < 2 * pp:
            continue
        if name == "dualpipe" and (pp % 2 or m % 2 or m < 2 * pp or zero):
            continue
        out.append((name, 2 if two else 1))
    return out


def plan(
    model: ModelConfig,
    cluster: Cluster,
    *,
    global_batch: int,
    micro_batch: int = 1,
    precision: str = "mixed",
    zero_stages: tuple[int, ...] = (0, 1, 2, 3),
    recompute: str = "selective",
    sequence_parallel: bool = False,
    offload: tuple[bool, ...] = (False,),
    cp: tuple[int, ...] = (1,),
    activations: str = "megatron",
    attention: str = "eager",
    uneven_stages: bool = False,
    schedules: tuple[str, ...] = ("1f1b",),
) -> Plan:
    """Every layout of `_layouts` (context parallelism: the degrees in `cp`) with each ZeRO stage and offload
    choice, estimated; the table sorted by fit, then step time. `activations`: 'megatron' (Korthikanti et
    al.'s GPT formula) or 'ours' (what this engine's block saves — Llama's too — with `attention` 'sdpa' for
    a flash kernel); `uneven_stages`: Llama 3's pipelines (run_layout.uneven); `schedules`: the pipeline
    schedules tried on each layout with pp > 1, where valid (`pipeline_schedules`; PLANNED)."""
    unknown = [name for name in schedules if name not in PLANNED]
    if unknown or not schedules:
        raise ConfigError(f"plan: schedules={schedules!r}; valid: {', '.join(PLANNED)}")
    hw, world = cluster.hardware, cluster.gpus
    every = RunLayout(  # what every layout tried shares
        model=model,
        precision=precision,
        global_batch=global_batch,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
        attention=attention,
        uneven_stages=uneven_stages,
    )
    rows = []
    grids = _layouts(
        model,
        hw,
        world=world,
        global_batch=global_batch,
        micro_batch=micro_batch,
        cps=cp,
        uneven_stages=uneven_stages,
    )
    for tp, pp, c, dp, ep, m in grids:
        for zero, off in ((z, o) for z in zero_stages for o in offload if z or not o):
            if zero >= 2 and pp > 1 or zero and ep > 1:
                continue  # partitioned gradients and parameters per microbatch: not with pipelines; ZeRO's
                # slices of experts and dense weights over two groups: not built (config/rules.check_experts)
            for name, v in pipeline_schedules(schedules, model=model, pp=pp, m=m, zero=zero):
                layout = replace(
                    every,
                    dp=dp,
                    tp=tp,
                    pp=pp,
                    cp=c,
                    ep=ep,
                    zero=zero,
                    offload=off,
                    microbatches=m,
                    schedule=name,
                    virtual_stages=v,
                )
                rows.append(_row(layout, estimate(layout, hardware=hw, activations=activations)))
    table = pd.DataFrame(rows).sort_values(
        ["fits", "step_time_s", "memory_GB"], ascending=[False, True, True]
    )
    table = table.reset_index(drop=True)
    fitting = table[table.fits]
    best = fitting.iloc[0].to_dict() if len(fitting) else None
    return Plan(candidates=table, best=best, explanation=_explain(model, cluster, table, best))


def _row(layout: RunLayout, e: Estimate) -> dict[str, Any]:
    """One layout tried, as the plan's table shows it: its sizes, memory (GB), fit, bubble and step time."""
    # every layout tried has a model and a global batch, so its activations and memory are estimated
    assert e.activation_bytes_per_rank is not None and e.memory_bytes_per_rank is not None
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "dp": layout.dp,
        "ep": layout.ep,
        "zero": layout.zero,
        "offload": layout.offload,
        "microbatches": layout.microbatches,
        "schedule": layout.schedule,
        "host_GB": sum(e.host_bytes.values()) / 1e9,
        "model_states_GB": e.model_state_bytes_per_rank / 1e9,
        "activations_GB": e.activation_bytes_per_rank / 1e9,
        "memory_GB": e.memory_bytes_per_rank / 1e9,
        "fits": e.fits,
        "bubble": e.bubble_fraction,
        "step_time_s": e.step_time_s,
        **_terms(e),
    }


def _explain(
    model: ModelConfig, cluster: Cluster, table: pd.DataFrame, best: dict[Any, Any] | None
) -> list[str]:
    """Why the plan chose `best` of the `table` it sorted: what was tried, what fits, the best layout's
    memory and step, why its tp and pp, and what fewer stages would have cost."""
    hw, world, fitting = cluster.hardware, cluster.gpus, table[table.fits]
    usable = hw.usable_memory * hw.memory_bytes / 1e9
    why = [
        f"{model.param_count() / 1e9:.1f} B parameters on {cluster.nodes} × {hw.devices_per_node} {hw.name}; "
        f"{len(table)} layouts tried, {len(fitting)} fit in {usable:.0f} GB per GPU "
        f"({hw.usable_memory:.0%} of {hw.memory_bytes / 1e9:.0f} GB)."
    ]
    if best is not None:
        grid = (
            f"tp {best['tp']} × pp {best['pp']}"
            + (f" × cp {best['cp']}" if best["cp"] > 1 else "")
            + (f" (ep {best['ep']} of dp)" if best["ep"] > 1 else "")
        )
        why.append(
            f"best: {grid} × dp {best['dp']}, ZeRO-{best['zero']}"
            f"{' with the optimizer offloaded to the host' if best['offload'] else ''}, "
            + (f"schedule {best['schedule']}, " if best["pp"] > 1 else "")
            + f"{best['microbatches']} microbatches — {best['memory_GB']:.1f} GB per GPU "
            f"({best['model_states_GB']:.1f} model states + {best['activations_GB']:.1f} activations), "
            f"bubble {best['bubble']:.1%}, about {best['step_time_s']:.1f} s per step."
        )
        why.append(
            f"tp {best['tp']}: tensor parallelism moves activations in every layer, so it stays inside a "
            f"node's {hw.devices_per_node} GPUs; pp {best['pp']}: of the layouts that fit, the one with the "
            f"shortest estimated step (fewer stages: less bubble, more memory); "
            + (
                f"dp {best['dp']} = {world} GPUs / ({grid})."
                if best["dp"] > 1
                else f"{grid} uses all {world} GPUs: no data parallelism is left."
            )
        )
        smaller = table[
            (table.tp == best["tp"]) & (table.pp < best["pp"]) & (table.zero == best["zero"])
        ]
        if len(smaller):
            s = smaller.sort_values("pp").iloc[-1]
            why.append(
                f"pp {s['pp']} would need {s['memory_GB']:.1f} GB per GPU: "
                + (
                    f"fits, but its step is estimated at {s['step_time_s']:.1f} s, not shorter"
                    if s["fits"]
                    else "does not fit"
                )
                + "."
            )
    else:
        why.append("no layout fits: add GPUs, recompute activations, or shard more (ZeRO).")
    return why
