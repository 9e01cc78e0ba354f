"""The fixed requests that compat/gen_server_goldens.py sends to llama-server ≈ b8462 and tests/test_compat_server.py
sends to llamacmp-server, both on the same fixture (tiny shape, real Qwen3.5 vocabulary and template, FIXTURE_SEED).

Every generating request is greedy (temperature 0) with a small n_predict, so its text and token ids are a function
of the weights: llama.cpp's and our forward pass agree on this fixture (compat/goldens/logits), which makes them
comparable exactly. `server` says which instance answers: "main" or "auth" (the same model with --api-key).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

FIXTURE_SEED = 21
FIXTURE_NAME = "fixture.gguf"     # the model id both servers report is the file name
API_KEY = "compat-secret"
# both servers run with these (llama.cpp's defaults otherwise); f32 KV and no flash attention keep greedy
# continuations off float near-ties, as in compat/gen_logits_goldens.py
SERVER_FLAGS = ["-c", "512", "-np", "1", "--jinja", "-t", "2", "-ctk", "f32", "-ctv", "f32", "-fa", "off"]


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    path: str
    body: object = None              # a JSON value, or a str sent as the raw body (malformed JSON)
    stream: bool = False
    server: str = "main"
    headers: dict = field(default_factory=dict)


G = {"temperature": 0}               # greedy
DRY = {"dry_multiplier": 100.0, "dry_allowed_length": 1}
CHAT = [{"role": "user", "content": "Hi"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
LONG_PROMPT = "hello " * 700         # > 512 tokens: more than the context holds

CASES: list[Case] = [
    # --- metadata
    Case("health", "GET", "/health"),
    Case("v1_models", "GET", "/v1/models"),
    Case("models", "GET", "/models"),
    Case("props", "GET", "/props"),
    Case("slots", "GET", "/slots"),
    # --- /completion (llama.cpp's native API)
    Case("completion_plain", "POST", "/completion", {"prompt": "Hello", "n_predict": 8, **G}),
    Case("completion_return_tokens", "POST", "/completion",
         {"prompt": "Hello", "n_predict": 8, "return_tokens": True, **G}),
    Case("completion_n_probs", "POST", "/completion", {"prompt": "Hello", "n_predict": 3, "n_probs": 2, **G}),
    Case("completion_stop", "POST", "/completion", {"prompt": "Hello", "n_predict": 8, "stop": ["\t"], **G}),
    Case("completion_token_prompt", "POST", "/completion", {"prompt": [9419, 11, 1879], "n_predict": 4, **G}),
    # --- the samplers beyond the default chain, where greedy output still shows them: a logit bias makes token 11
    # the choice unless DRY penalises it (it followed 9419 before, and then itself); a breaker or a short window
    # stops that; XTC at probability 1 always drops the top choices; Mirostat, and a dynamic temperature over one
    # candidate (top_k 1), leave greedy alone
    *[Case(f"completion_{name}", "POST", "/completion",
           {"prompt": [9419, 11, 1879, 9419], "n_predict": 8, "return_tokens": True, "logit_bias": [[11, 50]],
            **G, **body})
      for name, body in (("dry", DRY), ("dry_breaker", {**DRY, "dry_sequence_breakers": [","]}),
                         ("dry_window", {**DRY, "dry_penalty_last_n": 2}))],
    Case("completion_xtc", "POST", "/completion",
         {"prompt": "Hello", "n_predict": 6, "return_tokens": True, "xtc_probability": 1.0, "xtc_threshold": 0.001,
          **G}),
    Case("completion_mirostat_greedy", "POST", "/completion",
         {"prompt": "Hello", "n_predict": 6, "return_tokens": True, "mirostat": 2, "mirostat_tau": 4.0, **G}),
    Case("completion_dynatemp_greedy", "POST", "/completion",
         {"prompt": "Hello", "n_predict": 6, "return_tokens": True, "top_k": 1, "dynatemp_range": 0.5,
          "dynatemp_exponent": 2.0, **G}),
    Case("completion_stream", "POST", "/completion", {"prompt": "Hello", "n_predict": 3, "stream": True, **G},
         stream=True),
    Case("completions_alias", "POST", "/completions", {"prompt": "Hello", "n_predict": 4, **G}),
    # --- OpenAI completions
    Case("v1_completions", "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 6, **G}),
    Case("v1_completions_stream", "POST", "/v1/completions",
         {"prompt": "Hello", "max_tokens": 3, "stream": True, **G}, stream=True),
    Case("v1_completions_logprobs", "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 3, "logprobs": 2, **G}),
    # --- OpenAI chat
    Case("chat_plain", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, **G}),
    Case("chat_alias", "POST", "/chat/completions", {"messages": CHAT, "max_tokens": 4, **G}),
    Case("chat_no_thinking", "POST", "/v1/chat/completions",
         {"messages": CHAT, "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}, **G}),
    Case("chat_system", "POST", "/v1/chat/completions",
         {"messages": [{"role": "system", "content": "Be brief."}, *CHAT], "max_tokens": 6,
          "chat_template_kwargs": {"enable_thinking": False}, **G}),
    Case("chat_stream", "POST", "/v1/chat/completions",
         {"messages": CHAT, "max_tokens": 4, "stream": True, "chat_template_kwargs": {"enable_thinking": False}, **G},
         stream=True),
    Case("chat_stream_usage", "POST", "/v1/chat/completions",
         {"messages": CHAT, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
          "chat_template_kwargs": {"enable_thinking": False}, **G}, stream=True),
    Case("chat_stream_thinking", "POST", "/v1/chat/completions",
         {"messages": CHAT, "max_tokens": 4, "stream": True, **G}, stream=True),
    Case("chat_logprobs", "POST", "/v1/chat/completions",
         {"messages": CHAT, "max_tokens": 3, "logprobs": True, "top_logprobs": 2,
          "chat_template_kwargs": {"enable_thinking": False}, **G}),
    Case("chat_tools", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS, "max_tokens": 6,
          "chat_template_kwargs": {"enable_thinking": False}, **G}),
    Case("chat_stop", "POST", "/v1/chat/completions",
         {"messages": CHAT, "max_tokens": 8, "stop": ["\t"], "chat_template_kwargs": {"enable_thinking": False}, **G}),
    Case("chat_n_predict_alias", "POST", "/v1/chat/completions",
         {"messages": CHAT, "n_predict": 3, "chat_template_kwargs": {"enable_thinking": False}, **G}),
    # --- tokenizer and template
    Case("tokenize", "POST", "/tokenize", {"content": "Hello world, 123 ✓"}),
    Case("tokenize_pieces", "POST", "/tokenize", {"content": "Hello world, 123 ✓", "with_pieces": True}),
    Case("tokenize_special", "POST", "/tokenize", {"content": "<|im_start|>user", "add_special": True,
                                                   "parse_special": True}),
    Case("detokenize", "POST", "/detokenize", {"tokens": [9419, 1879, 11, 220, 16, 17, 18]}),
    Case("apply_template", "POST", "/apply-template", {"messages": CHAT}),
    Case("apply_template_tools", "POST", "/apply-template",
         {"messages": CHAT, "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}),
    # --- errors
    Case("err_bad_json", "POST", "/completion", '{"prompt": "Hello", '),
    Case("err_unknown_route", "GET", "/no/such/route"),
    Case("err_context_overflow", "POST", "/completion", {"prompt": LONG_PROMPT, "n_predict": 4, **G}),
    Case("err_chat_context_overflow", "POST", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 4, **G}),
    # a wrong-typed generation parameter: b8462 falls back to its default (n_predict "four" would generate until the
    # context is full, so the cheap n_probs is the one asked about), 0c1e570 answers 400 naming the field
    Case("wrong_type_n_probs", "POST", "/completion", {"prompt": "Hello", "n_predict": 3, "n_probs": "two", **G}),
    Case("err_messages_not_array", "POST", "/v1/chat/completions", {"messages": "Hi", **G}),
    Case("err_missing_prompt", "POST", "/completion", {"n_predict": 4}),
    Case("err_missing_messages", "POST", "/v1/chat/completions", {"max_tokens": 4}),
    Case("err_tools_and_grammar", "POST", "/v1/chat/completions",
         {"messages": CHAT, "tools": TOOLS, "grammar": "root ::= \"a\"", "max_tokens": 4, **G}),
    Case("err_enable_thinking_string", "POST", "/v1/chat/completions",
         {"messages": CHAT, "max_tokens": 4, "chat_template_kwargs": {"enable_thinking": "false"}, **G}),
    Case("err_detokenize_bad_tokens", "POST", "/detokenize", {"tokens": "abc"}),
    Case("err_embeddings_off", "POST", "/v1/embeddings", {"input": "Hello"}),
    # --- authentication (second instance, --api-key)
    Case("auth_missing_key", "POST", "/completion", {"prompt": "Hello", "n_predict": 2, **G}, server="auth"),
    Case("auth_wrong_key", "GET", "/v1/models", server="auth", headers={"Authorization": "Bearer nope"}),
    Case("auth_wrong_key_completion", "POST", "/completion", {"prompt": "Hello", "n_predict": 2, **G}, server="auth",
         headers={"Authorization": "Bearer nope"}),
    Case("auth_good_key", "POST", "/completion", {"prompt": "Hello", "n_predict": 2, **G}, server="auth",
         headers={"Authorization": f"Bearer {API_KEY}"}),
    Case("auth_health_public", "GET", "/health", server="auth"),
]


# ---------------------------------------------------------------------------------------------------------------
# How an answer is recorded: the JSON field tree as {path: json type} (array elements merged under "[]"), exact
# values of the fields that are a function of the model and the request, and probabilities (float arithmetic:
# compared within APPROX_TOL). Volatile fields (ids, created, system_fingerprint, timings, t/s, slot bookkeeping)
# stay in the type tree only.

EXACT_KEYS = {
    "content", "text", "reasoning_content", "tokens", "finish_reason", "stop_type", "stopping_word", "stop",
    "tokens_predicted", "tokens_evaluated", "truncated", "token", "bytes", "piece", "type", "code", "message",
    "status", "prompt_tokens", "completion_tokens", "total_tokens", "object", "role", "model", "n_ctx",
    "total_slots", "chat_template", "prompt", "name", "arguments", "index", "has_new_line", "owned_by",
}
APPROX_KEYS = {"logprob", "prob"}
APPROX_TOL = 1e-3
# subtrees that echo settings or measure time: their leaves are typed, never valued
UNVALUED = ("timings", "generation_settings", "default_generation_settings", "meta", "webui_settings")


def json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def record(value) -> dict:
    """{"types": {path: "t1|t2"}, "exact": {concrete path: value}, "approx": {concrete path: float}}."""
    types: dict[str, set] = {}
    exact, approx = {}, {}

    def walk(v, path: str, concrete: str, key: str | None, valued: bool) -> None:
        types.setdefault(path or "$", set()).add(json_type(v))
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else k, f"{concrete}.{k}" if concrete else k, k,
                     valued and k not in UNVALUED)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[]", f"{concrete}[{i}]", key, valued)
        elif valued and key in APPROX_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
            approx[concrete] = v
        elif valued and (key in EXACT_KEYS or (key == "id" and isinstance(v, int))):
            exact[concrete] = v

    walk(value, "", "", None, True)
    return {"types": {p: "|".join(sorted(t)) for p, t in types.items()}, "exact": exact, "approx": approx}


def parse_sse(text: str) -> tuple[list, str | None]:
    """The data payloads of an event stream (JSON, or the raw text where it is not JSON) and the end marker."""
    chunks, end = [], None
    for line in text.split("\n"):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            end = "[DONE]"
            continue
        try:
            chunks.append(json.loads(data))
        except ValueError:
            chunks.append(data)
    return chunks, end


def answer_record(case: Case, status: int, body: str, content_type: str) -> dict:
    """What is stored (and compared) for one answer."""
    out = {"id": case.id, "status": status}
    if case.stream and status == 200 and "text/event-stream" in content_type:
        chunks, end = parse_sse(body)
        out["chunks"] = [record(c) for c in chunks]
        out["end"] = end
        return out
    try:
        out.update(record(json.loads(body)))
    except ValueError:
        out["raw"] = body                  # not JSON (a plain-text 404, say): recorded as text
    return out


def send(client, base: str, case: Case) -> dict:
    """Send one case with an httpx.Client and return its record."""
    headers = dict(case.headers)
    kw = {}
    if isinstance(case.body, str):
        kw["content"] = case.body.encode()
        headers["Content-Type"] = "application/json"
    elif case.body is not None:
        kw["json"] = case.body
    with client.stream(case.method, base + case.path, headers=headers, **kw) as r:
        body = r.read().decode("utf-8", "replace")
        return answer_record(case, r.status_code, body, r.headers.get("content-type", ""))


# ---------------------------------------------------------------------------------------------------------------
# Comparison: every field llama.cpp sends is present with the same type; exact values equal; probabilities within
# APPROX_TOL. Our extra fields are allowed (a client ignores what it does not know).

def _same_type(want: str, got: str) -> bool:
    w, g = set(want.split("|")), set(got.split("|"))
    if "number" in w:                      # a float that happens to be whole may print as an integer
        g = {"number" if t == "integer" else t for t in g}
    return g == w


def _compare_tree(want: dict, got: dict, where: str) -> tuple[list[str], bool]:
    problems = []
    for p, t in want.get("types", {}).items():
        if p not in got.get("types", {}):
            problems.append(f"{where}{p}: missing ({t})")
        elif not _same_type(t, got["types"][p]):
            problems.append(f"{where}{p}: type {got['types'][p]} != {t}")
    for p, v in want.get("exact", {}).items():
        if got.get("exact", {}).get(p, "<absent>") != v:
            problems.append(f"{where}{p}: {got.get('exact', {}).get(p, '<absent>')!r} != {v!r}")
    if "raw" in want and want["raw"] != got.get("raw"):
        problems.append(f"{where}raw body {got.get('raw', '<json>')!r:.80} != {want['raw']!r:.80}")
    close = []
    for p, v in want.get("approx", {}).items():
        g = got.get("approx", {}).get(p)
        if g is None or abs(g - v) > APPROX_TOL:
            problems.append(f"{where}{p}: {g!r} != {v!r} (±{APPROX_TOL})")
        elif g != v:
            close.append(p)
    return problems, bool(close) and not problems


def compare(want: dict, got: dict) -> tuple[str, list[str]]:
    """("identical" | "within" | "different", problems)."""
    problems = []
    if want["status"] != got["status"]:
        problems.append(f"status {got['status']} != {want['status']}")
    within = False
    if "chunks" in want:
        if "chunks" not in got:
            problems.append("not an event stream")
        else:
            if want["end"] != got["end"]:
                problems.append(f"end marker {got['end']!r} != {want['end']!r}")
            if len(want["chunks"]) != len(got["chunks"]):
                problems.append(f"{len(got['chunks'])} chunks != {len(want['chunks'])}")
            for i, (w, g) in enumerate(zip(want["chunks"], got["chunks"])):
                p, close = _compare_tree(w, g, f"chunk {i}: ")
                problems += p
                within |= close
    else:
        p, within = _compare_tree(want, got, "")
        problems += p
    if problems:
        return "different", problems
    return ("within" if within else "identical"), []
