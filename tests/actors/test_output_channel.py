"""The scheduler actor's socket, without Ray: output frames arrive whole and in order,
also when the reader falls behind; only routed outputs go; submissions come back with
each request's error; a closed socket is reported."""
from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager

from polling import until
from tandem.actors import output_channel
from tandem.actors.output_channel import OUTPUTS, SUBMIT, SUBMITTED, OutputChannels, frame
from tandem.actors.wire import Rebuilder, from_wire
from tandem.errors import InvalidRequestError
from tandem.intake import Admission, Request
from tandem.outputs import RequestOutput, Usage


def _output(rid: str, i: int, last: bool, text: str) -> RequestOutput:
    return RequestOutput(rid, "prompt", [5, 6], text * (i + 1), list(range(i + 1)), text, [i], last,
                         "length" if last else None, None, Usage(2, i + 1))


async def _no_submissions(requests, subscriber):
    raise AssertionError("no submissions in this test")


async def _nothing(subscriber):
    pass


@asynccontextmanager
async def _connected(subscriber: str, on_submit=_no_submissions, on_closed=_nothing):
    """A listening OutputChannels and a subscriber connected to it: (channels, reader, writer)."""
    channels = OutputChannels(on_submit, on_closed)
    channels.start(asyncio.get_running_loop())
    try:
        reader, writer = await output_channel.connect(channels.path, subscriber)
        yield channels, reader, writer
    finally:
        channels.close()


def test_frames_arrive_whole_and_in_order_while_the_reader_lags_and_only_routed_outputs_go():
    closed: list[str] = []

    async def on_closed(sid):
        closed.append(sid)

    async def run():
        async with _connected("sub-1", on_closed=on_closed) as (channels, reader, writer):
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
            async for kind, item in output_channel.frames(reader):
                assert kind == OUTPUTS
                n += 1
                for wire in item:
                    out = from_wire(wire)
                    got[out.request_id].append(rebuild[out.request_id](out))
                if n == ticks:
                    break
            writer.close()
            await until(lambda: closed, 30, "the actor side to see the socket closed")
            return got, returned, routes

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
        channels = OutputChannels(_no_submissions, _nothing)
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
        async with _connected("s") as (channels, reader, writer):
            routes = {f"r{t}": "s" for t in range(2)}

            def sender(t):
                for i in range(200):
                    channels.send([_output(f"r{t}", i, False, "z" * 5000)], routes)

            threads = [threading.Thread(target=sender, args=(t,)) for t in range(2)]
            await asyncio.to_thread(lambda: ([th.start() for th in threads], [th.join() for th in threads]))
            seen = {"r0": [], "r1": []}
            async for _, item in output_channel.frames(reader):
                for wire in item:
                    seen[wire[0]].append(from_wire(wire).delta_token_ids[0])
                if sum(map(len, seen.values())) == 400:
                    break
            writer.close()
            return seen

    seen = asyncio.run(run())
    assert seen == {"r0": list(range(200)), "r1": list(range(200))}


def test_where_no_socket_can_be_bound_there_is_no_path_and_outputs_are_handed_back(tmp_path, monkeypatch):
    import tempfile

    deep = tmp_path / ("d" * 120)  # longer than a Unix socket's path may be
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))

    async def run():
        channels = OutputChannels(_no_submissions, _nothing)
        channels.start(asyncio.get_running_loop())
        outs = [_output("a", 0, False, "t")]
        try:
            return channels.path, channels.send(outs, {"a": "sub"}), outs
        finally:
            channels.close()

    path, returned, outs = asyncio.run(run())
    assert path is None and returned == outs
    assert list(deep.iterdir()) == []  # nothing left behind


class _Unpicklable(Exception):
    def __reduce__(self):
        raise TypeError("not picklable")


def test_submissions_start_in_order_and_each_is_answered_when_done_with_each_requests_error():
    seen = []

    async def on_submit(requests, subscriber):
        seen.append((subscriber, [r.request_id for r in requests]))
        # the first batch waits long for the engine: the second must not wait behind it
        await asyncio.sleep(0.3 if requests[0].request_id == "r1" else 0.01)
        return [Admission(r.request_id) if r.prompt else Admission(error=InvalidRequestError("prompt", "must not be empty"))
                for r in requests[:-1]] + [Admission(error=_Unpicklable("x"))]

    async def run():
        async with _connected("sub-9", on_submit) as (_, reader, writer):
            writer.write(frame(SUBMIT, (0, [Request("hi", None, "r1"), Request("", None, "r2"), Request("yo", None, "r3")])))
            writer.write(frame(SUBMIT, (1, [Request("again", None, "r4"), Request("x", None, "r5")])))
            replies = []
            async for kind, payload in output_channel.frames(reader):
                assert kind == SUBMITTED
                replies.append(payload)
                if len(replies) == 2:
                    break
            writer.close()
            return replies

    replies = asyncio.run(run())
    assert seen == [("sub-9", ["r1", "r2", "r3"]), ("sub-9", ["r4", "r5"])]  # routes open in order
    (b1, e1), (b0, e0) = replies  # the quick one first
    assert (b0, b1) == (0, 1)
    assert e0[0] == Admission("r1") and isinstance(e0[1].error, InvalidRequestError) and e0[1].error.field == "prompt"
    assert isinstance(e0[2].error, RuntimeError) and "_Unpicklable" in str(e0[2].error)  # its text, not a broken channel
    assert e1[0] == Admission("r4") and isinstance(e1[1].error, RuntimeError)


def test_a_submission_that_raises_fails_its_own_requests_and_the_channel_goes_on():
    async def on_submit(requests, subscriber):
        if requests[0].request_id == "bad":
            raise InvalidRequestError("params", "broken on purpose")
        return [Admission(r.request_id) for r in requests]

    async def run():
        async with _connected("sub-3", on_submit) as (_, reader, writer):
            writer.write(frame(SUBMIT, (0, [Request("a", None, "bad"), Request("b", None, "b2")])))
            writer.write(frame(SUBMIT, (1, [Request("c", None, "ok")])))
            replies = {}
            async for kind, payload in output_channel.frames(reader):
                replies[payload[0]] = payload[1]
                if len(replies) == 2:
                    break
            writer.close()
            return replies

    replies = asyncio.run(run())
    assert [type(a.error).__name__ for a in replies[0]] == ["InvalidRequestError", "InvalidRequestError"]
    assert replies[0][0].error.field == "params" and replies[1] == [Admission("ok")]


def test_a_subscriber_that_stops_reading_is_cut_off_and_its_requests_aborted(monkeypatch):
    """Its backlog would otherwise grow in the engine's memory without bound."""
    monkeypatch.setattr(output_channel, "MAX_PENDING_BYTES", 256 << 10)
    closed: list[str] = []

    async def on_closed(sid):
        closed.append(sid)

    async def run():
        async with _connected("stuck", on_closed=on_closed) as (channels, reader, writer):
            writer.transport.pause_reading()  # as a subscriber whose event loop hangs
            routes = {"a": "stuck"}

            delta = "w" * 10_000

            def step_thread():  # never waits, though nobody reads
                for i in range(2000):  # 20 MB: more than the socket buffers (up to 8 MB a side) and the cap
                    channels.send([RequestOutput("a", "p", [1], "", [], delta, [i], False, None, None, Usage(1, i))],
                                  routes)

            t0 = asyncio.get_running_loop().time()
            await asyncio.to_thread(step_thread)
            took = asyncio.get_running_loop().time() - t0
            await until(lambda: closed, 30, "the actor side to drop the subscriber that reads nothing")
            still = channels.has("stuck")
            writer.close()
            return took, still

    took, still = asyncio.run(run())
    assert closed == ["stuck"] and not still
    assert took < 10, took


def test_a_report_broadcast_reaches_every_subscriber_between_its_outputs():
    async def run():
        async with _connected("s1") as (channels, reader1, writer1):
            reader2, writer2 = await output_channel.connect(channels.path, "s2")
            await until(lambda: channels.has("s2"), 10, "the second subscriber")
            channels.send([_output("a", 0, False, "x")], {"a": "s1"})
            channels.broadcast(output_channel.REPORT, {"load_tokens": 7})
            kinds1 = [k async for k, _ in _first(output_channel.frames(reader1), 2)]
            (report,) = [p async for _, p in _first(output_channel.frames(reader2), 1)]
            writer1.close()
            writer2.close()
            return kinds1, report

    kinds1, report = asyncio.run(run())
    assert kinds1 == [OUTPUTS, output_channel.REPORT] and report == {"load_tokens": 7}


async def _first(frames, n: int):
    async for item in frames:
        yield item
        n -= 1
        if n == 0:
            return
