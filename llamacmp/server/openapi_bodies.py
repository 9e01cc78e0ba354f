"""Request-body schemas for the OpenAPI document (what schemathesis and API browsers see).

Handlers read bodies leniently (schemas.py), so these describe the common shape, not every accepted variant.
"""
from __future__ import annotations

_MESSAGE = {"type": "object", "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant", "tool", "developer"]},
                           "content": {"type": ["string", "null"]}}}

_SAMPLING = {"temperature": {"type": "number"}, "top_k": {"type": "integer"}, "top_p": {"type": "number"},
             "min_p": {"type": "number"}, "seed": {"type": "integer"}, "n_predict": {"type": "integer"},
             "max_tokens": {"type": "integer"}, "stream": {"type": "boolean"},
             "stop": {"type": "array", "items": {"type": "string"}}, "n_probs": {"type": "integer"},
             "cache_prompt": {"type": "boolean"}, "id_slot": {"type": "integer"},
             "logit_bias": {"type": "object", "additionalProperties": {"type": "number"}}}

SCHEMAS = {
    "completion": {"type": "object", "required": ["prompt"],
                   "properties": {"prompt": {"oneOf": [{"type": "string"},
                                                       {"type": "array", "items": {"type": "integer"}}]},
                                  **_SAMPLING}},
    "chat": {"type": "object", "required": ["messages"],
             "properties": {"messages": {"type": "array", "items": _MESSAGE}, "model": {"type": "string"},
                            "tools": {"type": "array", "items": {"type": "object"}},
                            "tool_choice": {"type": "string", "enum": ["auto", "none", "required"]},
                            "chat_template_kwargs": {"type": "object"}, **_SAMPLING}},
    "tokenize": {"type": "object", "properties": {"content": {"type": "string"},
                                                  "add_special": {"type": "boolean"},
                                                  "parse_special": {"type": "boolean"},
                                                  "with_pieces": {"type": "boolean"}}},
    "detokenize": {"type": "object", "properties": {"tokens": {"type": "array", "items": {"type": "integer"}}}},
    "object": {"type": "object"},
}


def body_doc(kind: str) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": SCHEMAS[kind]}}}}
