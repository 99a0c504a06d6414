"""The scheduler actor's output socket, without Ray: frames arrive whole and in order,
also when the reader falls behind; only routed outputs go; a closed socket is reported."""
from __future__ import annotations

import asyncio
import threading

from tandem.actors import output_channel
from tandem.actors.output_channel import OutputChannels
from tandem.actors.wire import Rebuilder, from_wire
from tandem.outputs import RequestOutput, Usage


def _output(rid: str, i: int, last: bool, text: str) -> RequestOutput:
    return RequestOutput(rid, "prompt", [5, 6], text * (i + 1), list(range(i + 1)), text, [i], last,
                         "length" if last else None, None, Usage(2, i + 1))


def test_frames_arrive_whole_and_in_order_while_the_reader_lags_and_only_routed_outputs_go():
    closed: list[str] = []

    async def on_closed(sid):
        closed.append(sid)

    async def run():
        channels = OutputChannels(on_closed)
        channels.start(asyncio.get_running_loop())
        try:
            reader, writer = await output_channel.connect(channels.path, "sub-1")
            assert channels.has("sub-1")
            routes = {"a": "sub-1", "b": "sub-1", "c": "elsewhere"}
            ticks = 300
            big = "x" * 20_000  # 300 ticks of 2 x 20 kB: more than the socket buffers hold unread
            returned = []

            def step_thread():
                for i in range(ticks):
                    last = i == ticks - 1
                    outs = [_output(r, i, last, big if r == "a" else "y") for r in ("a", "b", "c")]
                    returned.extend(channels.send(outs, routes))

            await asyncio.to_thread(step_thread)  # all written before anything is read
            got = {"a": [], "b": []}
            rebuild = {"a": Rebuilder(), "b": Rebuilder()}
            n = 0
            async for item in output_channel.frames(reader):
                n += 1
                for wire in item:
                    out = from_wire(wire)
                    got[out.request_id].append(rebuild[out.request_id](out))
                if n == ticks:
                    break
            writer.close()
            for _ in range(100):  # the actor side sees the end
                if closed:
                    break
                await asyncio.sleep(0.01)
            return got, returned, routes
        finally:
            channels.close()

    got, returned, routes = asyncio.run(run())
    for rid, text in (("a", "x" * 20_000), ("b", "y")):
        outs = got[rid]
        assert [o.delta_token_ids for o in outs] == [[i] for i in range(300)]
        assert outs[-1].finished and outs[-1].text == text * 300 and outs[-2].text == text * 299  # rebuilt whole
    assert [o.request_id for o in returned] == ["c"] * 300  # not routed here: handed back
    assert routes == {"c": "elsewhere"}  # finished requests' routes are dropped
    assert closed == ["sub-1"]


def test_a_subscriber_that_never_connected_gets_nothing_and_sends_never_block():
    async def run():
        channels = OutputChannels(lambda sid: asyncio.sleep(0))
        channels.start(asyncio.get_running_loop())
        try:
            outs = [_output("a", 0, False, "t")]
            return channels.send(outs, {"a": "sub-x"}), outs
        finally:
            channels.close()

    returned, outs = asyncio.run(run())
    assert returned == outs


def test_sends_from_two_threads_keep_each_frame_whole():
    async def run():
        channels = OutputChannels(lambda sid: asyncio.sleep(0))
        channels.start(asyncio.get_running_loop())
        try:
            reader, writer = await output_channel.connect(channels.path, "s")
            routes = {f"r{t}": "s" for t in range(2)}

            def sender(t):
                for i in range(200):
                    channels.send([_output(f"r{t}", i, False, "z" * 5000)], routes)

            threads = [threading.Thread(target=sender, args=(t,)) for t in range(2)]
            await asyncio.to_thread(lambda: ([th.start() for th in threads], [th.join() for th in threads]))
            seen = {"r0": [], "r1": []}
            async for item in output_channel.frames(reader):
                for wire in item:
                    seen[wire[0]].append(from_wire(wire).delta_token_ids[0])
                if sum(map(len, seen.values())) == 400:
                    break
            writer.close()
            return seen
        finally:
            channels.close()

    seen = asyncio.run(run())
    assert seen == {"r0": list(range(200)), "r1": list(range(200))}
