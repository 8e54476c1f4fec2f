"""Bus bandwidth, as nccl-tests defines it: how many bytes each rank puts on the wire for a collective.

For an operation on a buffer of S bytes over n ranks, a ring algorithm makes each rank send

    all_reduce              2(n−1)/n · S     (a reduce-scatter, then an all-gather)
    all_gather              (n−1)/n · S      (S is the gathered output)
    reduce_scatter          (n−1)/n · S      (S is the input)
    all_to_all              (n−1)/n · S      (S is the input: its n blocks go one to each rank)
    broadcast, send         S
    recv                    nothing (the matching send counts it)

algbw = S / t is what the caller sees; busbw = algbw × the factor above is comparable with the link's
bandwidth whatever n is. No torch: the traced communicator, the summary and the estimator share it.
"""

from __future__ import annotations

from typing import Any


def bus_factor(op: str, n: int) -> float:
    """Bytes each rank sends per byte of the operation's buffer (nccl-tests' bus-bandwidth factor)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "send", "recv"):
        return 1.0
    raise ValueError(
        f"op={op!r}: no bus-bandwidth factor; valid ops: all_reduce, all_gather, "
        f"reduce_scatter, all_to_all, broadcast, send, recv"
    )


def bandwidth(op: str, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for `nbytes` moved by `op` over `n` ranks in `seconds`."""
    if seconds <= 0 or n < 1:
        return 0.0, 0.0
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor(op, n)


def bytes_sent(args: dict[str, Any]) -> float:
    """Bytes this rank sends for one recorded operation (its trace args: op, bytes, group_ranks)."""
    op = args.get("op")
    if op == "recv" or op not in (
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
        "send",
    ):
        return 0.0
    return float(args.get("bytes", 0)) * bus_factor(op, len(args.get("group_ranks", ())) or 1)


def nbytes(t: Any) -> int:
    """Bytes of a tensor's elements."""
    return t.numel() * t.element_size()


def record(
    rec: Any,
    name: str,
    cat: str,
    args: dict[str, Any],
    n: int,
    *,
    start: float,
    end: float,
    blocking: bool,
) -> None:
    """An operation's record from its start to its completion (host clock, µs) with its bandwidth: a
    complete span for a blocking call, an async begin/end pair for one that ran beside other work."""
    algbw, busbw = bandwidth(args["op"], args["bytes"], (end - start) / 1e6, n)
    args.update(algbw_GBps=round(algbw, 4), busbw_GBps=round(busbw, 4))
    if blocking:
        rec.complete(name, cat, "comm", start, end - start, args=args)
        return
    args["in_flight_us"] = round(end - start, 3)
    rec.async_span(name, cat, "comm", start, end, args=args, local_id=rec.new_async_id())
