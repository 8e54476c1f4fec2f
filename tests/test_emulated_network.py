"""The emulated network (a teaching device: comm/emulated_link.py) and the hierarchical all-reduce.

On one machine every link is alike; the emulated links hold each message for latency + bytes/bandwidth
on the sending side, so the brief's "data parallelism is bandwidth-sensitive, pipeline parallelism
latency-sensitive" can be measured. Times here are compared as ratios of added time within one test run
(the machine's speed cancels); the held time itself is a sleep, so the differences are large."""

import pytest

from workbench import ConfigError, RunConfig
from workbench.comm.emulated_link import EmulatedNetwork, Link, parse_links

FOUR_LAYERS = {"layers": 4}
#: the bandwidth cut (5 MB/s) and the latency rise (5 ms) the two strategies are put through
LOW_BANDWIDTH, HIGH_LATENCY = "inter=0.005,10", "inter=100,5000"
#: dp=4 as 2 machines × 2 ranks, a slow link between them: the hierarchical all-reduce crosses it with a
#: quarter of the flat ring's steps' bytes (emulation and algorithm leave the results untouched)
TWO_BY_TWO = {
    "dp": 4,
    "ranks_per_node": 2,
    "bucket_mb": 0.03,
    "emulate_link": "inter=0.001,50;intra=2,5",
}


def test_links_parse_and_time_like_the_ring():
    links = parse_links("inter=12.5,5; intra=100,1")
    assert links == {"inter": Link(12.5, 5.0), "intra": Link(100.0, 1.0)}
    net = EmulatedNetwork(links=links, ranks_per_node=2)
    assert net.message_seconds(0, 1, 10**6) == ("intra", pytest.approx(1e-6 + 1e-5))
    assert net.message_seconds(1, 2, 10**6) == ("inter", pytest.approx(5e-6 + 8e-5))
    # a ring all-reduce over 4 ranks on 2 machines: 2(n−1) = 6 steps of S/4 on the slow link
    assert net.collective_seconds("all_reduce", 4 * 10**6, [0, 1, 2, 3])[1] == pytest.approx(
        6 * (5e-6 + 8e-5)
    )
    assert net.collective_seconds("all_gather", 4 * 10**6, [0, 1])[1] == pytest.approx(1e-6 + 2e-5)
    for bad in ("inter=fast", "outer=1,1", "inter=0,1", ""):
        with pytest.raises(ValueError, match="inter=BW_GBps"):
            parse_links(bad)
    with pytest.raises(ConfigError, match="ranks_per_node=3"):
        RunConfig(dp=4, ranks_per_node=3).validate()
    # dp group [0, 2, 4] on machines {0, 1, 2}, {3, 4, 5}
    with pytest.raises(ConfigError, match="unevenly"):
        RunConfig(dp=3, tp=2, global_batch=6, allreduce="hierarchical", ranks_per_node=3).validate()


def test_the_machines_take_their_ranks_in_blocks_or_round_robin():
    """tp 2 × pp 2 on 2 machines of 2: in blocks (torchrun's numbering) each tp pair shares a machine and the
    pipeline crosses the link; round-robin puts each tp pair across it and the pipeline inside (notebook 05)."""
    links = parse_links("inter=0.02,500")
    block = EmulatedNetwork(links=links, ranks_per_node=2, placement="block", world_size=4)
    spread = EmulatedNetwork(links=links, ranks_per_node=2, placement="round-robin", world_size=4)
    assert [block.node(r) for r in range(4)] == [0, 0, 1, 1] and [
        spread.node(r) for r in range(4)
    ] == [0, 1, 0, 1]
    # tp pair inside, pp across
    assert block.link([0, 1])[0] == "intra" and block.link([0, 2])[0] == "inter"
    # tp pair across, pp inside
    assert spread.link([0, 1])[0] == "inter" and spread.link([0, 2])[0] == "intra"
    with pytest.raises(ConfigError, match="node_placement='diagonal': valid values are"):
        RunConfig(tp=2, pp=2, node_placement="diagonal").validate()
    with pytest.raises(ConfigError, match="needs emulate_link and ranks_per_node"):
        RunConfig(tp=2, pp=2, node_placement="round-robin").validate()
    with pytest.raises(ValueError, match="split world_size=4 evenly"):
        EmulatedNetwork(links=links, ranks_per_node=3, placement="round-robin", world_size=4)
    from workbench.predict.estimator import estimate

    spread_cfg = RunConfig(
        tp=2, pp=2, emulate_link="inter=0.02,500", ranks_per_node=2, node_placement="round-robin"
    )
    with pytest.raises(ConfigError, match="node_placement='round-robin' is not modelled"):
        estimate(spread_cfg)


@pytest.mark.slow  # notebook 09 checks the same under the same link in make test
def test_hierarchical_beats_the_flat_ring_on_a_slow_inter_link(launched):
    """Flat ring: every one of its 2(n−1) steps waits for the pair that crosses machines. Hierarchical:
    only the inter-machine all-reduce of S/K crosses, in 2(m−1) steps. Both equal one process
    (tests/test_data_parallel.py runs the hierarchical one against it)."""
    flat = launched(allreduce="ring", **TWO_BY_TWO)
    hier = launched(allreduce="hierarchical", **TWO_BY_TWO)
    assert list(flat.metrics.loss) == pytest.approx(list(hier.metrics.loss), rel=1e-5)
    t_flat, t_hier = (r.summary["ranks"][0]["step_time_s"] for r in (flat, hier))
    assert t_flat > 1.5 * t_hier, (t_flat, t_hier)
    groups = {g for g in hier.events.get("group", []) if isinstance(g, str)}
    assert {"dp_intra", "dp_inter"} <= groups, "the trace shows the intra and inter groups"
    emulated = hier.events[hier.events.cat == "emulated"]
    assert not emulated.empty and set(emulated.link) >= {"inter", "intra"}, (
        "held time is marked emulated"
    )


@pytest.mark.slow  # make test checks the same four relations on the same links in notebook 09's sweep
def test_dp_is_bandwidth_bound_and_pp_latency_bound(launched):
    """Each strategy on two emulated machines, its step time with the link as fast as this machine, with
    the bandwidth cut and with the latency raised. DP moves 4Ψ of gradients in a few all-reduces per step;
    PP moves small activations in 2m = 16 transfers per step, each on the critical path."""
    added = {}
    for name, base in (("dp", {"dp": 2}), ("pp", {"pp": 2, "microbatches": 8})):
        # the fastest step after the first: other work on this machine only adds time (at times several
        # times a PP step), while the link's held time is in every step
        times = {
            link: launched(model=FOUR_LAYERS, ranks_per_node=1, emulate_link=link, **base)
            .metrics.step_time_s.iloc[1:]
            .min()
            for link in (None, LOW_BANDWIDTH, HIGH_LATENCY)
        }
        added[name] = {
            "bandwidth": times[LOW_BANDWIDTH] - times[None],
            "latency": times[HIGH_LATENCY] - times[None],
        }
    assert added["dp"]["bandwidth"] > 3 * added["pp"]["bandwidth"], added
    assert added["pp"]["latency"] > 2 * added["dp"]["latency"], added
    assert added["dp"]["bandwidth"] > added["dp"]["latency"], added
    assert added["pp"]["latency"] > added["pp"]["bandwidth"], added


def test_the_estimator_knows_how_gradients_travel():
    """Compression halves the dp bytes, 1-bit Adam sends ~1/32 after its warm-up, and the hierarchical
    all-reduce moves 1/K of the flat ring's bytes across machines; emulated links slow the hardware."""
    from workbench.predict.estimator import A100_80GB, estimate, with_emulated_links

    base = RunConfig(dp=4, ranks_per_node=2)
    plain = estimate(base).comm_bytes_per_step["dp"]
    assert estimate(base.replace(grad_compression="bf16")).comm_bytes_per_step[
        "dp"
    ] == pytest.approx(plain / 2)
    onebit = estimate(base.replace(optimizer="onebit-adam"))
    assert onebit.dp_bytes_warmup == pytest.approx(plain)
    assert onebit.comm_bytes_per_step["dp"] == pytest.approx(plain / 32, rel=0.05)
    flat, hier = (
        estimate(base.replace(allreduce="ring")),
        estimate(base.replace(allreduce="hierarchical")),
    )
    assert flat.dp_link_bytes["inter"] == pytest.approx(plain)
    s = plain / 1.5  # the all-reduce's S: plain = 2(n−1)/n · S with n = 4
    # K = 2 ranks, m = 2 machines
    assert hier.dp_link_bytes == pytest.approx({"intra": s, "inter": s / 2})
    slow = with_emulated_links(A100_80GB, base.replace(emulate_link="inter=0.001,100"))
    assert (
        slow.inter_node_bw < 1e6
        and slow.extra_latency_s == pytest.approx(1e-4)
        and slow.devices_per_node == 2
    )
    t_flat = estimate(
        base.replace(allreduce="ring", emulate_link="inter=0.001,100"), hardware=slow
    ).step_time_s
    t_hier = estimate(
        base.replace(allreduce="hierarchical", emulate_link="inter=0.001,100"), hardware=slow
    ).step_time_s
    assert t_flat > 1.5 * t_hier
