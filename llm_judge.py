"""The LLM judge of WebArena answers: the tasks whose evaluator asks a language model whether an answer
means the reference (libwebarena's llm_fuzzy_match and llm_ua_match, about 40 of WebArena-Lite's 165)
call an OpenAI-compatible chat endpoint of your choice, such as a local vLLM server, instead of OpenAI.

    python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2.5-7B-Instruct --port 8000   # any server
    python eval.py --benchmark webarena-lite --judge-url http://127.0.0.1:8000/v1 [--judge-model NAME]
    # or: export WEBDREAM_JUDGE_URL=http://127.0.0.1:8000/v1 WEBDREAM_JUDGE_MODEL=NAME

    import llm_judge
    llm_judge.configure("http://127.0.0.1:8000/v1")          # the flags' values (None: leave as is)
    llm_judge.configured()                                   # True once a URL is set
    llm_judge.chat_completion(model="gpt-4-1106-preview", messages=[...], temperature=0, max_tokens=768,
                              top_p=1.0, context_length=0)   # -> the reply's text

The benchmark's own grading prompts and its reading of the verdict are kept: webarena_lite.py makes
chat_completion the transport of libwebarena's graders (it has the signature of libwebarena's
generate_from_openai_chat_completion). Only the model changes: the one named by --judge-model /
$WEBDREAM_JUDGE_MODEL, else the first the server lists (GET /models; a vLLM server serves one), never
the "gpt-4-1106-preview" the graders name. The configuration lives in environment variables, so
environments in child processes (rollout.EnvPool(processes=True)) inherit it.

Without a judge those tasks are not run: benchmarks.select leaves them out and counts them (eval.py
reports them), and a WebEnv refuses to reset one (env_error). A judge that cannot be reached, or does
not answer within TIMEOUT_S after RETRIES tries, raises JudgeError: the episode ends as env_error,
neither a success nor a failure. A reply that says neither verdict is scored 0 by the benchmark's rule
(BrowserGym's validate).
"""
from __future__ import annotations

import ipaddress
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request

URL_VAR = "WEBDREAM_JUDGE_URL"      # the endpoint's base URL, OpenAI style: http://host:8000/v1
MODEL_VAR = "WEBDREAM_JUDGE_MODEL"  # the model name the server knows (default: the first it lists)
KEY_VAR = "WEBDREAM_JUDGE_API_KEY"  # sent as a bearer token when set (a local vLLM needs none)
TIMEOUT_S = 30.0                    # one request
RETRIES = 2                         # more tries after a failed request (1 s, then 2 s apart)

_models: dict[str, str] = {}        # base URL -> the first model it lists


class JudgeError(RuntimeError):
    """The judge endpoint could not be reached or gave no reply."""


def base_url(url: str) -> str:
    """The endpoint's base URL, OpenAI style: 'http://host:8000' -> 'http://host:8000/v1' (a bare host
    gets /v1, vLLM's path); a URL with a path is kept, less a trailing '/'. Errors: ValueError for a URL
    that is not http(s)."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"the judge URL must be http(s)://host[:port][/path], got {url!r}")
    path = parts.path.rstrip("/") or "/v1"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def configure(url: str | None = None, model: str | None = None) -> None:
    """Set the judge (the flags' --judge-url and --judge-model; None leaves the environment's value).
    Errors: ValueError for a URL that is not http(s)."""
    if url:
        os.environ[URL_VAR] = base_url(url)
    if model:
        os.environ[MODEL_VAR] = model


def configured() -> bool:
    """Whether a judge endpoint is set (--judge-url or $WEBDREAM_JUDGE_URL)."""
    return bool(os.environ.get(URL_VAR, "").strip())


def describe() -> str:
    """The judge in words, for logs and results: its URL and model, or that there is none."""
    if not configured():
        return f"none (set --judge-url or ${URL_VAR})"
    return f"{base_url(os.environ[URL_VAR])} ({os.environ.get(MODEL_VAR) or 'the first model it serves'})"


def is_loopback(url: str) -> bool:
    """Whether `url`'s host is this machine: localhost (its subdomains, localhost.localdomain), 127.0.0.0/8,
    ::1, an IPv4-mapped 127.x, or the unspecified address 0.0.0.0 / :: (what a server bound to every interface,
    vLLM's default, prints, and what a client then reaches on this machine)."""
    host = (urllib.parse.urlsplit(url).hostname or "").rstrip(".").lower()
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return ip.is_loopback or ip.is_unspecified


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "127.0.0.0/8")  # no_proxy entries (the CIDR is read by requests)


def direct_loopback(environ=os.environ) -> None:
    """Add the loopback names to no_proxy and NO_PROXY (keeping what they list), so that HTTP clients this
    process does not own (libwebarena's evaluators call the WebArena sites' REST APIs with `requests`) reach
    a site or server on this machine directly, whatever http_proxy the cluster sets."""
    for var in ("no_proxy", "NO_PROXY"):
        have = [h.strip() for h in environ.get(var, "").split(",") if h.strip()]
        environ[var] = ",".join(have + [h for h in LOOPBACK_NAMES if h not in have])


def _opener(url: str) -> urllib.request.OpenerDirector:
    """An opener for `url`: a loopback endpoint directly (an http_proxy set for the cluster, common on GPU
    nodes, would otherwise receive every request to a judge on 127.0.0.1 when no_proxy does not list it);
    any other host through the environment's proxies, as urllib does by default."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}) if is_loopback(url)
                                       else urllib.request.ProxyHandler())


def _request(url: str, body: dict | None = None) -> dict:
    """One JSON request (POST with a body, else GET), retried RETRIES times. Errors: JudgeError."""
    headers = {"Content-Type": "application/json"}
    if os.environ.get(KEY_VAR):
        headers["Authorization"] = f"Bearer {os.environ[KEY_VAR]}"
    data = None if body is None else json.dumps(body).encode()
    last = None
    for attempt in range(RETRIES + 1):
        try:
            with _opener(url).open(urllib.request.Request(url, data=data, headers=headers), timeout=TIMEOUT_S) as r:
                return json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}: {e.read()[:200].decode(errors='replace')}"
            if e.code < 500:
                break  # a bad request stays bad
        except (OSError, ValueError) as e:  # refused, timed out, not JSON
            last = f"{type(e).__name__}: {e}"
        if attempt < RETRIES:
            time.sleep(2 ** attempt)
    raise JudgeError(f"the LLM judge at {url} failed: {last}")


def model_name() -> str:
    """The model the judge asks: $WEBDREAM_JUDGE_MODEL, else the first model the server lists.
    Errors: JudgeError (no judge configured, the server unreachable or listing no model)."""
    if not configured():
        raise JudgeError(f"no LLM judge is configured: set --judge-url or ${URL_VAR}")
    if os.environ.get(MODEL_VAR):
        return os.environ[MODEL_VAR]
    url = base_url(os.environ[URL_VAR])
    if url not in _models:
        listed = _request(url + "/models").get("data") or []
        if not listed:
            raise JudgeError(f"the LLM judge at {url} lists no model; set --judge-model or ${MODEL_VAR}")
        _models[url] = listed[0]["id"]
    return _models[url]


def chat_completion(model: str, messages: list[dict], temperature: float, max_tokens: int, top_p: float = 1.0,
                    context_length: int = 0, stop_token: str | None = None) -> str:
    """The text of the judge's reply to `messages` (libwebarena's generate_from_openai_chat_completion
    signature; `model` and `context_length` are ignored: the judge's own model answers).
    Errors: JudgeError when there is no judge or it gives no reply."""
    body = {"model": model_name(), "messages": messages, "temperature": temperature, "max_tokens": max_tokens,
            "top_p": top_p}
    if stop_token:
        body["stop"] = [stop_token]
    reply = _request(base_url(os.environ[URL_VAR]) + "/chat/completions", body)
    try:
        return reply["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise JudgeError(f"the LLM judge's reply has no message: {str(reply)[:200]}") from None
