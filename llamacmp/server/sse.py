"""Server-sent events as llama-server writes them: `data: <json>\n\n`; OpenAI routes end with `data: [DONE]`,
the native /completion does not; Anthropic and Responses name their events."""
from __future__ import annotations

import json

DONE = "data: [DONE]\n\n"


def dumps(obj) -> str:
    # compact and non-ASCII kept, as nlohmann::json::dump() does
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def data(obj) -> str:
    return f"data: {dumps(obj)}\n\n"


def event(name: str, obj) -> str:
    return f"event: {name}\ndata: {dumps(obj)}\n\n"


def error_data(err_json: dict) -> str:
    """A failure after the stream started goes out as an ordinary data line, then the stream ends."""
    return data(err_json)
