"""The HTTP API's listening socket (helix.server.http.bind_http) as asyncio serves it."""

from __future__ import annotations

import asyncio
import socket

from helix.server.http import bind_http


def test_connections_of_the_bound_socket_have_nagle_off():
    """asyncio turns Nagle off (TCP_NODELAY) only on connections of a socket whose proto is TCP.
    A socket made with proto 0 left it on, and every response sent as two writes (headers, then
    body: every JSON reply of helix serve) waited for the client's delayed ACK, ~40 ms (GET
    /v1/models took 44 ms; with the in-thread server of the tests, 1 ms)."""
    sock = bind_http("127.0.0.1", 0)
    port = sock.getsockname()[1]
    seen: list[int] = []

    class Record(asyncio.Protocol):
        def connection_made(self, transport):
            s = transport.get_extra_info("socket")
            seen.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def main():
        server = await asyncio.get_running_loop().create_server(Record, sock=sock)   # as uvicorn
        async with server:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(asyncio.wait_for(main(), 10))
    assert sock.proto == socket.IPPROTO_TCP
    assert seen and seen[0] != 0
