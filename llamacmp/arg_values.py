"""Value parsing for the option table: llama.cpp's spellings of numbers, booleans, enums, biases and escapes,
with the exception texts its std::sto* calls and handlers produce (they end up in the error messages)."""
from __future__ import annotations

import json
import re
from typing import Callable


class ArgError(Exception):
    """A message already in llama.cpp's wording; the tool prints it to stderr and exits 1."""


class Unsupported(ArgError):
    """A known llama.cpp flag that llamacmp cannot honour yet."""


# -- value parsers (their exception text is what llama.cpp's std::sto* would say) ------------------------------

def to_int(s: str) -> int:
    """std::stoi: an int32, else "stoi" (invalid) or "stoi: out of range"."""
    try:
        v = int(s.strip())
    except ValueError:
        raise ValueError("stoi") from None
    if not -2**31 <= v < 2**31:
        raise ValueError("stoi: out of range")
    return v


def to_count(s: str) -> int:
    """A size that cannot be negative (-c 0 means the model's own)."""
    v = to_int(s)
    if v < 0:
        raise ValueError(f"must be >= 0, got {v}")
    return v


def to_seed(s: str) -> int:
    """std::stoul into a uint32: -1 (random) up to 4294967295."""
    try:
        v = int(s.strip())
    except ValueError:
        raise ValueError("stoul") from None
    if not -2**31 <= v < 2**32:
        raise ValueError("stoul: out of range")
    return v


def to_port(s: str) -> int:
    v = to_int(s)
    if not 0 <= v <= 65535:
        raise ValueError(f"port must be 0-65535, got {v}")
    return v


def to_float(s: str) -> float:
    try:
        return float(s.strip())
    except ValueError:
        raise ValueError("stof") from None


TRUTHY, FALSEY = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


def to_bool(s: str) -> bool:
    if s in TRUTHY:
        return True
    if s in FALSEY:
        return False
    raise ValueError("invalid boolean value")


def choice(flag: str, *allowed: str, aliases: dict | None = None) -> Callable[[str], str]:
    def parse(s: str) -> str:
        s = (aliases or {}).get(s, s)
        if s not in allowed:
            raise ValueError(f"error: unknown value for {flag}: '{s}'\n")
        return s
    return parse


def on_off_auto(flag: str) -> Callable[[str], str]:
    return choice(flag, "on", "off", "auto", aliases={**{t: "on" for t in TRUTHY}, **{f: "off" for f in FALSEY}})


def gpu_layers(s: str) -> str:
    if s in ("auto", "all"):
        return s
    return str(to_int(s))


def tensor_split(s: str) -> tuple[float, ...]:
    parts = [p for p in s.replace("/", ",").split(",")]
    return tuple(to_float(p) for p in parts)


def device_list(s: str) -> tuple[int, ...]:
    """-dev: `none` (no GPU: the numpy reference) or a comma-separated list of CUDA devices, `CUDA0,CUDA1` (llama.cpp's
    names) or plain indices `0,1`. The same device twice gives two split parts on one GPU (how the split is tested on
    a single card)."""
    if s.strip().lower() == "none":
        return ()
    out = []
    for part in s.split(","):
        name = part.strip()
        digits = name[4:] if name.upper().startswith("CUDA") else name
        if not digits.isdigit():
            raise ValueError(f"invalid device: '{name}' (use CUDA0, CUDA1, ... or none)")
        out.append(int(digits))
    return tuple(out)


def logit_bias(s: str) -> tuple[int, float]:
    """TOKEN_ID(+/-)BIAS, e.g. `15043+1` or `15043-inf`."""
    for i in range(1, len(s)):
        if s[i] in "+-":
            return to_int(s[:i]), float(s[i:])
    raise ValueError("invalid input format")


def kv_overrides(s: str) -> dict[str, int | float | bool | str]:
    """--override-kv KEY=TYPE:VALUE[,...] (string_parse_kv_override): TYPE int, float, bool (true/false) or str
    (at most 127 characters); the key at most 127. Numbers must be whole (llama.cpp's atol/atof read a prefix)."""
    out: dict[str, int | float | bool | str] = {}
    for item in (x for x in s.split(",") if x):
        key, sep, typed = item.partition("=")
        kind, colon, text = typed.partition(":")
        try:
            if not sep or not key or len(key) >= 128 or not colon:
                raise ValueError
            if kind == "int":
                out[key] = int(text.strip())
            elif kind == "float":
                out[key] = float(text.strip())
            elif kind == "bool" and text in ("true", "false"):
                out[key] = text == "true"
            elif kind == "str" and len(text) <= 127:
                out[key] = text
            else:
                raise ValueError
        except ValueError:
            raise ArgError(f"error: Invalid type for KV override: {item}\n") from None
    return out


def json_object(s: str) -> dict:
    value = json.loads(s)
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return value


MAX_STREAM_BYTES = 64 << 20      # read from a pipe or device (-f /dev/stdin); /dev/zero would never end


def read_text(path: str) -> str:
    """A regular file whole; anything else (a pipe, a device) up to MAX_STREAM_BYTES."""
    import os
    import stat
    try:
        with open(path, "rb") as f:
            regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
            data = f.read() if regular else f.read(MAX_STREAM_BYTES + 1)
    except OSError:
        raise ValueError(f"error: failed to open file '{path}'\n") from None
    if len(data) > MAX_STREAM_BYTES and not regular:
        raise ValueError(f"error: '{path}' gives more than {MAX_STREAM_BYTES >> 20} MiB and is not a regular file\n")
    return data.decode("utf-8", errors="replace")


CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
_STRTOL_HEX2 = re.compile(rb"[ \t\n\v\f\r+-]?[0-9a-fA-F]+")


def _hex_pair(pair: bytes) -> int | None:
    """The byte of `\\x<pair>` when strtol(pair, 16) reads both characters (llama.cpp's test), else None."""
    if len(pair) != 2 or not _STRTOL_HEX2.fullmatch(pair):
        return None
    return int(pair.strip(), 16) & 0xFF          # int() takes the sign; char(val) keeps the low byte


def process_escapes(s: str) -> str:
    """llama.cpp's string_process_escapes: only \\n \\r \\t \\' \\" \\\\ and \\xHH; any other escape stays as typed.
    It works on the UTF-8 bytes: \\xHH is that raw byte, so "\\xc3\\xa9" is "\u00e9" and a byte that forms no
    character comes back as Python's surrogateescape code point (U+DC80..U+DCFF), which the tokenizer turns back
    into the byte."""
    raw = s.encode("utf-8", "surrogateescape")
    out, i = bytearray(), 0
    while i < len(raw):
        c = raw[i]
        if c == 0x5C and i + 1 < len(raw):          # backslash
            n = raw[i + 1]
            if n in ESCAPES:
                out += ESCAPES[n]
                i += 2
                continue
            byte = _hex_pair(raw[i + 2:i + 4]) if n == ord("x") else None
            if byte is not None:
                out.append(byte)
                i += 4
                continue
            out += raw[i:i + 2]                     # unknown: the backslash and the character, as typed
            i += 2
            continue
        out.append(c)
        i += 1
    return out.decode("utf-8", "surrogateescape")
