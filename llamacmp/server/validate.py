"""Client JSON at the edge: parsed strictly, and numbers read as llama.cpp's typed getters would have them.

Python's json accepts what nlohmann::json (llama-server's parser) refuses: NaN, Infinity, numbers that overflow
a double (1e999 -> inf) and lone UTF-16 surrogates ("\\ud800", which no response can then encode); it raises
ValueError on integers over 4300 digits and RecursionError on deep nesting. Each of those is a 400 here that
names the field (`messages[0].content`), found by one walk over the parsed body.
"""
from __future__ import annotations

import json
import math
import re

from .errors import ApiError, bad_request

MAX_DEPTH = 64                 # nesting levels of a request body (a JSON schema or tool arguments included)
MAX_INT_DIGITS = 4300          # Python's own limit for int(str) (sys.get_int_max_str_digits)
INT32 = (-2**31, 2**31 - 1)
# per-request work and memory stay bounded (llama.cpp has no such limits; its n_probs is capped by the vocabulary)
MAX_N_PROBS = 1024             # n_probs / top_logprobs: top entries kept per generated token
MAX_STOPS = 64                 # stop strings per request
MAX_STOP_CHARS = 1024          # characters per stop string
MAX_GRAMMAR_BYTES = 256 * 1024 # a GBNF grammar, or a JSON schema as JSON text
FLOAT32_MAX = 3.4028234663852886e38
_DECIMAL = re.compile(r"-?[0-9]+")    # ASCII digits only: str.isdigit() also takes '²' and '٣', int() does not


class _Refused:
    """A number the parse hooks refused, left in place so that the walk can say which field held it."""
    __slots__ = ("text", "why")

    def __init__(self, text: str, why: str):
        self.text, self.why = text, why


def _float(s: str):
    v = float(s)
    return v if math.isfinite(v) else _Refused(s, "is out of range for a number")


def _int(s: str):
    if len(s) - s.startswith("-") > MAX_INT_DIGITS:
        return _Refused(s[:16] + "...", f"has more than {MAX_INT_DIGITS} digits")
    return int(s)


def _constant(s: str):
    return _Refused(s, "is not a JSON number")


def loads(raw: bytes) -> dict:
    """The request body as a JSON object, or a 400 naming what is wrong and where."""
    try:
        body = json.loads(raw or b"{}", parse_float=_float, parse_int=_int, parse_constant=_constant)
    except RecursionError:
        raise bad_request(f"request body is nested more than {MAX_DEPTH} levels deep") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(f"[json.exception.parse_error] {e}", "invalid_request_error") from None
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    check_tree(body)
    return body


def field_name(path) -> str:
    """(("messages", 0), "content") linked path -> messages[0].content."""
    keys = []
    while path is not None:
        path, key = path
        keys.append(key)
    out = ""
    for k in reversed(keys):
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else str(k))
    return out or "(body)"


def check_tree(body) -> None:
    """Depth, refused numbers and lone surrogates anywhere in `body` (iterative: no recursion to exhaust)."""
    stack = [(body, None, 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, dict):
            if depth >= MAX_DEPTH:
                raise bad_request(f"'{field_name(path)}' is nested more than {MAX_DEPTH} levels deep")
            for k, x in v.items():
                if not k.isascii():
                    _check_text(k, path, f"key {k!r}")
                stack.append((x, (path, k), depth + 1))
        elif isinstance(v, list):
            if depth >= MAX_DEPTH:
                raise bad_request(f"'{field_name(path)}' is nested more than {MAX_DEPTH} levels deep")
            if all(type(x) is int for x in v):      # token lists: nothing to look into
                continue
            stack.extend((x, (path, i), depth + 1) for i, x in enumerate(v))
        elif isinstance(v, str):
            if not v.isascii():
                _check_text(v, path, "")
        elif isinstance(v, _Refused):
            raise bad_request(f"'{field_name(path)}': {v.text} {v.why}")


def _check_text(s: str, path, what: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        where = f"'{field_name(path)}'" + (f" ({what})" if what else "")
        raise bad_request(f"{where} holds a lone surrogate (\\ud800-\\udfff): not valid Unicode") from None


def json_type(v) -> str:
    """nlohmann::json's type_name() of a parsed JSON value (llama-server's type errors name it)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), "object")


def ascii_int(s: str) -> int | None:
    """A decimal integer written in ASCII digits (llama.cpp's std::stoi), else None."""
    return int(s) if _DECIMAL.fullmatch(s) and len(s) <= 20 else None


def int_in_range(key: str, v: int | float, lo: int = INT32[0], hi: int = INT32[1]) -> int:
    """An integer field's value; a float is truncated as llama.cpp's get<int> does; outside [lo, hi] is a 400."""
    if isinstance(v, float):
        if not -2.0**63 <= v < 2.0**63:
            raise bad_request(f"'{key}' must be an integer between {lo} and {hi}")
        v = int(v)
    if not lo <= v <= hi:
        raise bad_request(f"'{key}' must be an integer between {lo} and {hi}")
    return v


def finite_float(key: str, v: int | float) -> float:
    """A float field's value: a number that float32 holds (llama.cpp's sampling settings are floats)."""
    try:
        f = float(v)
    except OverflowError:
        f = math.inf
    if not abs(f) <= FLOAT32_MAX:
        raise bad_request(f"'{key}' is out of range for a float")
    return f
