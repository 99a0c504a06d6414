"""The Session stream over a Unix socket, for a rank on the scheduler's own host.

Why: on the gRPC stream each message passes through several Python threads on both
sides (the request iterator's consumer, the completion queue's poller, the handler), and
each wake-up costs 0.05-0.15 ms. On the H200 host a round trip took 0.55-0.73 ms while
the rank worked 2-3.5 ms between messages, against 0.09-0.10 ms over a Unix socket read
by the waiting thread itself (bench/README.md; the socket's side is
`python bench/session_transport.py`). One round trip a tick is most of what a shard
process costs against an in-process rank.

The messages are the same protobuf Command and CommandReply as on the gRPC stream, and
the rank runs them through the same code (ShardServicer._session_replies); only the
carrier differs. Everything else (start-up, health, the failed verdict, fault injection)
stays gRPC.

The socket has an abstract name (Linux): nothing on disk is left behind when a rank is
killed, and only a process in the same network namespace (the host, or the pod) can
reach it. Its first frame must carry the token the rank gave in its gRPC Health reply,
so only a client of the gRPC server can use it. Where no such socket can be made or
reached (another host, another OS), the Session goes over gRPC.

Frames: a 4-byte little-endian length, then the message. The client's first frame is
the token, then (optional) how many microseconds each side busy-polls before it blocks.

Busy-polling: a blocked read costs a wake-up on each side of every message (a round
trip of 0.09 ms blocked against 0.02 ms with both sides polling on the H200 host, 0.16
against 0.04 on a 2-core box: `python bench/session_transport.py`). A busy GPU server
keeps a core per process for that (vLLM's workers and engine core poll their queues
too); a small machine cannot, so it is on only where there are cores to spare
(default_spin_us). The scheduler polls for a reply while the rank computes, the rank for
the next command while the scheduler works; each falls back to a blocking read once its
spin runs out, so an idle server sleeps.
"""
from __future__ import annotations

import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import time
from typing import Callable, Iterable

import grpc

from tandem.rpc.generated import shard_pb2 as pb
from tandem.rpc.limits import MAX_MESSAGE_BYTES
from tandem.rpc.session import Session, StreamBroken

log = logging.getLogger("tandem.rpc.session_socket")

_HEADER = struct.Struct("<I")
_BUFFER_BYTES = 4 * 1024 * 1024  # socket buffers: a long prompt's prefill fits without a stall
_HANDSHAKE_S = 10.0  # how long a connecting client may take to send its token
_TOKEN_BYTES = 16
_SPIN = struct.Struct("<I")  # after the token: the busy-poll in microseconds
_MAX_SPIN_US = 1_000_000
_SPARE_CORES_TO_SPIN = 8  # a process with fewer usable cores does not busy-poll by default
_DEFAULT_SPIN_US = 20_000  # longer than a tick's forward: the reply is polled for, not slept on
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)  # 0: no non-blocking recv here, so no polling


def default_spin_us() -> int:
    """How long the session busy-polls by default: a tick's worth where this process may
    use at least _SPARE_CORES_TO_SPIN cores, else not at all."""
    return _DEFAULT_SPIN_US if usable_cores() >= _SPARE_CORES_TO_SPIN and _DONTWAIT else 0


def usable_cores(cgroup_root: str = "/sys/fs/cgroup") -> float:
    """The cores this process may run on, and within its container's CPU quota: a pod
    limited to 4 CPUs on a 64-core node sees 64 in its affinity, and a poller there would
    spend its quota."""
    try:
        cores: float = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    for quota_file, period_file in (("cpu.max", None),  # cgroup v2: "<quota|max> <period>"
                                    ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):  # v1; -1: none
        try:
            with open(os.path.join(cgroup_root, quota_file)) as f:
                fields = f.read().split()
            if period_file is not None:
                with open(os.path.join(cgroup_root, period_file)) as f:
                    fields.append(f.read().strip())
            quota, period = fields[0], int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
        if quota not in ("max", "-1") and period > 0:
            return min(cores, int(quota) / period)
    return cores


class FrameReader:
    """Whole frames from a stream socket, most with one recv each."""

    def __init__(self, sock: socket.socket, spin_s: float = 0.0):
        self.sock = sock
        self.spin_s = spin_s  # busy-poll this long for data before a blocking read
        self._buf = bytearray()

    def read(self) -> bytes:
        """The next frame; EOFError at the end of the stream, ValueError on a frame too large."""
        self._fill(_HEADER.size)
        (size,) = _HEADER.unpack_from(self._buf)
        if size > MAX_MESSAGE_BYTES:
            raise ValueError(f"a frame of {size} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
        end = _HEADER.size + size
        self._fill(end)
        frame = bytes(self._buf[_HEADER.size:end])
        del self._buf[:end]
        return frame

    def _fill(self, n: int) -> None:
        while len(self._buf) < n:
            data = self._recv(max(65536, n - len(self._buf)))
            if not data:
                raise EOFError("the session socket closed")
            self._buf += data

    def _recv(self, size: int) -> bytes:
        # a socket with a timeout waits in poll() before any recv: polling applies to blocking ones
        if self.spin_s > 0 and _DONTWAIT and self.sock.gettimeout() is None:
            give_up = time.perf_counter() + self.spin_s
            while True:
                try:
                    return self.sock.recv(size, _DONTWAIT)
                except BlockingIOError:
                    if time.perf_counter() > give_up:
                        break
        return self.sock.recv(size)


def write_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(_HEADER.pack(len(data)) + data)


def _tune(sock: socket.socket) -> None:
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)
        except OSError:
            pass  # the system's cap applies; smaller buffers only mean earlier back-pressure


class SessionSocketServer:
    """The rank's side: accepts connections and answers each command frame with the
    replies `replies_for` gives it, in order, as the gRPC Session handler does."""

    def __init__(self, replies_for: Callable[[pb.Command], Iterable[pb.CommandReply]]):
        self.name = ""  # the abstract name (without its leading NUL); "" = no socket
        self.token = secrets.token_bytes(16)
        self._replies_for = replies_for
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._closed = False
        self._listener: socket.socket | None = None
        name = f"tandem-shard-{os.getpid()}-{secrets.token_hex(8)}"
        listener = None
        try:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind("\0" + name)  # abstract (Linux only)
            listener.listen(16)
        except (AttributeError, OSError) as e:  # no Unix sockets, or no abstract names, here
            if listener is not None:
                listener.close()
            log.info("no session socket (%s): the scheduler uses gRPC", e)
            return
        self._listener, self.name = listener, name
        threading.Thread(target=self._accept, name="shard-session-accept", daemon=True).start()

    def close(self) -> None:
        """Stop accepting and end every open stream (its client sees the stream closed)."""
        with self._lock:
            self._closed = True
            connections, self._connections = list(self._connections), set()
        if self._listener is not None:
            _shut(self._listener)
            self._listener.close()
        for conn in connections:
            _shut(conn)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), name="shard-session", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._connections.add(conn)
        try:
            _tune(conn)
            reader = FrameReader(conn)
            conn.settimeout(_HANDSHAKE_S)
            hello = reader.read()
            if len(hello) not in (_TOKEN_BYTES, _TOKEN_BYTES + _SPIN.size) or not hmac.compare_digest(
                    hello[:_TOKEN_BYTES], self.token):
                log.warning("session socket: a client without the right token was turned away")
                return
            if len(hello) > _TOKEN_BYTES:
                reader.spin_s = min(_SPIN.unpack_from(hello, _TOKEN_BYTES)[0], _MAX_SPIN_US) / 1e6
            conn.settimeout(None)
            write_frame(conn, b"")  # accepted
            while True:
                data = reader.read()
                try:
                    cmd = pb.Command.FromString(data)
                except Exception:  # noqa: BLE001 - a frame that is no Command ends the stream, as gRPC would
                    log.error("session socket: a frame of %d bytes is not a Command; closing the stream", len(data))
                    return
                for reply in self._replies_for(cmd):
                    write_frame(conn, reply.SerializeToString())
        except (EOFError, OSError, ValueError):
            pass  # the client went away (or sent garbage): its commands end with it
        except Exception:  # noqa: BLE001 - the stream ends (the client sees it closed); say why here
            log.exception("session socket: the stream failed")
        finally:
            with self._lock:
                self._connections.discard(conn)
            conn.close()


class SocketSession(Session):
    """The scheduler's side: a Session whose messages go over the rank's socket. The
    waiting thread reads the socket itself, so a reply wakes it directly."""

    transport = "socket"

    def __init__(self, sock: socket.socket, reader: FrameReader, rank: int):
        super().__init__(rank)
        self._sock, self._reader = sock, reader

    @classmethod
    def connect(cls, name: str, token: bytes, rank: int, timeout: float, spin_us: int = 0) -> SocketSession:
        """Connect and hand over the token; OSError (or EOFError: refused) if that fails.
        spin_us: how long both sides busy-poll for a message before they block."""
        spin_us = max(0, min(spin_us, _MAX_SPIN_US))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect("\0" + name)
            _tune(sock)
            write_frame(sock, token + _SPIN.pack(spin_us))
            reader = FrameReader(sock)
            reader.read()  # the rank's acceptance
            sock.settimeout(None)
            reader.spin_s = spin_us / 1e6
        except BaseException:
            sock.close()
            raise
        return cls(sock, reader, rank)

    def _write(self, command: pb.Command) -> None:
        try:
            write_frame(self._sock, command.SerializeToString())
        except OSError:
            pass  # the rank is gone or the stream was cancelled: the next _read says so

    def _read(self) -> pb.CommandReply:
        try:
            data = self._reader.read()
        except EOFError:
            raise StreamBroken(grpc.StatusCode.UNAVAILABLE, "the session socket closed") from None
        except (OSError, ValueError) as e:
            raise StreamBroken(grpc.StatusCode.UNAVAILABLE, f"the session socket failed: {e}") from None
        return pb.CommandReply.FromString(data)

    def _cancel(self) -> None:
        _shut(self._sock)

    def close(self) -> None:
        _shut(self._sock)
        self._sock.close()


def _shut(sock: socket.socket) -> None:
    """Wake whoever waits on the socket (accept, recv, send): they see it closed."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
