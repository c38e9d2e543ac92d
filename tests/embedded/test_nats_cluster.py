"""``embedded.nats.NatsCluster``: three routed nodes, a meta leader, an R3 stream's leader found,
a node killed, paused and restarted with its store, nothing left behind."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats.js import JetStreamContext
from nats.js.api import StreamConfig, StreamInfo

from embedded import wait_for
from embedded.nats import NatsCluster


async def _info(js: JetStreamContext) -> StreamInfo:
    """The stream's info; a request that meets a cluster still settling after a restart (its
    routes, its leader) is asked again, for up to a minute."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return await js.stream_info("R3")
        except nats.errors.TimeoutError:
            if time.monotonic() > deadline:
                raise


async def _r3_stream(urls: list[str], publishes: int) -> int:
    nc = await nats.connect(urls, connect_timeout=5)
    try:
        js = nc.jetstream(timeout=10)
        try:
            await _info(js)
        except nats.js.errors.NotFoundError:
            await js.add_stream(StreamConfig(name="R3", subjects=["r3.>"], num_replicas=3))
        for i in range(publishes):
            await js.publish("r3.x", str(i).encode())
        info = await _info(js)
        return int(info.state.messages)
    finally:
        await nc.close()


@pytest.mark.slow
@pytest.mark.servers
def test_a_cluster_elects_leaders_and_survives_a_node_killed_paused_and_restarted() -> None:
    with NatsCluster(3) as nodes:
        assert len(set(nodes.urls)) == 3
        assert nodes.wait_for_meta_leader() in {"n1", "n2", "n3"}
        assert asyncio.run(_r3_stream(nodes.urls, 10)) == 10
        leader = nodes.wait_for_stream_leader("R3")
        nodes.kill(leader)
        wait_for(lambda: (new := nodes.stream_leader("R3")) is not None and new is not leader, timeout=30,
                 what="another leader")
        assert asyncio.run(_r3_stream([n.url for n in nodes.nodes if n.running], 5)) == 15
        leader.start()  # its store back: the stream is whole on every node again
        other = nodes.wait_for_stream_leader("R3")
        other.pause()
        assert other.monitor("jsz") is None  # a paused node answers nothing
        other.resume()
        nodes.restart(other)
        nodes.wait_for_stream_leader("R3")  # an election may follow the restart (under load, longer than 10 s)
        assert asyncio.run(_r3_stream(nodes.urls, 0)) == 15
        bases = [node.base for node in nodes.nodes]
    assert not any(base is not None and base.exists() for base in bases)
    assert not any(node.running for node in nodes.nodes)
