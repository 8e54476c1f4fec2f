"""What a failed communication operation says: `CommError` names this rank, the operation, its group and sequence
number (and its peer), so a stuck or broken job ends with a message that says where it stopped; a timeout adds
what it usually means. The traced layer (comm/traced.py, comm/handle.py, the rings) raises it from the backend's
own exception."""

from __future__ import annotations

from typing import Any


class CommError(RuntimeError):
    """A communication operation failed or timed out; the message says which rank and operation."""


def comm_error(rank: int, args: dict[str, Any], e: BaseException) -> CommError:
    """The error for operation `args` (its record's keys: op, label, group, group_ranks, seq ...) on `rank`."""
    op = f"{args['op']} {args['label']}" if args.get("label") else args["op"]
    where = f"{op} on group {args['group']} {args['group_ranks']}"
    if "seq" in args:
        where += f" (seq {args['seq']}, step {args['step']}, {args.get('bytes', 0)} bytes)"
    if "peer" in args:
        where += f" with peer rank {args['peer']}"
    hint = ""
    if "timed out" in str(e).lower() or "timeout" in type(e).__name__.lower():
        hint = (
            " — a peer did not reach this operation within the process-group timeout "
            "(RunConfig.timeout_s): it is stuck or slower than the timeout allows"
        )
    return CommError(f"rank {rank}: {where} failed{hint}: {type(e).__name__}: {e}")
