"""The Python handle API: generate / stream (blocking and asyncio), chat, errors, and a
handle used from another Ray task; on the tiny random-weight model (the handle's
plumbing is the point: every text is checked against the same engine's own)."""
from __future__ import annotations

import asyncio
import sys
import time

import pytest

from polling import until, wait_for
from tandem.errors import InvalidRequestError

from .conftest import TINY_ENGINE_NAME


@pytest.fixture(params=[True, False], ids=["socket", "ray-stream"])
def direct(request) -> bool:
    """A multiplexed handle's outputs over the actor's socket (on its node), or over a Ray stream."""
    return request.param


def test_stream_deltas_join_into_the_generated_text(tiny):
    full = tiny.generate("The capital of France is", max_tokens=16, temperature=0.0)
    outs = list(tiny.stream("The capital of France is", max_tokens=16, temperature=0.0))
    assert "".join(o.delta_text for o in outs) == full.text
    assert [t for o in outs for t in o.delta_token_ids] == full.token_ids
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    assert outs[-1].usage == full.usage
    # every output is whole again (Ray carried deltas), or deltas only when asked
    for i, o in enumerate(outs):
        assert o.token_ids == [t for p in outs[: i + 1] for t in p.delta_token_ids]
        assert o.prompt_token_ids == full.prompt_token_ids and o.text == "".join(p.delta_text for p in outs[: i + 1])
    lean = list(tiny.stream("The capital of France is", max_tokens=16, temperature=0.0, deltas_only=True))
    assert [t for o in lean for t in o.delta_token_ids] == full.token_ids
    assert all(o.text == "" and o.token_ids == [] for o in lean[:-1]) and lean[-1].text == full.text


def test_a_stream_rebuilds_its_logprobs_as_they_were_generated(tiny):
    kw = dict(max_tokens=8, temperature=0.0, logprobs=2, prompt_logprobs=1)
    full = tiny.generate("The capital of France is", **kw)
    outs = list(tiny.stream("The capital of France is", **kw))
    assert [x.token_id for x in full.logprobs] == full.token_ids and len(full.logprobs[0].top) == 2
    for i, o in enumerate(outs):
        assert [x.token_id for x in o.logprobs] == o.token_ids
        assert [x.token_id for x in o.delta_logprobs] == o.delta_token_ids
        assert o.prompt_logprobs[0] is None and len(o.prompt_logprobs) == len(full.prompt_token_ids)
    assert [x.token_id for x in outs[-1].logprobs] == full.token_ids


def test_async_stream_and_generate_agree(tiny):
    async def run():
        text = ""
        async for out in tiny.astream("Once upon a time", max_tokens=10, temperature=0.0):
            text += out.delta_text
        return text, (await tiny.agenerate("Once upon a time", max_tokens=10, temperature=0.0)).text

    streamed, generated = asyncio.run(run())
    assert streamed == generated


def test_chat_messages_go_through_the_chat_template(tiny):
    out = tiny.chat([{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0.0)
    assert out.text and out.usage.prompt_tokens > 10


def test_bad_input_raises_tandems_own_error_naming_the_field(tiny):
    with pytest.raises(InvalidRequestError) as e:
        tiny.generate("", max_tokens=4)
    assert e.value.field == "prompt"
    with pytest.raises(InvalidRequestError) as e:
        list(tiny.stream("hi", max_tokens=0))
    assert e.value.field == "max_tokens"
    with pytest.raises(TypeError):
        tiny.generate("hi", max_tokenz=4)


def test_leaving_a_stream_early_aborts_the_request(tiny):
    for out in tiny.stream("Count to one hundred: 1, 2, 3,", max_tokens=200, temperature=0.0):
        break
    wait_for(lambda: tiny.health()["running"] == 0, 30, "the engine to stop the left stream's request")


def test_a_handle_works_from_another_ray_task_and_by_name(tiny):
    import ray
    from ray import cloudpickle

    from tandem.actors import connect

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    @ray.remote(num_cpus=0)
    def use(handle):
        return handle.generate("The capital of France is", max_tokens=6, temperature=0.0).text

    expected = tiny.generate("The capital of France is", max_tokens=6, temperature=0.0).text
    assert ray.get(use.remote(tiny)) == expected
    assert connect(TINY_ENGINE_NAME).generate("The capital of France is", max_tokens=6, temperature=0.0).text == expected


def test_multiplexed_streams_share_one_subscription_and_keep_their_text(tiny, direct):
    prompts = ["The capital of France is", "Once upon a time", "def add(a, b):"]
    expected = [tiny.generate(p, max_tokens=10, temperature=0.0).text for p in prompts]
    mux = tiny.multiplexed(direct)

    async def one(prompt):
        return "".join([out.delta_text async for out in mux.astream(prompt, max_tokens=10, temperature=0.0)])

    async def run():
        texts = await asyncio.gather(*(one(p) for p in prompts))
        with pytest.raises(InvalidRequestError):
            await one("")
        return texts, mux._mux().over_socket

    texts, over_socket = asyncio.run(run())
    assert texts == expected
    assert over_socket is direct  # the test's driver is on the engine's node


def test_a_closed_output_socket_aborts_its_subscribers_requests(tiny):
    """A server whose process goes away closes its socket: the engine stops generating
    for its requests (as when a Ray subscription ends)."""
    mux = tiny.multiplexed()

    async def run():
        stream = mux.astream("Count to one hundred: 1, 2, 3,", max_tokens=480, temperature=0.0)
        first = await stream.__anext__()
        assert mux._mux().over_socket and tiny.health()["running"] == 1
        mux._mux().pump.cancel()  # its socket closes; the stream itself is not closed
        # (awaited on this loop: the stream, left open, would abort its request when closed)
        await until(lambda: tiny.health()["running"] == 0, 30, "the engine to stop the closed socket's request",
                    every_s=0.05)
        return first, tiny.health()

    first, health = asyncio.run(run())
    assert not first.finished
    assert health["running"] == 0 and health["waiting"] == 0, health


def counted_burst(mux, request, prompts: list[str], intake_s: float = 0.0) -> tuple[list, list[int]]:
    """request(prompt) for every prompt at once on one event loop of the multiplexed
    handle: what each returned (or the InvalidRequestError it raised), and the sizes of
    the submissions that carried them. intake_s: each request first holds the event loop
    that long, as a server's HTTP intake does (and the subscription is open before)."""

    async def one(prompt):
        time.sleep(intake_s)
        try:
            return await request(prompt)
        except InvalidRequestError as e:
            return e

    async def run():
        loop_mux = mux._mux()  # this event loop's subscription
        batches, submit, write = [], loop_mux._submit_batch, loop_mux._write_submission

        async def counting(requests):
            if loop_mux._writer is None:  # a Ray call; over the socket, _write_submission counts
                batches.append(len(requests))
            return await submit(requests)

        def counting_writes(requests):
            batches.append(len(requests))  # tried: one that does not pickle is not sent
            return write(requests)

        loop_mux._submit_batch, loop_mux._write_submission = counting, counting_writes
        if intake_s:
            loop_mux._ensure_pump()
            await loop_mux._subscribed.wait()
        return await asyncio.gather(*(one(p) for p in prompts)), batches

    return asyncio.run(run())


class Unpicklable(list):
    """Token ids the engine would take, but that cannot be sent to it."""

    def __reduce_ex__(self, protocol):
        raise TypeError("this prompt refuses to be pickled")


def test_a_burst_of_multiplexed_streams_is_submitted_in_few_calls_and_a_bad_one_harms_none(tiny, direct):
    unpicklable = Unpicklable([1, 2, 3])
    prompts = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at", "", unpicklable,
               "Red, green,"]
    expected = {p: tiny.generate(p, max_tokens=6, temperature=0.0).text for p in prompts if isinstance(p, str) and p}
    mux = tiny.multiplexed(direct)

    async def text(prompt):
        return "".join([out.delta_text async for out in mux.astream(prompt, max_tokens=6, temperature=0.0)])

    results, batches = counted_burst(mux, text, prompts)
    # the unpicklable request is sent again without the others: one more submission
    assert sum(batches) >= len(prompts) and len(batches) < len(prompts), batches
    for prompt, got in zip(prompts, results):
        if prompt is unpicklable:
            assert isinstance(got, InvalidRequestError) and got.field == "prompt", got
            assert "cannot be sent to the engine" in str(got) and "refuses to be pickled" in str(got)
        elif prompt:
            assert got == expected[prompt]
        else:
            assert isinstance(got, InvalidRequestError) and got.field == "prompt"


def test_over_the_socket_a_burst_that_comes_in_slowly_goes_in_pieces_as_it_comes(tiny):
    """Each request holds the event loop 0.6 ms before it is submitted (8 in ~5 ms, all in
    one turn of the loop): over the socket what waited 1 ms goes without waiting for the
    first submission's reply, so the engine can start on it; every text is still whole."""
    prompts = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at", "Red, green,",
               "The moon is", "One, two,", "Hello"]
    expected = {p: tiny.generate(p, max_tokens=6, temperature=0.0).text for p in prompts}
    mux = tiny.multiplexed()

    async def text(prompt):
        return "".join([out.delta_text async for out in mux.astream(prompt, max_tokens=6, temperature=0.0)])

    results, batches = counted_burst(mux, text, prompts, intake_s=0.0006)
    assert results == [expected[p] for p in prompts]
    assert sum(batches) == len(prompts) and len(batches) >= 3, batches


def test_multiplexed_agenerates_go_in_few_submissions_whole_and_a_bad_one_harms_none(tiny, direct):
    prompts = ["The capital of France is", "Once upon a time", "", "Water boils at"]
    expected = {p: tiny.generate(p, max_tokens=6, temperature=0.0) for p in prompts if p}
    mux = tiny.multiplexed(direct)
    results, batches = counted_burst(mux, lambda p: mux.agenerate(p, max_tokens=6, temperature=0.0), prompts)
    assert sum(batches) == len(prompts) and len(batches) < len(prompts), batches
    for prompt, got in zip(prompts, results):
        if prompt:  # the final output, whole: text, token ids and usage as generate() gives them
            want = expected[prompt]
            assert (got.finished, got.text, got.token_ids, got.usage) == (True, want.text, want.token_ids, want.usage)
        else:
            assert isinstance(got, InvalidRequestError) and got.field == "prompt"


def test_a_multiplexed_stream_cancelled_while_its_submission_waits_leaves_nothing_running(tiny, direct):
    """A client that leaves while its request waits behind a submission on its way: the
    others still get their text, and nothing is left running (the request is not sent,
    or its abort stops it)."""
    mux = tiny.multiplexed(direct)

    async def one(prompt, max_tokens):
        return "".join([out.delta_text async for out in mux.astream(prompt, max_tokens=max_tokens, temperature=0.0)])

    async def run():
        first = asyncio.ensure_future(one("Once upon a time", 4))
        for _ in range(3):
            await asyncio.sleep(0)  # its submission is on its way
        leaving = asyncio.ensure_future(one("Count to one hundred: 1, 2, 3,", 480))
        other = asyncio.ensure_future(one("Water boils at", 4))
        await asyncio.sleep(0)  # both wait behind it
        leaving.cancel()
        texts = await asyncio.gather(first, other)
        await asyncio.gather(leaving, return_exceptions=True)
        return texts

    assert all(asyncio.run(run()))
    wait_for(lambda: not (h := tiny.health())["running"] and not h["waiting"], 30, "nothing running or waiting")
    health = tiny.health()
    assert health["running"] == 0 and health["waiting"] == 0, health


def test_a_multiplexed_handle_serves_two_event_loops_at_once(tiny):
    """Each loop gets its own subscription: a pump of one loop must not feed the queues of
    another (asyncio queues belong to their loop)."""
    import threading

    prompts = ["The capital of France is", "Once upon a time"]
    expected = [tiny.generate(p, max_tokens=8, temperature=0.0).text for p in prompts]
    mux = tiny.multiplexed()
    texts: dict[int, str] = {}

    async def one(prompt):
        return "".join([out.delta_text async for out in mux.astream(prompt, max_tokens=8, temperature=0.0)])

    def in_own_loop(i):
        texts[i] = asyncio.run(one(prompts[i]))

    threads = [threading.Thread(target=in_own_loop, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [texts.get(i) for i in range(2)] == expected
    assert asyncio.run(one(prompts[0])) == expected[0]  # and a later loop gets a fresh one
