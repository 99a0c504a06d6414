"""A Session's reply deadlines: a command sent without one (an acknowledgement read later)
is not timed while nobody waits for it, and is timed once the caller waits (awaiting), so a
rank that stopped answering is cancelled instead of waited for forever."""
import time

from tandem.rpc.session import GrpcSession


class FakeCall:
    def __init__(self):
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


class FakeStub:
    def __init__(self):
        self.call = FakeCall()

    def Session(self, requests):  # noqa: N802 - the gRPC method's name
        return self.call


def test_an_owed_reply_is_timed_only_once_the_caller_waits_for_it():
    stub = FakeStub()
    session = GrpcSession(stub, rank=0)
    session.send(object(), None)  # an acknowledgement to be read later
    assert session.deadline is None
    session.expire(time.monotonic() + 3600)
    assert not stub.call.cancelled, "an owed reply nobody waits for has no deadline"
    session.awaiting(0.01)
    assert session.deadline is not None
    session.expire(time.monotonic() + 1.0)
    assert stub.call.cancelled, "a reply waited for past its deadline cancels the stream"


def test_a_later_command_with_a_deadline_sets_the_stream_deadline():
    stub = FakeStub()
    session = GrpcSession(stub, rank=0)
    session.send(object(), None)
    session.send(object(), 5.0)
    assert session.deadline is not None and session.deadline > time.monotonic() + 4
    session.expire(time.monotonic())
    assert not stub.call.cancelled
