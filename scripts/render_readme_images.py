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
    ring = wb.launch(wb.RunConfig(dp=4, steps=4, allreduce="ring", bucket_mb=0.05), out=os.path.join(RUNS, "ring4"))
    viz.timeline(dp2, steps=[9], title="2 ranks: bucket all-reduces in flight while backward runs").write_image(
        os.path.join(IMAGES, "timeline.png"), width=1000, height=420)
    fig = viz.ring_steps(ring)
    active = fig.layout.sliders[0].steps[2]
    fig.update_layout(active.args[1])
    for trace, visible in zip(fig.data, active.args[0]["visible"], strict=True):
        trace.visible = visible
    fig.layout.sliders[0].active = 2
    fig.write_image(os.path.join(IMAGES, "ring.png"), width=640, height=420)
    viz.memory_breakdown(dp2).write_image(os.path.join(IMAGES, "memory.png"), width=640, height=380)


if __name__ == "__main__":
    main()
