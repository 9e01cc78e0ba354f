"""llama.cpp's built-in chat formats: names, detection and rendering against llama.cpp's own asserted outputs
(compat/goldens/builtin_templates_*.json, from tests/test-chat-template.cpp of b8462 and 0c1e570), and how
--chat-template / --jinja / --no-jinja pick a template in the server and the CLIs."""
from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from llamacmp import chat_builtin
from llamacmp.args import parse_args
from llamacmp.arg_values import ArgError
from llamacmp.chat import BuiltinTemplate, ChatTemplate, TemplateError, select_template
from llamacmp.fixtures.writer import TEMPLATE_PATH

sys.path.insert(0, str(Path(__file__).parent))
from server_harness import LiveServer, write_tiny_model  # noqa: E402

GOLDENS = Path(__file__).parent.parent / "compat" / "goldens"
ORACLES = ("b8462", "0c1e570")
QWEN35 = TEMPLATE_PATH.read_text()


def _golden(label: str) -> dict:
    return json.loads((GOLDENS / f"builtin_templates_{label}.json").read_text())


def _cases():
    for label in ORACLES:
        g = _golden(label)
        for c in g["cases"]:
            yield pytest.param(g["conversation"] + c.get("extra_conversation", []), c,
                               id=f"{label}-{c['name']}")


@pytest.mark.parametrize("conversation,case", list(_cases()))
def test_llamacpp_asserted_outputs(conversation, case):
    """llama.cpp's test: the template source is recognised, and the conversation renders to its expected text."""
    name = chat_builtin.detect(case["template_str"])
    assert name is not None
    chat = [(m["role"], m["content"]) for m in conversation]
    assert chat_builtin.render(name, chat, True) == case["expected_output"]


@pytest.mark.parametrize("label", ORACLES)
def test_every_llamacpp_name_is_known(label):
    names = _golden(label)["builtin_names"]
    assert len(names) >= 50
    assert set(names) <= set(chat_builtin.BUILTIN_NAMES)
    for n in names:      # a name is its own format, and each renders a conversation
        assert chat_builtin.detect(n) == n
        assert "Hi" in chat_builtin.render(n, [("user", "Hi")], True)


def test_unknown_text_is_no_builtin_format():
    assert chat_builtin.detect("INVALID TEMPLATE") is None


def test_qwen35_template_is_chatml_without_jinja():
    assert chat_builtin.detect(QWEN35) == "chatml"


# -- picking the template -------------------------------------------------------------------------------------------

META = {"tokenizer.chat_template": QWEN35}
MSGS = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]
COMMAND_R = ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
             "<|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")


@pytest.mark.parametrize("use_jinja", [True, False])
def test_name_selects_builtin_format(use_jinja):
    t = select_template(META, None, "command-r", use_jinja)
    assert isinstance(t, BuiltinTemplate) and t.builtin == "command-r"
    assert t.render(MSGS) == COMMAND_R        # llama.cpp's tools/server/tests test_apply_chat_template


def test_chatml_name_with_jinja_is_llamacpp_chatml_jinja():
    t = select_template(META, None, "chatml", True)
    assert isinstance(t, ChatTemplate)
    assert t.render(MSGS) == ("<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                              "<|im_start|>assistant\n")


def test_no_jinja_renders_gguf_template_as_detected_format():
    """--no-jinja on a Qwen3.5 GGUF: plain chatml, no <think> generation prompt (llama-server's legacy path)."""
    t = select_template(META, None, "", False)
    assert t.builtin == "chatml" and t.source == QWEN35 and not t.supports_thinking
    assert t.render(MSGS).endswith("<|im_start|>assistant\n")
    jinja = select_template(META, None, "", True)
    assert jinja.builtin is None and jinja.render(MSGS).endswith("<think>\n")


def test_no_jinja_unknown_gguf_template_is_refused():
    with pytest.raises(TemplateError, match="not supported, try using --jinja"):
        select_template({"tokenizer.chat_template": "{{ messages[0].content }}"}, None, "", False)


def test_literal_jinja_text_stays_jinja():
    t = select_template(META, None, "This is not a chat template, it is", True)
    assert t.render(MSGS) == "This is not a chat template, it is"


def test_date_string_reaches_templates():
    t = ChatTemplate("{{ date_string }}|{{ datetime }}")
    now = datetime.now()
    assert t.render(MSGS) == f"{now.strftime('%d %b %Y')}|{now.strftime('%b %d %Y')}"
    assert ChatTemplate("{{ date_string }}").render(MSGS, extra={"date_string": "x"}) == "x"   # kwargs win


def test_jinja_is_default_and_no_jinja_turns_it_off():
    assert parse_args("server", []).params.use_jinja
    assert parse_args("cli", []).params.use_jinja
    assert not parse_args("server", ["--no-jinja"]).params.use_jinja


def test_bad_override_refused_at_start():
    with pytest.raises(ArgError, match="not supported: bogus\nnote: llama.cpp was started without --jinja"):
        parse_args("server", ["--no-jinja", "--chat-template", "bogus"])
    with pytest.raises(ArgError, match="not supported"):
        parse_args("server", ["--chat-template", "{% if %}"])
    assert parse_args("server", ["--no-jinja", "--chat-template", "llama3"]).params.chat_template == "llama3"


# -- in the server ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


def test_server_builtin_name(model):
    with LiveServer(model, "--chat-template", "command-r") as s:
        r = httpx.post(s.url + "/apply-template", json={"messages": MSGS})
        assert r.status_code == 200 and r.json()["prompt"] == COMMAND_R
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 3, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
        assert r.status_code == 400 and "built-in format 'command-r'" in r.json()["error"]["message"]


def test_server_no_jinja(model):
    with LiveServer(model, "--no-jinja") as s:
        r = httpx.post(s.url + "/apply-template", json={"messages": MSGS})
        assert r.json()["prompt"] == ("<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\n"
                                      "Hi there<|im_end|>\n<|im_start|>assistant\n")
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4, "temperature": 0})
        msg = r.json()["choices"][0]["message"]
        assert "reasoning_content" not in msg and r.json()["usage"]["completion_tokens"] == 4
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": MSGS, "tool_choice": "required"})
        assert r.status_code == 400 and r.json()["error"]["message"] == "tool_choice param requires --jinja flag"
        assert re.search(r"<\|im_start\|>", httpx.get(s.url + "/props").json()["chat_template"])


# -- in the CLIs --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [["--chat-template", "llama3"], ["--no-jinja", "--chat-template", "llama3"]])
def test_repl_builtin_name(model, flags):
    from test_cli import run
    r = run("cli", "-m", str(model), "-p", "Hi", "-st", "-n", "2", "-sys", "Be brief", "--verbose-prompt",
            "--no-show-timings", *flags)
    out = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 0, r.stderr.decode()
    assert ("<|start_header_id|>system<|end_header_id|>\n\nBe brief<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n") in out
    assert "llama3" not in out.replace("--chat-template", "")


def test_completion_conversation_no_jinja_builtin(model):
    from test_cli import run
    r = run("completion", "-m", str(model), "-cnv", "-p", "Hi", "-st", "-n", "2", "--chat-template", "gemma",
            "--verbose-prompt")
    assert r.returncode == 0, r.stderr.decode()
    assert "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n" in r.stdout.decode("utf-8", "replace")
