"""The notebook runner's stall, reproduced: a reply that arrives while the client sends on the same
socket must be read at once, not when the wait's timeout expires (the fix: scripts/nbclient_poll.py,
installed by the root conftest.py)."""

from __future__ import annotations

import asyncio
import time
from queue import Empty

import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session


async def _reply_during_a_send(timeout: float, reply: bool = True) -> float:
    """A kernel-like ROUTER answers the client's request; just after the answer has arrived, the client
    sends again on its socket (as nbclient's Output-widget stand-in does) while it waits for the answer.
    Returns the seconds the wait took after that send; raises Empty if nothing came."""
    server = zmq.Context.instance().socket(zmq.ROUTER)
    client = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    try:
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client.connect(f"tcp://127.0.0.1:{port}")
        session = Session(key=b"")
        channel = AsyncZMQSocketChannel(client, session)
        channel.send(session.msg("kernel_info_request"))
        request = server.recv_multipart()
        waiting = asyncio.ensure_future(channel.get_msg(timeout=timeout))
        await asyncio.sleep(0.1)  # the client is now polling its socket
        if reply:
            server.send_multipart(request)
        time.sleep(0.1)  # the reply is in the client's socket; the loop has not run yet
        channel.send(session.msg("comm_msg"))  # this send consumes the socket's readiness edge
        start = time.monotonic()
        await waiting
        return time.monotonic() - start
    finally:
        client.close(linger=0)
        server.close(linger=0)


def test_a_reply_that_arrives_during_a_send_is_read_at_once():
    # unpatched, the wait lasts the whole timeout (4.8 s here); sliced polling reads it within 0.25 s
    assert asyncio.run(_reply_during_a_send(timeout=5.0)) < 1.5


def test_no_reply_still_times_out():
    start = time.monotonic()
    try:
        asyncio.run(_reply_during_a_send(timeout=0.5, reply=False))
    except Empty:
        assert 0.3 < time.monotonic() - start < 2.0
    else:
        raise AssertionError("get_msg returned without a message")
