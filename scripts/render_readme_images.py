"""Render the README's pictures from real runs (needs `pip install kaleido` and a Chromium/Chrome).

python scripts/render_readme_images.py      # writes docs/images/*.png
"""

import os

import workbench as wb
from workbench import viz

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = os.path.join(HERE, "..", "docs", "images")
RUNS = os.path.join(HERE, "..", "traces", "readme")


def main() -> None:
    os.makedirs(IMAGES, exist_ok=True)
    dp2 = wb.launch(wb.RunConfig(dp=2, steps=10, bucket_mb=0.03), out=os.path.join(RUNS, "dp2"))
    ring = wb.launch(
        wb.RunConfig(dp=4, steps=4, allreduce="ring", bucket_mb=0.05),
        out=os.path.join(RUNS, "ring4"),
    )
    viz.timeline(
        dp2, steps=[9], title="2 ranks: bucket all-reduces in flight while backward runs"
    ).write_image(os.path.join(IMAGES, "timeline.png"), width=1000, height=420)
    fig = viz.ring_steps(ring)
    active = fig.layout.sliders[0].steps[2]
    fig.update_layout(active.args[1])
    for trace, visible in zip(fig.data, active.args[0]["visible"], strict=True):
        trace.visible = visible
    fig.layout.sliders[0].active = 2
    fig.write_image(os.path.join(IMAGES, "ring.png"), width=640, height=420)
    viz.memory_breakdown(dp2).write_image(os.path.join(IMAGES, "memory.png"), width=640, height=380)
    llama_validation()
    cluster_timeline()


def cluster_timeline() -> None:
    """docs/guide/launchers.md's picture: dp 4 on a cluster on this machine (2 nodes × 2 ranks, 1 Gbit/s links),
    the gradient buckets' all-reduces in flight across the link while backward runs (needs root)."""
    config = wb.RunConfig(
        model={"base": "small", "seq_len": 32}, dp=4, steps=4, global_batch=32, bucket_mb=1.0
    )
    with wb.cluster("readme", nodes=2, ranks_per_node=2, rate_mbit=1000) as c:
        run = wb.launch(config, out=os.path.join(RUNS, "cluster"), force=True, cluster=c)
    viz.timeline(
        run,
        steps=[3],
        title="dp 4 on a cluster on one machine: 2 nodes (network namespaces) × 2 ranks,<br>1 Gbit/s "
        "links (tc tbf): each bucket's all-reduce crosses the link while backward runs",
    ).write_image(os.path.join(IMAGES, "cluster_timeline.png"), width=1000, height=560)


#: the Llama run of docs/guide/models-and-data.md: small-llama on docs/architecture.md's bytes, last 10 % held out
LLAMA_RUN = {
    "model": {"base": "small-llama", "vocab_size": 256},
    "data": "text:docs/architecture.md",
    "dp": 2,
    "steps": 200,
    "lr": 1e-3,
    "lr_schedule": "cosine",
    "warmup_steps": 20,
    "weight_decay": 0.1,
    "adam_beta2": 0.95,
    "eval_every": 20,
    "checkpoint_every": 200,
}


def llama_validation() -> None:
    run = wb.launch(wb.RunConfig(**LLAMA_RUN), out=os.path.join(RUNS, "llama"), force=True)
    fig = viz.loss_curves({"small-llama, dp 2": run})
    fig.update_layout(
        title="small-llama on docs/architecture.md: training loss and held-out loss (its last 10 %)"
    )
    fig.write_image(os.path.join(IMAGES, "llama_validation.png"), width=900, height=400)
    print(wb.sample(run.path, prompt="The workbench ", tokens=120, temperature=0.8, top_k=40).text)


if __name__ == "__main__":
    import sys

    llama_validation() if sys.argv[1:] == ["llama"] else main()
