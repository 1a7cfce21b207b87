"""What a request will cost a replica, estimated in microseconds before it is sent.

A fast estimate, not a tokenizer: about four characters per token for the prompt, and for the
output the smaller of ``max_tokens`` and what the model's replies have been so far (an EWMA of
``usage.completion_tokens``), since most replies stop well before their cap.
"""

from __future__ import annotations

from typing import Any

from hetero.sched.item import CostModel
from hetero.sched.prefix import BLOCK_CHARS, Prefix, prefix_blocks

__all__ = [
    "CHARS_PER_TOKEN",
    "MAX_TOKENS",
    "OutputLengths",
    "brief",
    "prompt_tokens",
    "requested_max_tokens",
]

#: Characters per token of the prompt estimate (English text in BPE vocabularies: 3.5 to 4.5).
CHARS_PER_TOKEN = 4
#: The largest output cap a request may ask for (engines count tokens in 32-bit integers).
MAX_TOKENS = 2**31 - 1


def brief(value: Any, limit: int = 40) -> str:
    """``repr(value)``, shortened when long (a bad value quoted back in an error)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def _chars(value: Any) -> int:
    # Walked with a stack of its own: a body nested as deep as JSON allows must not exhaust
    # Python's recursion.
    chars, stack = 0, [value]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):  # a content part: {"type": "text", "text": ...}
            stack += (value.get("text"), value.get("content"))
    return chars


def prompt_tokens(payload: dict[str, Any]) -> int:
    """Estimated prompt tokens of a chat, completion or embedding request body."""
    chars = 0
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                chars += _chars(message.get("content"))
    chars += _chars(payload.get("prompt")) + _chars(payload.get("input"))
    return max(1, -(-chars // CHARS_PER_TOKEN))


def block_work(prefill_weight: float) -> float:
    """The work units one cached prompt block (``BLOCK_CHARS`` characters) spares."""
    return BLOCK_CHARS / CHARS_PER_TOKEN * prefill_weight


def prompt_prefix(text: str, session: str | None, work: float) -> Prefix:
    """What a prompt shares with others, as the router indexes it: its ``BLOCK_CHARS`` blocks
    of ``text``, each sparing ``work`` (``block_work``), and its conversation."""
    return Prefix(prefix_blocks(text), work, session, len(text) / BLOCK_CHARS)


def cache_blocks(kv_tokens: int) -> int:
    """An engine's KV capacity in prompt blocks of ``BLOCK_CHARS`` characters (at least one)."""
    return max(1, round(kv_tokens * CHARS_PER_TOKEN / BLOCK_CHARS))


def prompt_text(payload: dict[str, Any], limit: int) -> str:
    """A request's prompt as text, in the order an engine reads (and caches) it: each chat
    message's role and content, or the completion's prompt; at most ``limit`` characters."""
    parts: list[str] = []
    size = 0
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if size >= limit:
                break
            if isinstance(message, dict):
                text = f"{message.get('role')}\n{_text(message.get('content'))}\n"
                parts.append(text)
                size += len(text)
    else:
        prompt = payload.get("prompt")
        parts.append(_text(prompt[0] if isinstance(prompt, list) and prompt else prompt))
    return "".join(parts)[:limit]


def _text(value: object) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v.get("text") if isinstance(v, dict) else v) for v in value)
    return ""


def requested_max_tokens(payload: dict[str, Any]) -> int | None:
    """The output cap a request asks for (``max_completion_tokens`` or ``max_tokens``);
    ``ValueError`` naming the field, the value and what is allowed when it is not one."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if value is not None:
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 0 <= value <= MAX_TOKENS
            ):
                raise ValueError(
                    f"{key} must be an integer from 0 to {MAX_TOKENS}, got {brief(value)}"
                )
            return value
    return None


class OutputLengths:
    """Per model, the mean output length of finished replies (EWMA), for cost estimates."""

    def __init__(self, cost_model: CostModel, default_max_tokens: int, alpha: float = 0.05):
        self.cost_model = cost_model
        self.default_max_tokens = default_max_tokens
        self.alpha = alpha
        self._mean: dict[str, float] = {}

    def expected(self, model: str, max_tokens: int | None) -> float:
        cap = self.default_max_tokens if max_tokens is None else max_tokens
        mean = self._mean.get(model)
        return float(cap) if mean is None else min(float(cap), mean)

    def observe(self, model: str, output_tokens: int) -> None:
        mean = self._mean.get(model)
        self._mean[model] = (
            float(output_tokens) if mean is None else mean + self.alpha * (output_tokens - mean)
        )
