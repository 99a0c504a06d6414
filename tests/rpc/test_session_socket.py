"""The session socket: a rank's Session stream over a Unix socket, for a scheduler on the
same host. It answers exactly as the gRPC stream does, carries frames of megabytes whole,
lets in only a client holding the rank's token, ends only the stream a bad frame came on,
and a group that cannot reach it uses gRPC. Busy-polling changes none of that: a frame
that comes after the spin ran out is still read, a closed stream still ends the read."""
from __future__ import annotations

import socket
import threading
import time

import grpc
import pytest

from conftest import InProcessLauncher
from test_shard_server import init, prefill_msg, verify_msg
from tandem.rpc.generated import shard_pb2 as pb
from tandem.rpc.generated import shard_pb2_grpc as pb_grpc
from tandem.rpc.server import start_shard_server
from tandem.shard.factory import build_rank
from tandem.rpc.session import StreamBroken
from tandem.rpc.session_socket import FrameReader, SocketSession, write_frame

COMMANDS = [
    pb.Command(timeout_s=10, prefill=pb.PrefillRequest(items=[prefill_msg(0, [1, 2, 3]), prefill_msg(1, [4, 5, 6])])),
    pb.Command(timeout_s=10, verify=verify_msg()),
    pb.Command(timeout_s=10, verify=verify_msg(batch_id=2, start_pos=[5]),
               before=[pb.Command(timeout_s=10, commit=pb.Verdict(batch_id=1, words=[2]))]),
    pb.Command(timeout_s=10, verify=verify_msg(batch_id=3, start_pos=[9])),  # refused: a pending verify and a wrong start
    pb.Command(timeout_s=10, release=pb.ReleaseRequest(slots=[0, 1])),
]


def open_socket(stub, rank: int = 0, token: bytes | None = None, spin_us: int = 0) -> SocketSession:
    health = stub.Health(pb.Empty(), timeout=10)
    assert health.session_socket, "an in-process server on this host offers a session socket"
    return SocketSession.connect(health.session_socket, health.session_token if token is None else token, rank, 10,
                                 spin_us)


def exchange(session: SocketSession, commands: list[pb.Command]) -> list[pb.CommandReply]:
    for cmd in commands:
        session.send(cmd, 10, riders=len(cmd.before))
    replies = []
    for cmd in commands:
        for _ in range(len(cmd.before) + 1):
            reply, code, details, _ = session.receive()
            replies.append(reply if code is None else pb.CommandReply(code=code.value[0], details=details))
    return replies


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spin_us", [0, 20_000], ids=["blocking", "polling"])
def test_the_socket_answers_every_command_as_the_grpc_stream_does(shard_server, tiny_model_dir, spin_us):
    over_grpc, _ = shard_server()
    over_socket, _ = shard_server()
    for stub in (over_grpc, over_socket):
        init(stub, tiny_model_dir)
    expected = list(over_grpc.Session(iter(COMMANDS), timeout=30))
    session = open_socket(over_socket, spin_us=spin_us)
    got = exchange(session, COMMANDS)
    session.close()
    assert [r.WhichOneof("reply") for r in expected] == ["prefill", "verify", "done", "verify", None, "done"]
    assert expected[4].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert got == expected


@pytest.mark.timeout(120)
def test_a_client_without_the_token_is_turned_away_and_the_rank_keeps_serving(shard_server, tiny_model_dir):
    stub, _ = shard_server()
    init(stub, tiny_model_dir)
    with pytest.raises(EOFError):
        open_socket(stub, token=b"not the token")
    health = stub.Health(pb.Empty(), timeout=10)
    with pytest.raises(EOFError):  # the token with trailing bytes that are no spin
        SocketSession.connect(health.session_socket, health.session_token + b"xyz", 0, 10)
    session = open_socket(stub)
    assert exchange(session, COMMANDS[:1])[0].prefill.next_tokens
    session.close()


@pytest.mark.timeout(120)
def test_a_frame_that_is_no_command_ends_its_own_stream_only(shard_server, tiny_model_dir):
    stub, _ = shard_server()
    init(stub, tiny_model_dir)
    broken, healthy = open_socket(stub), open_socket(stub)
    write_frame(broken._sock, b"\xff\xff\xff not a protobuf message")
    _, code, details, _ = broken.receive()
    assert code == grpc.StatusCode.UNAVAILABLE and "session socket closed" in details
    assert broken.receive()[1] == grpc.StatusCode.UNAVAILABLE, "a broken stream stays broken"
    assert exchange(healthy, COMMANDS[:1])[0].prefill.next_tokens
    for session in (broken, healthy):
        session.close()


@pytest.mark.timeout(120)
def test_a_command_of_megabytes_crosses_whole_and_is_refused_alone(shard_server, tiny_model_dir):
    stub, _ = shard_server()
    init(stub, tiny_model_dir)
    session = open_socket(stub)
    huge = pb.Command(timeout_s=10, prefill=pb.PrefillRequest(items=[pb.PrefillItem(slot=2, tokens=[5] * 1_000_000)]))
    assert huge.ByteSize() > 1_000_000  # many socket reads and writes for one frame
    refused, *rest = exchange(session, [huge, *COMMANDS[:2]])
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], refused
    assert [r.WhichOneof("reply") for r in rest] == ["prefill", "verify"]
    session.close()


@pytest.mark.timeout(120)
def test_a_stopped_rank_ends_a_waiting_read_instead_of_leaving_it_waiting(tiny_model_dir):
    server, address = start_shard_server(build_rank, "127.0.0.1:0")
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ShardControlStub(channel)
        init(stub, tiny_model_dir)
        session = open_socket(stub)
    server.stop(grace=None)
    with pytest.raises(StreamBroken) as info:
        session._read()
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    session.close()


def _pair(spin_s: float) -> tuple[FrameReader, socket.socket]:
    mine, theirs = socket.socketpair()
    return FrameReader(mine, spin_s), theirs


@pytest.mark.parametrize("late_s", [0.005, 0.2], ids=["while-polling", "after-the-spin"])
def test_a_polling_reader_gets_a_frame_sent_while_it_polls_or_after_its_spin_ran_out(late_s):
    reader, peer = _pair(spin_s=0.05)
    sender = threading.Timer(late_s, write_frame, (peer, b"x" * 100_000))
    started = time.perf_counter()
    sender.start()
    assert reader.read() == b"x" * 100_000
    assert time.perf_counter() - started >= late_s
    sender.join()
    peer.close()
    with pytest.raises(EOFError):  # the peer gone: the end of the stream, polling or not
        reader.read()
    reader.sock.close()


def test_a_stream_shut_down_while_the_reader_polls_ends_the_read():
    reader, peer = _pair(spin_s=10.0)
    threading.Timer(0.05, reader.sock.shutdown, (socket.SHUT_RDWR,)).start()  # the watchdog's cancel
    with pytest.raises(EOFError):
        reader.read()
    peer.close()
    reader.sock.close()


class _SocketGoneLauncher(InProcessLauncher):
    """A rank whose Health names a session socket this process cannot reach."""

    def start(self) -> list[str]:
        addresses = super().start()
        self.servers[-1].session_socket.close()
        return addresses


@pytest.mark.timeout(120)
def test_a_group_that_cannot_reach_the_socket_uses_grpc(tiny_model_dir):
    from tandem.rpc.grpc_group import GrpcShardGroup
    from slot_blocks import prefill_item

    from tandem.shard.factory import ShardSpec

    group = GrpcShardGroup(ShardSpec(model=tiny_model_dir, num_slots=2, max_model_len=32, row_budget=8),
                           _SocketGoneLauncher(), deadline_s=10)
    try:
        assert group.session_transports == ["grpc"]
        assert group.prefill([prefill_item(0, [1, 2, 3])]).next_tokens
    finally:
        group.close()


def test_busy_polling_is_on_by_default_only_where_there_are_cores_to_spare(monkeypatch):
    import os

    from tandem.rpc import session_socket

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert session_socket.usable_cores(cgroup_root="/nonexistent") == 64  # no cgroup files: the affinity
    monkeypatch.setattr(session_socket, "usable_cores", lambda: 2)
    assert session_socket.default_spin_us() == 0
    monkeypatch.setattr(session_socket, "usable_cores", lambda: 16)
    assert session_socket.default_spin_us() == 20_000


@pytest.mark.parametrize("files, cores", [
    ({"cpu.max": "400000 100000\n"}, 4.0),  # cgroup v2, a pod limited to 4 CPUs
    ({"cpu.max": "max 100000\n"}, 64),  # v2, no limit
    ({"cpu/cpu.cfs_quota_us": "250000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.5),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 64),  # v1, no limit
])
def test_a_containers_cpu_quota_bounds_the_cores_that_count(tmp_path, monkeypatch, files, cores):
    import os

    from tandem.rpc.session_socket import usable_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert usable_cores(cgroup_root=str(tmp_path)) == cores
