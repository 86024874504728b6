"""A small HTTP proxy on 127.0.0.1 in front of a real server that injects one fault at a time.

Every request is passed on as it came (headers included) and its answer streamed back chunk by chunk,
except where `fault` is set: the requests to `path` (any path ending so; completions unless given) after
the first `after`, `times` of them (all without it), get it: a status ("401", "403", "429", "500",
"503": that HTTP status instead of the answer); "reset": the connection closed half-way through the first
read of the stream; "stall": no chunk after the second for `stall_s`; "slow_first_byte": `delay_s` before the
answer starts; "stream_error": an error object in the stream after two chunks, as vLLM sends a failure
mid-answer; "malformed_sse": a data line that is not JSON after two chunks; "redirect": a 302 to the
same path at `redirect_to`. "dead" closes every connection on every path at once, as an endpoint whose
process is gone, and "unknown_model" lists a model that is not on this machine at /v1/models, as a remote
server does. `seen` records each request's path and headers.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import aiohttp
from aiohttp import web

STATUSES = {"401", "403", "429", "500", "503"}
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


class FaultProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream
        self.fault: str | None = None
        self.after = 0
        self.stall_s = 60.0
        self.delay_s = 1.0
        self.path = "completions"
        self.times: int | None = None
        self.redirect_to = ""
        self.matched = 0  # requests to the fault's path since it was set
        self.seen: list[tuple[str, dict[str, str]]] = []
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, fault: str | None, after: int = 0, path: str = "completions", times: int | None = None) -> None:
        self.fault, self.after, self.path, self.times, self.matched = fault, after, path, times, 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.path, dict(request.headers)))
        if self.fault == "dead":
            request.transport.close()
            return web.Response()
        if self.fault == "unknown_model" and request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": "remote-org/not-here", "root": "not-here"}]})
        body = await request.read()
        faulty = None
        if request.path.endswith(self.path):
            self.matched += 1
            within = self.times is None or self.matched <= self.after + self.times
            faulty = self.fault if self.matched > self.after and within else None
        if faulty in STATUSES:
            return web.Response(status=int(faulty), text=f"injected HTTP {faulty}")
        if faulty == "redirect":
            raise web.HTTPFound(self.redirect_to + request.path_qs)
        if faulty == "slow_first_byte":
            await asyncio.sleep(self.delay_s)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self.session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                        data=body) as answer:
            response = web.StreamResponse(status=answer.status,
                                          headers={"Content-Type": answer.headers.get("Content-Type", "text/plain")})
            await response.prepare(request)
            chunks = 0
            async for chunk in answer.content.iter_any():
                if faulty == "reset":  # half of the first read: however the answer arrives, it is cut mid-stream
                    await response.write(chunk[:len(chunk) // 2])
                    request.transport.close()
                    return response
                await response.write(chunk)
                chunks += 1
                if faulty == "stall" and chunks >= 2:
                    await asyncio.sleep(self.stall_s)
                if faulty in ("stream_error", "malformed_sse") and chunks >= 2:
                    line = b'{"error": {"message": "injected failure", "code": 500}}' if faulty == "stream_error" \
                        else b'{"choices": [{"text": "cut'
                    await response.write(b"data: " + line + b"\n\n")
                    await response.write_eof()
                    return response
            await response.write_eof()
            return response

    async def serve(self) -> None:
        self.session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.handle)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.session.close()

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.serve(), self.loop).result(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.close(), self.loop).result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
