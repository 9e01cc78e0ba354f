"""Request bodies -> typed objects, once, at the edge.

llama.cpp's rules: the generation parameters of /completion and the chat endpoints (0c1e570's schema,
tools/server/server-schema.cpp) are typed: a wrong JSON type is a 400 naming the field (b8462 fell back to the
default there). Other fields (json_value) fall back to their default when the type is wrong. Either way numbers
convert between int and float, a bool is not a number, and null means "absent".
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

from .. import dry
from ..engine.tasks import GenParams
from ..sampling import SamplingParams, parse_sampler_letters, parse_sampler_names
from .errors import bad_request
from .prep_cancel import step
from .validate import (INT32, MAX_N_PROBS, MAX_STOP_CHARS, MAX_STOPS, ascii_int, finite_float, int_in_range,
                       json_type, loads)


class Fields:
    """Typed reads of a JSON object: lenient (a wrong type gives the default), or strict (a 400 naming it)."""

    def __init__(self, body: Any, strict: bool = False):
        self.body = body if isinstance(body, dict) else {}
        self.strict = strict

    def _wrong_type(self, key: str, v: Any, want: str) -> None:
        """llama-server 0c1e570's answer to a typed field given another type; null counts as absent."""
        if self.strict and v is not None:
            raise bad_request(f"Field '{key}': [json.exception.type_error.302] type must be {want}, "
                              f"but is {json_type(v)}")

    def has(self, key: str) -> bool:
        return self.body.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        v = self.body.get(key)
        return default if v is None else v

    def int(self, key: str, default: int, lo: int = INT32[0], hi: int = INT32[1]) -> int:
        """A wrong type falls back to the default; a number outside [lo, hi] (int32 unless said) is a 400."""
        v = self.body.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            self._wrong_type(key, v, "number")
            return default
        return int_in_range(key, v, lo, hi)

    def float(self, key: str, default: float) -> float:
        v = self.body.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            self._wrong_type(key, v, "number")
            return default
        return finite_float(key, v)

    def bool(self, key: str, default: bool) -> bool:
        v = self.body.get(key)
        if not isinstance(v, bool):
            self._wrong_type(key, v, "boolean")
            return default
        return v

    def str(self, key: str, default: str = "") -> str:
        v = self.body.get(key)
        return v if isinstance(v, str) else default

    def list(self, key: str, default: list | None = None) -> list:
        v = self.body.get(key)
        return v if isinstance(v, list) else list(default or [])

    def dict(self, key: str, default: dict | None = None) -> dict:
        v = self.body.get(key)
        return v if isinstance(v, dict) else dict(default or {})


@dataclass(frozen=True, slots=True)
class ServerDefaults:
    """What the command line set; a request starts from these (llama.cpp's params_base)."""
    sampling: SamplingParams
    n_predict: int = -1
    n_keep: int = 0
    stop: tuple[str, ...] = ()
    cache_prompt: bool = True
    special: bool = False
    n_ctx: int = 4096


# -- /completion parameters (llama.cpp's params_from_json_cmpl) ---------------------------------------------------

# below this a temperature divides float32 logits into overflow (5e-324 gave "Probabilities contain NaN"); llama.cpp
# reads the field as a float, where 5e-324 is 0: greedy
TEMP_MIN = 1e-30
def gen_params(body: dict, d: ServerDefaults, tokenizer, n_vocab: int) -> GenParams:
    f = Fields(body, strict=True)       # 0c1e570's schema: every number and bool read here is typed (but id_slot)
    s = d.sampling
    penalty_last_n = f.int("repeat_last_n", s.penalty_last_n)
    sampling = replace(
        s, seed=f.int("seed", s.seed, -2**63, 2**64 - 1), temp=f.float("temperature", s.temp),
        top_k=f.int("top_k", s.top_k),
        top_p=f.float("top_p", s.top_p), min_p=f.float("min_p", s.min_p), typ_p=f.float("typical_p", s.typ_p),
        min_keep=f.int("min_keep", s.min_keep),
        penalty_last_n=d.n_ctx if penalty_last_n == -1 else penalty_last_n,
        penalty_repeat=f.float("repeat_penalty", s.penalty_repeat),
        penalty_freq=f.float("frequency_penalty", s.penalty_freq),
        penalty_present=f.float("presence_penalty", s.penalty_present),
        samplers=_samplers(f, s.samplers), ignore_eos=f.bool("ignore_eos", s.ignore_eos),
        logit_bias={**s.logit_bias, **parse_logit_bias(f.raw("logit_bias"), tokenizer, n_vocab)},
        **_more_samplers(f, s, d.n_ctx))
    if sampling.dry_on:      # the breakers' tokens, found here (cached) rather than in the engine's loop
        dry.breakers(tokenizer, sampling.dry_sequence_breakers)
    # llama.cpp: n_predict, else max_completion_tokens (OpenAI's newer name), else max_tokens
    # (only the first of the three names given is read, type-checked included)
    given = next((k for k in ("n_predict", "max_completion_tokens", "max_tokens") if f.has(k)), "n_predict")
    n_predict = f.int(given, d.n_predict)
    # the limit of a vanishing temperature: greedy; a negative one is 0 too (0c1e570 clamps it to its range, b8462
    # kept it, which only matters with dynatemp_range)
    temp = sampling.temp if sampling.temp >= TEMP_MIN else 0.0
    stop = [x for x in f.list("stop", list(d.stop)) if isinstance(x, str)] if f.has("stop") else list(d.stop)
    if len(stop) > MAX_STOPS or any(len(x) > MAX_STOP_CHARS for x in stop):
        raise bad_request(f"'stop' takes at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    return GenParams(
        sampling=replace(sampling, temp=temp), n_predict=n_predict, n_keep=f.int("n_keep", d.n_keep), stop=stop,
        n_probs=max(0, f.int("n_probs", 0, hi=MAX_N_PROBS)), post_sampling_probs=f.bool("post_sampling_probs", False),
        cache_prompt=f.bool("cache_prompt", d.cache_prompt), id_slot=Fields(body).int("id_slot", -1),
        return_tokens=f.bool("return_tokens", False), timings_per_token=f.bool("timings_per_token", False),
        return_progress=f.bool("return_progress", False),
        special=d.special, t_max_predict_ms=f.int("t_max_predict_ms", 0), stream=f.bool("stream", False))


def _more_samplers(f: Fields, s: SamplingParams, n_ctx: int) -> dict:
    """DRY, top-n-sigma, XTC, dynamic temperature, Mirostat and adaptive-p (llamacmp/sampling.py), checked as
    llama-server checks them; where it quietly replaces a bad value (dry_base < 1 by the default) the request is
    refused."""
    dry_last_n = f.int("dry_penalty_last_n", s.dry_penalty_last_n)
    if dry_last_n < -1:
        raise bad_request("Error: dry_penalty_last_n must be >= -1")
    out = dict(
        dry_multiplier=f.float("dry_multiplier", s.dry_multiplier), dry_base=f.float("dry_base", s.dry_base),
        dry_allowed_length=f.int("dry_allowed_length", s.dry_allowed_length),
        dry_penalty_last_n=n_ctx if dry_last_n == -1 else dry_last_n,
        dry_sequence_breakers=_breakers(f.raw("dry_sequence_breakers"), s.dry_sequence_breakers),
        top_n_sigma=f.float("top_n_sigma", s.top_n_sigma),
        xtc_probability=f.float("xtc_probability", s.xtc_probability),
        xtc_threshold=f.float("xtc_threshold", s.xtc_threshold),
        dynatemp_range=f.float("dynatemp_range", s.dynatemp_range),
        dynatemp_exponent=f.float("dynatemp_exponent", s.dynatemp_exponent),
        mirostat=f.int("mirostat", s.mirostat), mirostat_tau=f.float("mirostat_tau", s.mirostat_tau),
        mirostat_eta=f.float("mirostat_eta", s.mirostat_eta),
        adaptive_target=f.float("adaptive_target", s.adaptive_target),
        adaptive_decay=f.float("adaptive_decay", s.adaptive_decay))
    if out["mirostat"] not in (0, 1, 2):
        raise bad_request(f"'mirostat' takes 0, 1 or 2, got {out['mirostat']}")
    if out["dry_multiplier"] != 0.0 and out["dry_base"] < 1.0:
        raise bad_request(f"'dry_base' must be at least 1 when DRY is on, got {out['dry_base']}")
    return out


def _breakers(v: Any, default: tuple[str, ...]) -> tuple[str, ...]:
    """A non-empty array of non-empty strings. SillyTavern (and koboldcpp, text-generation-webui) send the array
    as a JSON string, which llama-server ignores (its default breakers instead); llamacmp reads it."""
    if v is None:
        return default
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except (ValueError, RecursionError):
            v = None
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise bad_request("Error: dry_sequence_breakers must be a non-empty array of strings")
    return tuple(v)


def _samplers(f: Fields, default: tuple[str, ...]) -> tuple[str, ...]:
    v = f.raw("samplers")
    try:
        if isinstance(v, list):
            return parse_sampler_names(";".join(x for x in v if isinstance(x, str)))
        if isinstance(v, str):
            return parse_sampler_letters(v)
    except ValueError as e:
        raise bad_request(str(e)) from None
    return default


def parse_logit_bias(v: Any, tokenizer, n_vocab: int) -> dict[int, float]:
    """[[tok|"text", bias|false], ...] or {"tok"|"text": bias|false}; false bans the token; a string applies
    the bias to each of its tokens."""
    pairs: list[tuple[Any, Any]] = []
    if isinstance(v, list):
        pairs = [(e[0], e[1]) for e in v if isinstance(e, list) and len(e) == 2]
    elif isinstance(v, dict):
        pairs = [(k if ascii_int(k) is None else ascii_int(k), b) for k, b in v.items()]
    out: dict[int, float] = {}
    for tok, bias in pairs:
        if bias is False:
            value = -math.inf
        elif isinstance(bias, (int, float)) and not isinstance(bias, bool):
            value = float(bias)
        else:
            continue
        ids = [tok] if isinstance(tok, int) else tokenizer.encode(tok, parse_special=False) \
            if isinstance(tok, str) else []
        for t in ids:
            if 0 <= t < n_vocab:
                out[t] = value
    return out


# -- prompts -----------------------------------------------------------------------------------------------------

def _is_token(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def tokenize_prompts(prompt: Any, tokenizer, n_vocab: int) -> list[list[int]]:
    """A string, a token list, a mixed list, {"prompt_string": ...}, or a list of those (one result each)."""
    if isinstance(prompt, list) and prompt and not any(_is_token(x) for x in prompt):
        out = []
        for p in prompt:
            step()                      # a long list of prompts: stop between them if the client has left
            out.append(_subprompt(p, tokenizer, n_vocab))
    else:
        out = [_subprompt(prompt, tokenizer, n_vocab)]
    if not out:
        raise bad_request('"prompt" must not be empty')
    return out


def _subprompt(p: Any, tokenizer, n_vocab: int) -> list[int]:
    if isinstance(p, str):
        return tokenizer.encode(p, parse_special=True, add_special=True)
    if isinstance(p, list) and all(_is_token(x) or isinstance(x, str) for x in p):
        toks: list[int] = []
        for i, x in enumerate(p):
            toks.extend([x] if _is_token(x) else tokenizer.encode(x, parse_special=True, add_special=i == 0))
        bad = [t for t in toks if not 0 <= t < n_vocab]
        if bad:
            raise bad_request(f"invalid token id {bad[0]} in \"prompt\" (vocabulary has {n_vocab} tokens)")
        return toks
    if isinstance(p, dict) and isinstance(p.get("prompt_string"), str):
        if p.get("multimodal_data"):
            raise bad_request("Multimodal data provided, but model does not support multimodal requests.")
        return tokenizer.encode(p["prompt_string"], parse_special=True, add_special=True)
    raise bad_request('"prompt" elements must be a string, a list of tokens, a JSON object containing a prompt '
                      'string, or a list of mixed strings & tokens.')


def parse_json_body(raw: bytes) -> dict:
    """The body as a JSON object (validate.loads: strict numbers, bounded depth, valid Unicode). llama.cpp
    answers a parse error with 500 and the parser's message; it is the client's error: 400 here."""
    return loads(raw)


def oai_stop(body: dict) -> dict:
    """OpenAI routes accept `stop` as one string."""
    if isinstance(body.get("stop"), str):
        body = {**body, "stop": [body["stop"]]}
    return body
