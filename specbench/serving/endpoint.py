"""A running server as specbench speaks to it: its credentials, whether it answers, the model it names,
whether it is vLLM and the tokenizer that encodes its prompts.

Every request carries the same headers (`Authorization: Bearer KEY` and the user's own), health and
/metrics included, to the URL given and nowhere else: a redirect is refused, never followed, so no
header reaches a host the user did not name (urllib would carry `Authorization` along). The key is
--api-key; without it OPENAI_API_KEY, only where every endpoint is https or on this machine, so the
environment's key never crosses a network in clear without being asked for. The tokenizer is
`--tokenizer`, else `--model`, else the model the server lists at /v1/models (its `root`, the path vLLM
loaded, then its `id`) when it is available locally; it is checked against the server's own /tokenize
(vLLM and SGLang have one) on a probe text, or, where a server has none, against the prompt tokens its
/v1/completions counts for that text, so prompts encoded with another model's vocabulary are refused
instead of measured as nonsense.
"""

from __future__ import annotations

import ipaddress
import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urljoin, urlparse

from specbench.core.errors import SpecbenchError

PROBE_TEXT = "Speculative decoding, measured: 12 tokens/s. Was it lossless?"
AUTH_STATUSES = (401, 403)
NOT_SERVED = (404, 405)  # the server has no such route
ENV_KEY = "OPENAI_API_KEY"
VLLM_OWNER = "vllm"  # vLLM's /v1/models entries say `"owned_by": "vllm"`


def shown_url(url: str) -> str:
    """`url` as it may be printed or saved: scheme, host, port and path, without user:password@ or a query."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{parsed.scheme}://{host}{f':{parsed.port}' if parsed.port else ''}{parsed.path}"


def on_this_machine(url: str) -> bool:
    """Whether `url` is https or names a loopback host: a key sent there crosses no network in clear."""
    parsed = urlparse(url)
    if parsed.scheme == "https" or parsed.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parsed.hostname or "").is_loopback
    except ValueError:
        return False


def chosen_key(endpoints: dict[str, str], api_key: str | None) -> tuple[str | None, str | None]:
    """The key the --endpoint servers are sent and the line that says where it came from: `api_key` as given,
    else OPENAI_API_KEY where every endpoint is https or on this machine; None (and no line) without either."""
    if api_key is not None or not endpoints:
        return api_key, None
    key = os.environ.get(ENV_KEY)
    if not key:
        return None, None
    plain = [f"{name}={url}" for name, url in endpoints.items() if not on_this_machine(url)]
    if plain:
        return None, (f"{ENV_KEY} is not sent: {', '.join(plain)} is plain http to another host; give the key with "
                      "--api-key to send it there")
    return key, f"sending {ENV_KEY} from the environment to {', '.join(endpoints)} (https or this machine)"


def request_headers(api_key: str | None, headers: dict[str, str]) -> dict[str, str]:
    """What every request sends: the user's headers and, with a key, its bearer authorisation."""
    return {**({"Authorization": f"Bearer {api_key}"} if api_key else {}), **headers}


def parse_headers(values: list[str] | None) -> dict[str, str]:
    """`--header K:V` (repeatable) -> {K: V}; a malformed one is refused without showing it (it may be a secret)."""
    headers: dict[str, str] = {}
    for number, value in enumerate(values or [], 1):
        key, sep, text = value.partition(":")
        if not sep or not key.strip() or any(c.isspace() for c in key.strip()):
            raise SpecbenchError(f"--header number {number} ({len(value)} characters, not shown: it may hold a "
                                 "secret): expected NAME:VALUE, e.g. X-Team:bench")
        headers[key.strip()] = text.strip()
    return headers


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # urllib then raises the redirect as an HTTPError: the headers go to no other URL


_OPENER = urllib.request.build_opener(_NoRedirect)


def call(url: str, headers: dict[str, str], body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    """GET (or, with a body, POST as JSON) `url` and its JSON answer, following no redirect; urllib's errors as
    they come."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={**headers, "Content-Type": "application/json"})
    with _OPENER.open(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def refusal(name: str, url: str, path: str, exc: urllib.error.HTTPError) -> SpecbenchError:
    """An endpoint's HTTP error at `path` in one line: credentials refused, a redirect not followed, or the status."""
    where = f"--endpoint {name}={url}"
    if exc.code in AUTH_STATUSES:
        return SpecbenchError(f"{where} refused specbench's credentials (HTTP {exc.code} at {path}): give its key "
                              f"with --api-key (or {ENV_KEY}), or its headers with --header")
    if 300 <= exc.code < 400:
        location = exc.headers.get("Location")
        target = shown_url(urljoin(f"{url}{path}", location)) if location else "elsewhere"
        return SpecbenchError(f"{where} redirects (HTTP {exc.code} at {path}) to {target}: specbench follows no "
                              "redirect, so its credentials reach only the URL given; give the URL it redirects to")
    why = "the server failed: measure it once it answers" if exc.code >= 500 else "is it an OpenAI-compatible server?"
    return SpecbenchError(f"{where} answered HTTP {exc.code} at {path}; {why}")


def listed_models(name: str, url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The server's /v1/models entries, at least one; a refusal, an empty list or no answer at all is one line."""
    try:
        models = call(f"{url}/v1/models", headers)["data"]
    except urllib.error.HTTPError as exc:
        raise refusal(name, url, "/v1/models", exc) from None
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        raise SpecbenchError(f"--endpoint {name}={url} does not answer at {url}/v1/models; start the server or "
                             "fix the URL") from None
    if not isinstance(models, list) or not models or not all(isinstance(m, dict) and m.get("id") for m in models):
        raise SpecbenchError(f"--endpoint {name}={url} lists no model at /v1/models; is its model loaded?")
    return models


def is_vllm(name: str, url: str, headers: dict[str, str]) -> bool:
    """Whether the server is vLLM (its first model is owned by "vllm"): only vLLM takes `return_token_ids`."""
    return listed_models(name, url, headers)[0].get("owned_by") == VLLM_OWNER


def answers(url: str, headers: dict[str, str]) -> bool:
    """Whether the server at `url` still answers /v1/models."""
    try:
        call(f"{url}/v1/models", headers)
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def local_tokenizer(source: str):
    """The tokenizer of a local directory or a cached hub id; None where neither has one or it does not load."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # a missing file or a broken one
        return None


def endpoint_tokenizer(given: str | None, model_dir: str | None, endpoints: dict[str, str], headers: dict[str, str]):
    """--tokenizer (`given`), else --model's directory, else the first endpoint's listed model where it is
    found locally; a refusal in one line where none is."""
    for source, flag in ((given, "--tokenizer"), (model_dir, "--model")):
        if source is not None:
            tokenizer = local_tokenizer(source)
            if tokenizer is None:
                raise SpecbenchError(f"{flag} {source}: no tokenizer loads from there (expected a local directory or "
                                     "a cached hub id)")
            return tokenizer
    name, url = next(iter(endpoints.items()))
    listed = listed_models(name, url, headers)[0]
    for source in dict.fromkeys(s for s in (listed.get("root"), listed.get("id")) if s):
        tokenizer = local_tokenizer(source)
        if tokenizer is not None:
            return tokenizer
    raise SpecbenchError(f"--endpoint {name}={url} serves {listed.get('id')!r}, whose tokenizer is not available "
                         "here: give it with --tokenizer DIR (the served model's directory or cached hub id)")


def check_tokenizer(name: str, url: str, tokenizer, headers: dict[str, str]) -> bool:
    """Refuse an endpoint that encodes the probe text differently: other ids at its /tokenize, or, where it has
    none, another count of prompt tokens in a one-token completion of the text; False where it reports neither."""
    model = listed_models(name, url, headers)[0]["id"]
    ours = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    served = post(name, url, "/tokenize", headers, {"model": model, "prompt": PROBE_TEXT, "add_special_tokens": False})
    if served is not None:
        theirs = served.get("tokens") or []
        same = theirs == ours
        counted = len(theirs)
    else:
        answer = post(name, url, "/v1/completions", headers,
                      {"model": model, "prompt": PROBE_TEXT, "max_tokens": 1, "temperature": 0})
        counted = ((answer or {}).get("usage") or {}).get("prompt_tokens")
        if counted is None:
            return False
        ours = tokenizer(PROBE_TEXT)["input_ids"]  # a text prompt is encoded with its special tokens
        same = counted == len(ours)
    if not same:
        raise SpecbenchError(f"--endpoint {name}={url}: its tokenizer is not the one given ({model!r} encodes a "
                             f"probe text as {counted} tokens, the given one as {len(ours)}"
                             f"{', other ids' if counted == len(ours) else ''}); give the served model's with "
                             "--tokenizer DIR")
    return True


def post(name: str, url: str, path: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any] | None:
    """The endpoint's JSON answer at `path`; None where it has no such route; any other failure in one line."""
    try:
        answer = call(f"{url}{path}", headers, body, timeout=60.0)
    except urllib.error.HTTPError as exc:
        if exc.code in NOT_SERVED:
            return None
        raise refusal(name, url, path, exc) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SpecbenchError(f"--endpoint {name}={url} failed at {path} ({type(exc).__name__}); is it still "
                             "running?") from None
    return answer if isinstance(answer, dict) else {}
