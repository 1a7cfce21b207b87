"""The OpenAI request bodies an emulated replica reads, and the errors it answers in OpenAI's
shape: prompt length in tokens, ``max_tokens``, flags, and the embeddings it makes up."""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from hetero._checks import is_integer

__all__ = [
    "EMBEDDING_DIM",
    "BadRequest",
    "Generation",
    "chat_prompt_tokens",
    "completion_prompt_tokens",
    "count_tokens",
    "embed",
    "flag",
    "json_object",
    "max_tokens",
    "openai_error",
    "prompt_text",
    "show",
]

EMBEDDING_DIM: Final = 16
_CHARS_PER_TOKEN = 4


def count_tokens(chars: int) -> int:
    """The tokens of ``chars`` characters of text: four characters to a token, at least one."""
    return max(1, round(chars / _CHARS_PER_TOKEN))


class BadRequest(Exception):
    """A request refused before any work: its HTTP ``status``, message and OpenAI error code."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def show(value: object) -> str:
    """A value parsed from the request, as JSON, cut short if long."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_object(raw: bytes) -> dict[str, Any]:
    """The request body, which must be a JSON object."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, f"the request body must be a JSON object, got {show(body)}")
    return body


def chat_prompt_tokens(body: dict[str, Any]) -> int:
    return count_tokens(sum(map(len, _chat_texts(body))))


def _chat_texts(body: dict[str, Any]) -> list[str]:
    """The texts of the messages (text parts only), in order."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(
            400, f"'messages' must be a non-empty list of messages, got {show(messages)}"
        )
    texts: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(400, f"'messages[{i}]' must be an object, got {show(message)}")
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):  # content parts: only text parts count
            texts += (
                part["text"]
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
        elif content is not None:
            raise BadRequest(
                400,
                f"'messages[{i}].content' must be a string, a list of parts or null, "
                f"got {show(content)}",
            )
    return texts


def completion_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return count_tokens(len(prompt))
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return count_tokens(sum(len(p) for p in prompt))
        if all(is_integer(p) for p in prompt):  # token ids
            return len(prompt)
    raise BadRequest(
        400,
        f"'prompt' must be a string, a list of strings or a list of token ids, got {show(prompt)}",
    )


def prompt_text(body: dict[str, Any], *, chat: bool) -> str:
    """The text of a prompt already counted (so valid): four characters to a token, token ids
    written four characters each, so that 64 characters are a block of 16 tokens either way."""
    if chat:
        return "".join(_chat_texts(body))
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return prompt
    if all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    return "".join(f"{p % 0x10000:04x}" for p in prompt)


def max_tokens(body: dict[str, Any], default: int) -> int:
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not is_integer(value) or value < 1:
            raise BadRequest(400, f"'{key}' must be an integer >= 1, got {show(value)}")
        return int(value)
    return default


def flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(400, f"'{key}' must be true or false, got {show(value)}")
    return value


def openai_error(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def embed(text: str) -> list[float]:
    """A deterministic unit vector of :data:`EMBEDDING_DIM` floats for ``text``."""
    digest = hashlib.blake2b(text.encode(), digest_size=4 * EMBEDDING_DIM).digest()
    raw = [n / 2**31 - 1 for n in struct.unpack(f"<{EMBEDDING_DIM}I", digest)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


@dataclass(frozen=True, slots=True)
class Generation:
    """A parsed completion request and the length drawn for it."""

    chat: bool
    model: str
    prompt_tokens: int
    out_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool
