"""The jinja2 sandbox chat templates render in, with the helpers real templates call (HF transformers' tojson,
raise_exception, strftime_now). Its own module so that the template renderer (chat.py) and the template probes
(template_caps.py) share it without importing each other."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    """The template raised (raise_exception) or failed to render; the message says which."""


# -- helpers real templates call ------------------------------------------------------------------------------------

def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    """HF transformers' tojson: no HTML escaping (jinja's own would turn < into \\u003c), keys kept in order."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=tuple(separators) if separators else None, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _date_context() -> dict:
    """The variables llama.cpp gives every template besides the messages (Llama 3.x reads date_string)."""
    now = datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


class _Sandbox(ImmutableSandboxedEnvironment):
    """The sandbox, with `*` and `**` checked before they run: jinja folds constant expressions when it compiles
    a template, so `{{ 'x' * 2000000000 }}` in a GGUF's template would allocate 2 GB at load (and `9 ** 9 ** 9`
    never end); at render time the same goes for client data."""
    intercepted_binops = frozenset({"*", "**"})
    MAX_ITEMS = 1 << 24                  # characters or elements a repetition may make

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > self.MAX_ITEMS:
                    raise TemplateError(f"chat template: a repetition of {len(seq) * n} items is too large")
        elif isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 256:
            raise TemplateError(f"chat template: {left} ** {right} is too large")
        return super().call_binop(context, operator, left, right)


def make_environment() -> ImmutableSandboxedEnvironment:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
