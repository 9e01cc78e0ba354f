"""Request-body schemas for the OpenAPI document (what schemathesis and API browsers see).

Handlers read bodies leniently (schemas.py), so these describe the common shape, not every accepted variant.
"""
from __future__ import annotations

_PART = {"oneOf": [{"type": "object", "required": ["type", "text"],
                    "properties": {"type": {"const": "text"}, "text": {"type": "string"}}},
                   {"type": "object", "required": ["type", "image_url"],
                    "properties": {"type": {"const": "image_url"},
                                   "image_url": {"type": "object", "required": ["url"],
                                                 "properties": {"url": {"type": "string"}}}}}]}
_TOOL_CALL = {"type": "object", "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}
_MESSAGE = {"type": "object", "required": ["role", "content"],
            "properties": {"role": {"type": "string", "enum": ["system", "user", "assistant", "tool", "developer"]},
                           "content": {"oneOf": [{"type": ["string", "null"]}, {"type": "array", "items": _PART}]},
                           "tool_calls": {"type": "array", "items": _TOOL_CALL}}}
_TOOL = {"type": "object", "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}}}}}

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
                                  "grammar": {"type": "string"}, "json_schema": {"type": "object"}, **_SAMPLING}},
    "chat": {"type": "object", "required": ["messages"],
             "properties": {"messages": {"type": "array", "items": _MESSAGE}, "model": {"type": "string"},
                            "tools": {"type": "array", "items": _TOOL},
                            "tool_choice": {"type": "string", "enum": ["auto", "none", "required"]},
                            "chat_template_kwargs": {"type": "object"}, **_SAMPLING}},
    "tokenize": {"type": "object", "properties": {"content": {"type": "string"},
                                                  "add_special": {"type": "boolean"},
                                                  "parse_special": {"type": "boolean"},
                                                  "with_pieces": {"type": "boolean"}}},
    "detokenize": {"type": "object", "properties": {"tokens": {"type": "array", "items": {"type": "integer"}}}},
    "slot_action": {"type": "object", "properties": {"filename": {"type": "string"}}},
    "object": {"type": "object"},
}


def slot_action_query(can_save: bool) -> list[dict]:
    """?action=: save and restore only where --slot-save-path is set (elsewhere they answer 501)."""
    actions = ["save", "restore", "erase"] if can_save else ["erase"]
    return [{"name": "action", "in": "query", "required": True, "schema": {"type": "string", "enum": actions}}]


def body_doc(kind: str, parameters: list | None = None) -> dict:
    doc = {"requestBody": {"required": True, "content": {"application/json": {"schema": SCHEMAS[kind]}}}}
    return {**doc, "parameters": parameters} if parameters else doc
