"""One streamed request to an OpenAI-compatible server, timed as `vllm bench serve` times it.

The request goes to /v1/completions with the prompt as token ids (the OpenAI API takes them; vLLM and
SGLang do), so every server sees exactly the tokens specbench's own engine decodes, chat template
applied; or, to a server that speaks only chat, to /v1/chat/completions with the user's turn as text
(the server applies its own template). Each streamed chunk is timed on arrival: the first one's time is
the TTFT, the gaps between later ones are the inter-token latencies (a speculative server sends every
token a verify step accepted in one chunk, so a gap may carry several tokens: the ITL per token spreads
each gap over its chunk's tokens), TPOT is (E2E - TTFT) / (output tokens - 1).
vLLM's `return_token_ids` gives the generated ids for the lossless check and its `ignore_eos` fixes an
answer's length; both go only to a vLLM server (a strict OpenAI-compatible one refuses fields it does not
know), the others get the standard fields and give text. No redirect is followed: the headers go only to
the URL given.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from urllib.parse import urljoin

import aiohttp

from specbench.core.errors import SpecbenchError
from specbench.core.records.serve_records import RequestRecord
from specbench.serving.endpoint import shown_url


@dataclass(frozen=True)
class Prompt:
    id: str
    token_ids: list[int]  # the conversation under the target's chat template, as /v1/completions takes it
    messages: tuple[dict[str, str], ...]  # the conversation up to the user's turn, as /v1/chat/completions takes it
    max_tokens: int | None = None  # its own answer length (--range-ratio); None: the workload's


def session(headers: dict[str, str]) -> aiohttp.ClientSession:
    """A client session without a pool limit (the load shapes bound what is in flight) and with the headers
    every request carries."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=headers)


def request_body(endpoint_type: str, model: str, prompt: Prompt, max_tokens: int, temperature: float, seed: int,
                 ignore_eos: bool, vllm: bool = True) -> tuple[str, dict]:
    """The path and streamed request body for `prompt` in the endpoint's own form; vLLM's own fields only where
    the server is `vllm`."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}}
    if vllm:
        body["return_token_ids"] = True
        if ignore_eos:
            body["ignore_eos"] = True
    if endpoint_type == "chat":
        return "/v1/chat/completions", {**body, "messages": list(prompt.messages)}
    return "/v1/completions", {**body, "prompt": prompt.token_ids}


async def stream_completion(client: aiohttp.ClientSession, base_url: str, path: str, body: dict,
                            record: RequestRecord, timeout_s: float) -> RequestRecord:
    """Send one request, stream its answer into `record`, and return it; a failure is its error. `timeout_s`
    bounds the whole request, the streamed answer included."""
    started = time.perf_counter()
    last = started
    ids: list[int] = []
    counted = 0
    usage_tokens = None
    done = False
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with client.post(f"{base_url}{path}", json=body, timeout=timeout, allow_redirects=False) as response:
            if response.status != 200:
                record.error, record.http_status = await failure(response), response.status
                return record
            async for raw in response.content:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if chunk.get("error"):  # vLLM streams a failure mid-answer as an error object
                    fault = chunk["error"]
                    message = fault.get("message", fault) if isinstance(fault, dict) else fault
                    record.error = f"error in the stream: {message}"[:200]
                    return record
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                for choice in chunk.get("choices") or []:
                    new_ids = choice.get("token_ids") or []
                    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    if not new_ids and not text:
                        continue
                    now = time.perf_counter()
                    if record.ttft is None:
                        record.ttft = now - started
                    else:
                        record.itl.append(now - last)
                        record.chunk_tokens.append(len(new_ids) or 1)
                    last = now
                    ids += new_ids
                    counted += len(new_ids) or 1
                    record.text += text
    except TimeoutError:
        record.error = f"no complete answer within {timeout_s:g} s"
        return record
    except (aiohttp.ClientError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}".strip()[:200]
        return record
    if not done:
        record.error = "the stream ended before [DONE]: the answer is cut short"
        return record
    record.e2e = last - started
    record.token_ids = ids or None
    record.output_tokens = usage_tokens if usage_tokens is not None else len(ids) or counted
    if record.ttft is None:
        record.error = "the server streamed no token"
    return record


async def failure(response: aiohttp.ClientResponse) -> str:
    """A response that is not 200 as a request's error: its status and the first line of its body, or where it
    redirects (not followed), credentials and query left out."""
    if 300 <= response.status < 400:
        target = urljoin(str(response.url), response.headers.get("Location", ""))
        return f"HTTP {response.status}: a redirect to {shown_url(target)}, not followed"
    lines = (await response.text()).strip().splitlines()
    return f"HTTP {response.status}: {lines[0][:200] if lines else response.reason}"


class ModelsFailed(SpecbenchError):
    """/v1/models did not answer with a model at a level's start: its status (None: no answer) and why."""

    def __init__(self, status: int | None, why: str):
        super().__init__(why)
        self.status = status


async def served_model(client: aiohttp.ClientSession, base_url: str) -> str:
    """The model name a server serves (the first of /v1/models); ModelsFailed where it names none."""
    try:
        async with client.get(f"{base_url}/v1/models", allow_redirects=False) as response:
            if response.status != 200:
                raise ModelsFailed(response.status, await failure(response))
            return (await response.json())["data"][0]["id"]
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelsFailed(None, f"{type(exc).__name__}: {exc}".strip()[:200]) from None
