"""A fix for a stall in jupyter_client's async channels, for anything that executes the notebooks with
nbclient: pytest --nbmake (conftest.py imports this) and `make docs` (scripts/executed_notebooks.py).

nbclient waits for a cell's reply with `AsyncZMQSocketChannel.get_msg(timeout)` — one `socket.poll(timeout)`
on the shell socket. nbclient also *sends* on that socket while it waits: its stand-in for an ipywidgets
`Output` widget (the one `widgets.interact` and our explorers draw into) syncs the widget's state back to
the kernel with a `comm_msg` on the shell channel each time the cell writes into it. A send on a ZeroMQ
socket processes the socket's pending commands, which consumes the edge-triggered readiness of its file
descriptor: when the cell's reply arrived just before that send, the event loop is never woken for it,
and the poll only finds the reply when its timeout expires (nbmake's 300 s), then goes on as if nothing
happened (tests/test_notebook_channel.py reproduces it).

The fix: poll in short slices, so a reply that is already there is read within a quarter of a second.
"""

from __future__ import annotations

import time
from queue import Empty

from jupyter_client.channels import AsyncZMQSocketChannel

#: the longest a message that has arrived can wait unread (seconds)
POLL_SLICE_S = 0.25


async def _get_msg_polling_in_slices(
    self: AsyncZMQSocketChannel, timeout: float | None = None
) -> dict:
    """`AsyncZMQSocketChannel.get_msg` with the same contract (Empty after `timeout` seconds; None
    waits for ever), polling at most POLL_SLICE_S at a time."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait_s = (
            POLL_SLICE_S
            if deadline is None
            else min(POLL_SLICE_S, max(0.0, deadline - time.monotonic()))
        )
        if await self.socket.poll(int(1000 * wait_s)):
            return await self._recv()
        if deadline is not None and time.monotonic() >= deadline:
            raise Empty


def install() -> None:
    """Make every AsyncZMQSocketChannel poll in slices (idempotent)."""
    AsyncZMQSocketChannel.get_msg = _get_msg_polling_in_slices
