"""A small OpenAI-compatible server on 127.0.0.1 for serve's fast tests: the protocol's streaming
completions, /v1/models, /tokenize and vLLM's speculative counters at /metrics, answering from a tokenizer
instead of a model.

`specbench serve` measures what a server streams, not what it computes, so its failure handling,
credentials and request fields are tested here in seconds; tests/test_serve_faults.py runs the same
proxy in front of a real `vllm serve`. `strict` makes it a strict OpenAI-compatible server (none of
vLLM's own fields accepted, not "owned_by" vLLM), which vLLM cannot be; `tokenize=False` removes /tokenize.
Every answer is `max_tokens` tokens, one a chunk: the prompt's own ids, cycled. `key` is the bearer key it
asks for; `seen` records each request's path, headers and body.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading

from aiohttp import web

STANDARD_FIELDS = {"model", "prompt", "messages", "max_tokens", "temperature", "seed", "stream", "stream_options",
                   "n", "top_p", "stop"}


class OpenAIServer:
    def __init__(self, tokenizer, host: str = "127.0.0.1", key: str | None = None, strict: bool = False,
                 tokenize: bool = True):
        self.tokenizer, self.host, self.key, self.strict, self.tokenize = tokenizer, host, key, strict, tokenize
        self.seen: list[tuple[str, dict[str, str], dict]] = []
        self.answered = 0  # completions streamed
        self.models = [{"id": "tiny", "owned_by": "openai-compatible" if strict else "vllm"}]  # what /v1/models lists
        with socket.socket() as sock:
            sock.bind((host, 0))
            self.port = sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        self.seen.append((request.path, dict(request.headers), body))
        if self.key and request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        if request.path == "/health":
            return web.Response()
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": self.models})
        if request.path == "/tokenize" and self.tokenize:
            ids = self.tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
            return web.json_response({"tokens": ids, "count": len(ids)})
        if request.path == "/metrics":
            drafts = self.answered * 2
            return web.Response(text=f"vllm:spec_decode_num_drafts_total {drafts}\n"
                                     f"vllm:spec_decode_num_draft_tokens_total {drafts * 2}\n"
                                     f"vllm:spec_decode_num_accepted_tokens_total {drafts}\n")
        if request.path in ("/v1/completions", "/v1/chat/completions"):
            unknown = set(body) - STANDARD_FIELDS
            if self.strict and unknown:
                return web.json_response({"error": {"message": f"unknown fields: {sorted(unknown)}"}}, status=400)
            return await self.complete(request, body)
        return web.json_response({"error": {"message": "not found"}}, status=404)

    def prompt_ids(self, body: dict) -> list[int]:
        if "messages" in body:
            text = self.tokenizer.apply_chat_template(body["messages"], add_generation_prompt=True, tokenize=False)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt = body["prompt"]
        return self.tokenizer(prompt)["input_ids"] if isinstance(prompt, str) else prompt

    async def complete(self, request: web.Request, body: dict) -> web.StreamResponse:
        prompt = self.prompt_ids(body)
        answer = [prompt[i % len(prompt)] for i in range(body["max_tokens"])]
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(answer)}
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": self.tokenizer.decode(answer)}], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for token in answer:
            choice = {"text": self.tokenizer.decode([token])}
            if body.get("return_token_ids"):
                choice["token_ids"] = [token]
            await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            await asyncio.sleep(0.002)
        self.answered += 1
        await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    async def serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.host, self.port).start()

    def __enter__(self) -> OpenAIServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.serve(), self.loop).result(timeout=30)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
