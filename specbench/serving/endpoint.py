"""A running server as specbench speaks to it: its credentials, whether it answers, the model it names and
the tokenizer that encodes its prompts.

Every request carries the same headers (`Authorization: Bearer KEY` and the user's own), health and
/metrics included. The tokenizer is `--tokenizer`, else `--model`, else the model the server lists at
/v1/models (its `root`, the path vLLM loaded, then its `id`) when it is available locally; it is checked
against the server's own /tokenize (vLLM and SGLang have one) on a probe text, so prompts encoded with
another model's vocabulary are refused instead of measured as nonsense.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from specbench.core.errors import SpecbenchError

PROBE_TEXT = "Speculative decoding, measured: 12 tokens/s. Was it lossless?"
AUTH_STATUSES = (401, 403)


def request_headers(api_key: str | None, headers: dict[str, str]) -> dict[str, str]:
    """What every request sends: the user's headers and, with a key, its bearer authorisation."""
    return {**({"Authorization": f"Bearer {api_key}"} if api_key else {}), **headers}


def parse_headers(values: list[str] | None) -> dict[str, str]:
    """`--header K:V` (repeatable) -> {K: V}."""
    headers: dict[str, str] = {}
    for value in values or []:
        key, sep, text = value.partition(":")
        if not sep or not key.strip() or any(c.isspace() for c in key.strip()):
            raise SpecbenchError(f"--header {value}: expected NAME:VALUE, e.g. X-Team:bench")
        headers[key.strip()] = text.strip()
    return headers


def call(url: str, headers: dict[str, str], body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    """GET (or, with a body, POST as JSON) `url` and its JSON answer; urllib's errors as they come."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={**headers, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def listed_models(name: str, url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The server's /v1/models entries; a refusal of the credentials or no answer at all is one line."""
    try:
        return call(f"{url}/v1/models", headers)["data"]
    except urllib.error.HTTPError as exc:
        if exc.code in AUTH_STATUSES:
            raise SpecbenchError(f"--endpoint {name}={url} refused specbench's credentials (HTTP {exc.code} at "
                                 "/v1/models): give its key with --api-key or OPENAI_API_KEY, or its headers "
                                 "with --header") from None
        raise SpecbenchError(f"--endpoint {name}={url} answered HTTP {exc.code} at /v1/models; is it an "
                             "OpenAI-compatible server?") from None
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        raise SpecbenchError(f"--endpoint {name}={url} does not answer at {url}/v1/models; start the server or "
                             "fix the URL") from None


def answers(url: str, headers: dict[str, str]) -> bool:
    """Whether the server at `url` still answers /v1/models."""
    try:
        call(f"{url}/v1/models", headers)
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def local_tokenizer(source: str):
    """The tokenizer of a local directory or a cached hub id; None where neither has one."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError):
        return None


def endpoint_tokenizer(given: str | None, model_dir: str | None, endpoints: dict[str, str], headers: dict[str, str]):
    """--tokenizer (`given`), else --model's directory, else the first endpoint's listed model where it is
    found locally; a refusal in one line where none is."""
    if given is not None:
        tokenizer = local_tokenizer(given)
        if tokenizer is None:
            raise SpecbenchError(f"--tokenizer {given}: no tokenizer there (expected a local directory or a cached "
                                 "hub id)")
        return tokenizer
    if model_dir is not None:
        return local_tokenizer(model_dir)
    name, url = next(iter(endpoints.items()))
    listed = listed_models(name, url, headers)[0]
    for source in dict.fromkeys(s for s in (listed.get("root"), listed.get("id")) if s):
        tokenizer = local_tokenizer(source)
        if tokenizer is not None:
            return tokenizer
    raise SpecbenchError(f"--endpoint {name}={url} serves {listed.get('id')!r}, whose tokenizer is not available "
                         "here: give it with --tokenizer DIR (the served model's directory or cached hub id)")


def check_tokenizer(name: str, url: str, tokenizer, headers: dict[str, str]) -> bool:
    """Refuse an endpoint whose /tokenize encodes the probe text differently; False where it has no /tokenize."""
    model = listed_models(name, url, headers)[0]["id"]
    try:
        served = call(f"{url}/tokenize", headers, {"model": model, "prompt": PROBE_TEXT, "add_special_tokens": False})
    except urllib.error.HTTPError as exc:
        if exc.code in AUTH_STATUSES:
            raise SpecbenchError(f"--endpoint {name}={url} refused specbench's credentials (HTTP {exc.code} at "
                                 "/tokenize): give its key with --api-key or its headers with --header") from None
        return False
    except (urllib.error.URLError, OSError, ValueError):
        return False
    ours = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    theirs = served.get("tokens") or []
    if theirs != ours:
        raise SpecbenchError(f"--endpoint {name}={url}: its tokenizer is not the one given ({model!r} encodes a "
                             f"probe text as {len(theirs)} tokens, the given one as {len(ours)}, other ids); give the "
                             "served model's with --tokenizer DIR")
    return True
