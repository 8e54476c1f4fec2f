"""Communication on a real wire: studies/wire.py's sweeps on local clusters (needs root), with their spread.

    python benchmarks/cluster_wire.py                          # everything, ≈ 10 minutes on 2 cores
    python benchmarks/cluster_wire.py --only fit,dp --repeats 2

Prints:
1. fit: α and β across the link at each rate (2 nodes × 1 rank): 2-rank all-reduces of 1 KB to 32 token
   buckets, each size's median (min–max), the fitted β against the tbf rate, the bytes the shaper charged
   per byte of payload (headers);
2. dp: DP's gradient all-reduce (`small` with 2 layers, 7.4 MB, one bucket) against the rate, unshaped
   last: measured (median of the repeats' medians, min–max over every step) beside bytes on the wire /
   rate + α;
3. hier: the flat ring over the hierarchical all-reduce (2 nodes × 2 ranks) at each of --hier-rates: the
   ratio with a 95 % bootstrap interval over the interleaved repeats, beside the formula's (per node link:
   1.5), and the bytes out of node 0 beside the formula's;
4. place: dp 2 × tp 2 with each tp group across the link against inside a node: the step's ratio with
   its interval, each group's communication, the bytes on the wire.

Latency is the kernel's, not shaped (no netem): α is what the veth pair, the bridge, gloo and the
scheduler of a shared machine cost. Clusters are named a* and removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import pandas as pd

import workbench as wb
from workbench.analysis.intervals import ratio
from workbench.launching.local_cluster import LocalCluster, require_root
from workbench.predict.formulas import node_link_bytes
from workbench.studies import wire

MODEL = {"base": "small", "layers": 2}


def _range(values: list[float], scale: float = 1e3) -> str:
    return (
        f"{scale * statistics.median(values):8.2f} ({scale * min(values):.2f}–"
        f"{scale * max(values):.2f})"
    )


def fit(rates: list[float], repeats: int) -> None:
    print("\n== α and β across the link (2-rank all-reduce, 2 nodes × 1 rank) ==")
    with LocalCluster(name="abfit", nodes=2, ranks_per_node=1, rate_mbit=rates[0]) as c:
        for rate in rates:
            c.set_rate(rate)
            for i in range(repeats):
                f = wire.link_fit(c)
                print(
                    f"{rate:6.0f} Mbit/s #{i}: α = {1e6 * f.alpha_s:7.0f} µs   β = "
                    f"{f.beta_Bps * 8 / 1e6:7.1f} Mbit/s of payload = {f.beta_over_rate:.3f} × rate"
                    f"   wire bytes per payload byte {f.wire_factor:.4f}   β × that / rate = "
                    f"{f.beta_over_rate * f.wire_factor:.3f}"
                )
                for size, ts in sorted(f.times.seconds.items()):
                    print(
                        f"      {size:>10} B  {_range(ts)} ms   fit {1e3 * f.seconds(size):8.2f} ms"
                    )


def dp(rates: list[float | None], repeats: int, out: str) -> None:
    print("\n== DP's gradient all-reduce against the link rate (dp 2, 2 nodes × 1 rank) ==")
    config = wb.RunConfig(model=MODEL, dp=2, global_batch=8, steps=6, seed=0, timeout_s=120)
    with LocalCluster(name="abdp", nodes=2, ranks_per_node=1, rate_mbit=1000) as c:
        df = wire.dp_against_rate(c, rates, config, out=out, repeats=repeats)
    print(df.round(4).to_string(index=False))
    for rate, d in df.groupby("rate (Mbit/s)", dropna=False):
        errors = d["error"].dropna().tolist() if "error" in d else []
        spread = f"error {min(errors):+.1%} … {max(errors):+.1%}" if errors else "(unshaped)"
        fastest, slowest = d["fastest step's all-reduce (ms)"].min(), d["slowest (ms)"].max()
        print(
            f"{rate!s:>7} Mbit/s: measured {statistics.median(d['measured all-reduce (ms)']):7.2f} ms "
            f"(steps {fastest:.2f}–{slowest:.2f}), {spread} over {len(d)} runs"
        )


def hier(rates: list[float], repeats: int, out: str) -> None:
    print("\n== the flat ring against the hierarchical all-reduce (dp 4, 2 nodes × 2 ranks) ==")
    formula = node_link_bytes(1.0, 4, 2, False) / node_link_bytes(1.0, 4, 2, True)
    config = wb.RunConfig(model=MODEL, dp=4, global_batch=8, steps=5, seed=0, timeout_s=120)
    with LocalCluster(name="abhier", nodes=2, ranks_per_node=2, rate_mbit=rates[0]) as c:
        for rate in rates:
            c.set_rate(rate)
            df = wire.allreduce_schemes(
                c, config, out=os.path.join(out, f"hier-{rate}"), repeats=repeats
            )
            t = df.pivot(index="repeat", columns="scheme", values="measured all-reduce (ms)")
            b = df.pivot(index="repeat", columns="scheme", values="bytes out of node 0 (shaper)")
            f = df.groupby("scheme")["formula's bytes per node link"].first()
            print(
                f"{rate:6.0f} Mbit/s: ring {_range(t.ring.tolist(), 1)} ms, hierarchical "
                f"{_range(t.hierarchical.tolist(), 1)} ms; ring / hierarchical = "
                f"{ratio(t.ring.tolist(), t.hierarchical.tolist())}; formula {formula:.2f} (a link per "
                f"rank: {(3 / 2) / (1 / 2):.0f})"
            )
            print(
                f"       bytes out of node 0 a step: ring {b.ring.median():,.0f} (formula "
                f"{f.ring:,.0f}), hierarchical {b.hierarchical.median():,.0f} (formula "
                f"{f.hierarchical:,.0f}); ratio {b.ring.median() / b.hierarchical.median():.4f}"
            )


def place(rates: list[float], repeats: int, out: str) -> None:
    print("\n== tp inside a node against tp across the link (dp 2 × tp 2, 2 nodes × 2 ranks) ==")
    config = wb.RunConfig(model=MODEL, dp=2, tp=2, global_batch=32, steps=5, seed=0, timeout_s=120)
    with LocalCluster(name="abplace", nodes=2, ranks_per_node=2, rate_mbit=rates[0]) as c:
        for rate in rates:
            c.set_rate(rate)
            df = wire.placements(c, config, out=os.path.join(out, f"place-{rate}"), repeats=repeats)
            print(f"{rate:6.0f} Mbit/s:")
            print(df.groupby("tp group").median(numeric_only=True).drop(columns="repeat").round(1))
            s = df.pivot(index="repeat", columns="placement", values="step (ms)")
            print(
                f"       step, tp across / tp inside: "
                f"{ratio(s['round-robin'].tolist(), s['block'].tolist())}"
            )


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", default="fit,dp,hier,place", help="which parts, comma-separated")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fit-rates", default="200,500,1000,2000")
    p.add_argument("--dp-rates", default="200,500,1000,2000,5000,none")
    p.add_argument("--hier-rates", default="200,1000")
    p.add_argument("--place-rates", default="200,1000")
    args = p.parse_args()
    require_root()
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)

    def rates(text: str) -> list:
        return [None if r == "none" else float(r) for r in text.split(",")]

    parts = set(args.only.split(","))
    print(
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}: timings on a shared machine"
    )
    with tempfile.TemporaryDirectory(prefix="wb-cluster-wire-") as out:
        if "fit" in parts:
            fit(rates(args.fit_rates), args.repeats)
        if "dp" in parts:
            dp(rates(args.dp_rates), args.repeats, out)
        if "hier" in parts:
            hier(rates(args.hier_rates), max(args.repeats, 2), out)
        if "place" in parts:
            place(rates(args.place_rates), max(args.repeats, 2), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
