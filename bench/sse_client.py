"""A thin HTTP/1.1 client for load: one keep-alive connection per simulated user, a
POST whose Server-Sent Events come back as they arrive.

Why not httpx: with 64 requests started at once on 64 idle keep-alive connections, its
connection pool handed them out one after another (the server saw one new request every
15-20 ms on a 2-core box, against all 64 within a few ms from this client), so a load
test measured the client. This does only what serve_load needs: JSON in, chunked
`data: ...` events out.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator


class HTTPStatusError(RuntimeError):
    pass


class SSEConnection:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> "SSEConnection":
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def events(self, path: str, body: dict) -> AsyncIterator[str]:
        """POST body as JSON; yield the payload of each `data: ` event (the text after it)."""
        raw = json.dumps(body).encode()
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(raw)}\r\n\r\n".encode() + raw
        )
        status, headers = await self._head()
        if headers.get("transfer-encoding", "").lower() != "chunked":
            text = (await self.reader.readexactly(int(headers.get("content-length", "0")))).decode()
            raise HTTPStatusError(f"HTTP {status}: {text}" if status != 200 else "a stream that is not chunked")
        pending = b""
        async for chunk in self._chunks():
            pending += chunk
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if event.startswith(b"data: "):
                    yield event[6:].decode()
        if status != 200:
            raise HTTPStatusError(f"HTTP {status}")

    async def _head(self) -> tuple[int, dict[str, str]]:
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            data = await self.reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                return
            yield data[:-2]
