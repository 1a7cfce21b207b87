"""What a client's request carries, read and checked before the router sees it: a completion's
body, model, ``x-priority``, session and ``max_tokens``; the API key of any request. A request
that fails a check becomes ``Refused``, answered as an OpenAI-style error naming what is wrong."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hetero.sched.prefix import BLOCK_CHARS, MAX_BLOCKS
from hetero.serve.cost import brief, prompt_text, requested_max_tokens
from hetero.serve.proxy import error_json

__all__ = [
    "Completion",
    "Refused",
    "api_key",
    "error_response",
    "read_completion",
    "same_key",
]

_PRIORITY_LIMIT = 2**31 - 1
#: The longest session id (header x-session-id, or OpenAI's user field) a request may give.
_MAX_SESSION = 256


def error_response(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> web.Response:
    """An OpenAI-style error answer."""
    body = error_json(message, kind, status)
    return web.Response(status=status, text=body, content_type="application/json", headers=headers)


class Refused(Exception):
    """A request answered before any replica saw it: the answer's status, message, OpenAI
    error type and headers."""

    def __init__(
        self, status: int, message: str, kind: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.kind, self.headers)


def _invalid(message: str) -> Refused:
    return Refused(400, message, "invalid_request_error")


def api_key(request: web.Request) -> str:
    """The request's API key: ``Authorization: Bearer KEY``, else ``x-api-key``, else ``""``."""
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth[7:]
    return request.headers.get("x-api-key", "")


def same_key(given: str, key: str) -> bool:
    """Whether ``given`` is ``key``, compared in constant time. aiohttp decodes header bytes
    that are not UTF-8 as lone surrogates, which a plain ``encode()`` refuses (a 500): every
    string, surrogates and all, has one encoding under ``surrogatepass``."""
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), key.encode("utf-8", "surrogatepass")
    )


@dataclass(frozen=True, slots=True)
class Completion:
    """A completion (or embeddings) request as the router admits it. ``text`` and ``session``
    are read only for a router that weighs prefix caches."""

    body: bytes
    payload: dict[str, Any]
    model: str
    priority: int
    max_tokens: int | None
    stream: bool
    text: str | None
    session: str | None


async def read_completion(request: web.Request, max_body: int, prefix_aware: bool) -> Completion:
    """Read and check ``request``'s body and headers; ``Refused`` (413, 400) naming the first
    problem."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise Refused(
            413,
            f"request body is over the limit of {max_body} bytes (hetero serve --max-body)",
            "invalid_request_error",
        ) from None
    try:
        payload = json.loads(body)
    except RecursionError:
        raise _invalid(
            "request body is nested too deeply (JSON arrays and objects within each other)"
        ) from None
    except ValueError as exc:
        raise _invalid(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise _invalid("request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("field 'model' is required: the name of a served model (GET /v1/models)")
    raw_priority = request.headers.get("x-priority", "0")
    try:
        priority = int(raw_priority)
        if abs(priority) > _PRIORITY_LIMIT:
            raise ValueError(raw_priority)
    except ValueError:
        raise _invalid(
            f"header x-priority must be an integer from {-_PRIORITY_LIMIT} to "
            f"{_PRIORITY_LIMIT} (higher first), got {brief(raw_priority)}"
        ) from None
    text = session = None
    if prefix_aware:
        session = request.headers.get("x-session-id", payload.get("user"))
        if session is not None and (
            not isinstance(session, str) or not 0 < len(session) <= _MAX_SESSION
        ):
            raise _invalid(
                "the session (header x-session-id, or field user) must be a string of 1 to "
                f"{_MAX_SESSION} characters, got {brief(session)}"
            )
        text = prompt_text(payload, MAX_BLOCKS * BLOCK_CHARS)
    embeddings = request.path == "/v1/embeddings"
    try:
        max_tokens = 0 if embeddings else requested_max_tokens(payload)
    except ValueError as exc:
        raise _invalid(str(exc)) from None
    stream = payload.get("stream") is True and not embeddings
    return Completion(body, payload, model, priority, max_tokens, stream, text, session)
