"""llama.cpp's built-in chat formats (src/llama-chat.cpp): the names `--chat-template` accepts besides jinja text,
the rules that recognise a GGUF template as one of them, and each format written out as plain string building.

This is the path llama.cpp takes without jinja (`--no-jinja`, and llama-completion's default): only role and text
reach the format; tools and reasoning switches do not exist there. Written from the formats llama.cpp documents and
asserts in tests/test-chat-template.cpp (compat/goldens/builtin_templates_*.json), not copied from its code.
"""
from __future__ import annotations

from typing import Callable

# Every name of b8462 and of current llama.cpp (0c1e570 adds deepseek-ocr, granite-4.0/4.1, hunyuan-vl).
BUILTIN_NAMES = (
    "chatml", "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "mistral-v1", "mistral-v3",
    "mistral-v3-tekken", "mistral-v7", "mistral-v7-tekken", "phi3", "phi4", "falcon3", "zephyr", "monarch", "gemma",
    "orion", "openchat", "vicuna", "vicuna-orca", "deepseek", "deepseek2", "deepseek3", "deepseek-ocr", "command-r",
    "llama3", "chatglm3", "chatglm4", "glmedge", "minicpm", "exaone3", "exaone4", "exaone-moe", "rwkv-world",
    "granite", "granite-4.0", "granite-4.1", "gigachat", "megrez", "yandex", "bailing", "bailing-think", "bailing2",
    "llama4", "smolvlm", "hunyuan-moe", "gpt-oss", "hunyuan-dense", "hunyuan-vl", "kimi-k2", "seed_oss", "grok-2",
    "pangu-embedded", "solar-open")

Message = tuple[str, str]           # (role, content): all the built-in formats read


def _trim(s: str) -> str:
    return s.strip(" \t\n\v\f\r")   # C isspace, not Python's wider notion of whitespace


# -- detection -------------------------------------------------------------------------------------------------------

def _mistral_family(t: str) -> str:
    if "[SYSTEM_PROMPT]" in t:
        return "mistral-v7"
    if "' [INST] ' + system_message" in t or "[AVAILABLE_TOOLS]" in t:
        if " [INST]" in t:
            return "mistral-v1"
        return "mistral-v3-tekken" if '"[INST]"' in t else "mistral-v3"
    if "content.strip()" in t:
        return "llama2-sys-strip"
    if "bos_token + '[INST]" in t:
        return "llama2-sys-bos"
    return "llama2-sys" if "<<SYS>>" in t else "llama2"


def _all(*needles: str) -> Callable[[str], bool]:
    return lambda t: all(n in t for n in needles)


# (test, format) in llama.cpp's order: the first match wins, so the order is part of the rule
_DETECT: list[tuple[Callable[[str], bool], Callable[[str], str] | str]] = [
    (_all("<|im_start|>"), lambda t: "phi4" if "<|im_sep|>" in t
     else "smolvlm" if "<end_of_utterance>" in t else "chatml"),
    (lambda t: t.startswith("mistral") or "[INST]" in t, _mistral_family),
    (_all("<|assistant|>", "<|end|>"), "phi3"),
    (_all("[gMASK]<sop>"), "chatglm4"),
    (_all("<|assistant|>", "<|user|>"), lambda t: "exaone-moe" if "<|tool_declare|>" in t
     else "falcon3" if "</s>" in t else "glmedge"),
    (_all("<|{{ item['role'] }}|>", "<|begin_of_image|>"), "glmedge"),
    (_all("<|user|>", "<|endoftext|>"), "zephyr"),
    (_all("bos_token + message['role']"), "monarch"),
    (_all("<start_of_turn>"), "gemma"),
    (_all("'\\n\\nAssistant: ' + eos_token"), "orion"),
    (_all("GPT4 Correct "), "openchat"),
    (_all("USER: ", "ASSISTANT: "), lambda t: "vicuna-orca" if "SYSTEM: " in t else "vicuna"),
    (_all("### Instruction:", "<|EOT|>"), "deepseek"),
    (_all("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), "command-r"),
    (_all("<|start_header_id|>", "<|end_header_id|>"), "llama3"),
    (_all("[gMASK]sop"), "chatglm3"),
    (_all("<用户>"), "minicpm"),
    (_all("'Assistant: ' + message['content'] + eos_token"), "deepseek2"),
    (_all("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), "deepseek3"),
    (_all("[|system|]", "[|assistant|]", "[|endofturn|]"), lambda t: "exaone4" if "[|tool|]" in t else "exaone3"),
    (lambda t: "rwkv-world" in t or "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}" in t, "rwkv-world"),
    (_all("<|start_of_role|>"), lambda t: "granite" if "<tool_call>" not in t and "<tools>" not in t
     else "granite-4.0" if "g4_default_system_message" in t else "granite-4.1"),
    (_all("message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]"),
     "gigachat"),
    (_all("<|role_start|>"), "megrez"),
    (_all(" Ассистент:"), "yandex"),
    (_all("<role>ASSISTANT</role>", "'HUMAN'"), "bailing"),
    (_all("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), "bailing-think"),
    (_all("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), "bailing2"),
    (_all("<|header_start|>", "<|header_end|>"), "llama4"),
    (_all("<|endofuserprompt|>"), "dots1"),
    (_all("<|extra_0|>", "<|extra_4|>"), "hunyuan-moe"),
    (_all("<|start|>", "<|channel|>"), "gpt-oss"),
    (_all("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
    (_all("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"), "hunyuan-dense"),
    (_all("<|im_assistant|>assistant<|im_middle|>"), "kimi-k2"),
    (_all("<seed:bos>"), "seed_oss"),
    (_all("'Assistant: '  + message['content'] + '<|separator|>"), "grok-2"),
    (_all("[unused9]系统：[unused10]"), "pangu-embedded"),
    (_all("<|begin|>", "<|end|>", "<|content|>"), "solar-open"),
]


def detect(template: str) -> str | None:
    """A built-in name, or a template source recognised as one of the formats; None: not a built-in format."""
    if template in BUILTIN_NAMES:
        return template
    for test, fmt in _DETECT:
        if test(template):
            return fmt if isinstance(fmt, str) else fmt(template)
    return None


# -- the formats -----------------------------------------------------------------------------------------------------

def _per_message(open_: Callable[[str], str], close: str, gen: str, trim: bool = False):
    """The common shape: each message is open(role) + content + close; the generation prompt is `gen`."""
    def render(chat: list[Message], add_ass: bool) -> str:
        out = "".join(open_(r) + (_trim(c) if trim else c) + close for r, c in chat)
        return out + (gen if add_ass else "")
    return render


def _by_role(table: dict[str, tuple[str, str]], gen: str, trim: bool = False, other: str | None = None,
             default: tuple[str, str] | None = None):
    """Each role has its own (prefix, suffix); a role not in the table takes `other`'s or `default`, or is
    left out."""
    def render(chat: list[Message], add_ass: bool) -> str:
        out = ""
        for r, c in chat:
            pre_suf = table.get(r) or (table[other] if other else default)
            if pre_suf:
                out += pre_suf[0] + (_trim(c) if trim else c) + pre_suf[1]
        return out + (gen if add_ass else "")
    return render


def _mistral_v7(space: str):
    return _by_role({"system": ("[SYSTEM_PROMPT]" + space, "[/SYSTEM_PROMPT]"), "user": ("[INST]" + space, "[/INST]"),
                     "assistant": (space, "</s>")}, "", other="assistant")


def _mistral(name: str):
    lead = " " if name == "mistral-v1" else ""
    trail = "" if name == "mistral-v3-tekken" else " "

    def render(chat: list[Message], add_ass: bool) -> str:
        out, inside = "", False
        for r, c in chat:
            if not inside:
                out, inside = out + lead + "[INST]" + trail, True
            if r == "system":
                out += c + "\n\n"
            elif r == "user":
                out += c + lead + "[/INST]"
            else:
                out += trail + (_trim(c) if name == "mistral-v3" else c) + "</s>"
                inside = False
        return out
    return render


def _llama2(name: str):
    def render(chat: list[Message], add_ass: bool) -> str:
        out, inside = "[INST] ", True           # no BOS at the very start: the tokenizer adds it
        for r, c in chat:
            c = _trim(c) if name == "llama2-sys-strip" else c
            if not inside:
                out, inside = out + ("<s>[INST] " if name == "llama2-sys-bos" else "[INST] "), True
            if r == "system":
                out += f"<<SYS>>\n{c}\n<</SYS>>\n\n" if name != "llama2" else c + "\n"
            elif r == "user":
                out += c + " [/INST]"
            else:
                out, inside = out + c + "</s>", False
        return out
    return render


def _merge_system(user_turn: Callable[[str, str], str], model_turn: Callable[[str], str], gen: str, trim: bool):
    """Formats with no system role (gemma, orion): the system text goes in front of the next user turn."""
    def render(chat: list[Message], add_ass: bool) -> str:
        out, system = "", ""
        for r, c in chat:
            if r == "system":
                system += _trim(c) if trim else c
            elif r == "user":
                out += user_turn(system, _trim(c) if trim else c)
                system = ""
            else:
                out += model_turn(_trim(c) if trim else c)
        return out + (gen if add_ass else "")
    return render


def _gemma():
    """No system role: its text opens the next turn that is not the model's; assistant is called model."""
    def render(chat: list[Message], add_ass: bool) -> str:
        out, system = "", ""
        for r, c in chat:
            if r == "system":
                system += _trim(c)
                continue
            role = "model" if r == "assistant" else r
            out += f"<start_of_turn>{role}\n"
            if system and role != "model":
                out, system = out + system + "\n\n", ""
            out += _trim(c) + "<end_of_turn>\n"
        return out + ("<start_of_turn>model\n" if add_ass else "")
    return render


def _monarch(chat: list[Message], add_ass: bool) -> str:
    out = "".join(("" if i == 0 else "<s>") + f"{r}\n{c}</s>\n" for i, (r, c) in enumerate(chat))
    return out + ("<s>assistant\n" if add_ass else "")


def _openchat(chat: list[Message], add_ass: bool) -> str:
    out = "".join(c + "<|end_of_turn|>" if r == "system" else f"GPT4 Correct {r[:1].upper()}{r[1:]}: {c}<|end_of_turn|>"
                  for r, c in chat)
    return out + ("GPT4 Correct Assistant:" if add_ass else "")


def _minicpm(chat: list[Message], add_ass: bool) -> str:
    return "".join("<用户>" + _trim(c) + "<AI>" if r == "user" else _trim(c) for r, c in chat)


def _rwkv(chat: list[Message], add_ass: bool) -> str:
    out = ""
    for i, (r, c) in enumerate(chat):
        if r == "system":
            out += f"System: {_trim(c)}\n\n"
        elif r == "user":
            out += f"User: {_trim(c)}\n\n" + ("Assistant:" if i == len(chat) - 1 else "")
        elif r == "assistant":
            out += f"Assistant: {_trim(c)}\n\n"
    return out


def _granite(tool_role_as_assistant: bool):
    def render(chat: list[Message], add_ass: bool) -> str:
        out = ""
        for r, c in chat:
            if r == "assistant_tool_call":
                out += ("<|start_of_role|>assistant<|end_of_role|>" if tool_role_as_assistant
                        else "<|start_of_role|>assistant_tool_call<|end_of_role|>") + "<|tool_call|>"
            else:
                out += f"<|start_of_role|>{r}<|end_of_role|>"
            out += c + "<|end_of_text|>\n"
        return out + ("<|start_of_role|>assistant<|end_of_role|>" if add_ass else "")
    return render


def _gigachat(chat: list[Message], add_ass: bool) -> str:
    has_system = bool(chat) and chat[0][0] == "system"
    out = "<s>" + (chat[0][1] + "<|message_sep|>" if has_system else "")
    for r, c in chat[1 if has_system else 0:]:
        if r == "user":
            out += f"user<|role_sep|>{c}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>"
        elif r == "assistant":
            out += f"assistant<|role_sep|>{c}<|message_sep|>"
    return out + ("assistant<|role_sep|>" if add_ass else "")


def _bailing(think: bool, role_end: str = ""):
    def render(chat: list[Message], add_ass: bool) -> str:
        out = ""
        if role_end and not (chat and chat[0][0] == "system"):
            out += "<role>SYSTEM</role>detailed thinking off<|role_end|>"
        out += "".join(f"<role>{'HUMAN' if r == 'user' else r.upper()}</role>{c}{role_end}" for r, c in chat)
        return out + (("<role>ASSISTANT</role>" + ("<think>" if think else "")) if add_ass else "")
    return render


def _hunyuan_dense(chat: list[Message], add_ass: bool) -> str:
    out = ""
    for i, (r, c) in enumerate(chat):
        if i == 0 and r == "system":
            out += c + "<｜hy_place▁holder▁no▁3｜>"
        if r == "assistant":
            out += "<｜hy_Assistant｜>" + c + "<｜hy_place▁holder▁no▁2｜>"
        elif r == "user":
            out += "<｜hy_User｜>" + c + "<｜hy_Assistant｜>"
    return out


def _hunyuan_vl(chat: list[Message], add_ass: bool) -> str:
    out = "<｜hy_begin▁of▁sentence｜>"
    for i, (r, c) in enumerate(chat):
        if i == 0 and r == "system":
            out += c + "<｜hy_place▁holder▁no▁3｜>"
        elif r == "user":
            out += c + "<｜hy_User｜>"
        elif r == "assistant":
            out += c + "<｜hy_Assistant｜>"
    return out


def _pangu(chat: list[Message], add_ass: bool) -> str:
    names = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具", "function": "方法"}
    out = "[unused9]系统：[unused10]" if chat and chat[0][0] != "system" else ""
    out += "".join(f"[unused9]{names[r]}：{c}[unused10]" for r, c in chat if r in names)
    return out + ("[unused9]助手：" if add_ass else "")


def _seed_oss(chat: list[Message], add_ass: bool) -> str:
    out = "".join(f"<seed:bos>{r}\n{_trim(c) if r == 'assistant' else c}<seed:eos>" for r, c in chat)
    return out + ("<seed:bos>assistant\n" if add_ass else "")


def _chatglm(head: str, sep: str, gen: str):
    def render(chat: list[Message], add_ass: bool) -> str:
        return head + "".join(f"<|{r}|>{sep}{c}" for r, c in chat) + (gen if add_ass else "")
    return render


_FORMATS: dict[str, Callable[[list[Message], bool], str]] = {
    "chatml": _per_message(lambda r: f"<|im_start|>{r}\n", "<|im_end|>\n", "<|im_start|>assistant\n"),
    "mistral-v7": _mistral_v7(" "), "mistral-v7-tekken": _mistral_v7(""),
    **{n: _mistral(n) for n in ("mistral-v1", "mistral-v3", "mistral-v3-tekken")},
    **{n: _llama2(n) for n in ("llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip")},
    "phi3": _per_message(lambda r: f"<|{r}|>\n", "<|end|>\n", "<|assistant|>\n"),
    "phi4": _per_message(lambda r: f"<|im_start|>{r}<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _per_message(lambda r: f"<|{r}|>\n", "\n", "<|assistant|>\n"),
    "zephyr": _per_message(lambda r: f"<|{r}|>\n", "<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma(),
    "orion": _merge_system(lambda s, c: "Human: " + (s + "\n\n" if s else "") + c + "\n\nAssistant: </s>",
                           lambda c: c + "</s>", "", trim=False),
    "openchat": _openchat,
    "vicuna": _by_role({"system": ("", "\n\n"), "user": ("USER: ", "\n"), "assistant": ("ASSISTANT: ", "</s>\n")},
                       "ASSISTANT:"),
    "vicuna-orca": _by_role({"system": ("SYSTEM: ", "\n"), "user": ("USER: ", "\n"),
                             "assistant": ("ASSISTANT: ", "</s>\n")}, "ASSISTANT:"),
    "deepseek": _by_role({"system": ("", ""), "user": ("### Instruction:\n", "\n"),
                          "assistant": ("### Response:\n", "\n<|EOT|>\n")}, "### Response:\n"),
    "command-r": _by_role({r: (f"<|START_OF_TURN_TOKEN|><|{t}_TOKEN|>", "<|END_OF_TURN_TOKEN|>") for r, t in
                           (("system", "SYSTEM"), ("user", "USER"), ("assistant", "CHATBOT"))},
                          "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", trim=True),
    "llama3": _per_message(lambda r: f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>",
                           "<|start_header_id|>assistant<|end_header_id|>\n\n", trim=True),
    "chatglm3": _chatglm("[gMASK]sop", "\n ", "<|assistant|>"),
    "chatglm4": _chatglm("[gMASK]<sop>", "\n", "<|assistant|>\n"),
    "glmedge": _chatglm("", "\n", "<|assistant|>"),
    "minicpm": _minicpm,
    "deepseek2": _by_role({"system": ("", "\n\n"), "user": ("User: ", "\n\n"),
                           "assistant": ("Assistant: ", "<｜end▁of▁sentence｜>")}, "Assistant:"),
    "deepseek3": _by_role({"system": ("", "\n\n"), "user": ("<｜User｜>", ""),
                           "assistant": ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")}, "<｜Assistant｜>"),
    "deepseek-ocr": _per_message(lambda r: "", "", ""),
    "exaone3": _by_role({"system": ("[|system|]", "[|endofturn|]\n"), "user": ("[|user|]", "\n"),
                         "assistant": ("[|assistant|]", "[|endofturn|]\n")}, "[|assistant|]", trim=True),
    "exaone4": _by_role({"system": ("[|system|]", "[|endofturn|]\n"), "user": ("[|user|]", "\n"),
                         "assistant": ("[|assistant|]", "[|endofturn|]\n"), "tool": ("[|tool|]", "[|endofturn|]\n")},
                        "[|assistant|]", trim=True),
    "exaone-moe": _by_role({r: (f"<|{r}|>\n", "<|endofturn|>\n") for r in ("system", "user", "assistant", "tool")},
                           "<|assistant|>\n", trim=True),
    "rwkv-world": _rwkv,
    "granite": _granite(False), "granite-4.0": _granite(True), "granite-4.1": _granite(True),
    "gigachat": _gigachat,
    "megrez": _per_message(lambda r: f"<|role_start|>{r}<|role_end|>", "<|turn_end|>",
                           "<|role_start|>assistant<|role_end|>"),
    "yandex": _by_role({"user": (" Пользователь: ", "\n\n"), "assistant": (" Ассистент: ", "\n\n")},
                       " Ассистент:[SEP]"),
    "bailing": _bailing(False), "bailing-think": _bailing(True), "bailing2": _bailing(False, "<|role_end|>"),
    "llama4": _per_message(lambda r: f"<|header_start|>{r}<|header_end|>\n\n", "<|eot|>",
                           "<|header_start|>assistant<|header_end|>\n\n", trim=True),
    "smolvlm": lambda chat, add_ass: "<|im_start|>" + _by_role(
        {"system": ("", "\n\n"), "user": ("User: ", "<end_of_utterance>\n"),
         "assistant": ("Assistant: ", "<end_of_utterance>\n")}, "Assistant:", other="assistant")(chat, add_ass),
    "dots1": _by_role({"system": ("<|system|>", "<|endofsystem|>"), "user": ("<|userprompt|>", "<|endofuserprompt|>"),
                       "assistant": ("<|response|>", "<|endofresponse|>")}, "<|response|>", other="assistant"),
    "hunyuan-moe": _by_role({"system": ("<|startoftext|>", "<|extra_4|>"), "assistant": ("", "<|eos|>"),
                             "user": ("<|startoftext|>", "<|extra_0|>")}, "", other="user"),
    "gpt-oss": lambda chat, add_ass: "".join(
        f"<|start|>{r}<|message|>{c}" + ("<|return|>" if r == "assistant" else "<|end|>") for r, c in chat)
        + ("<|start|>assistant" if add_ass else ""),
    "hunyuan-dense": _hunyuan_dense, "hunyuan-vl": _hunyuan_vl,
    "kimi-k2": _by_role({"system": ("<|im_system|>system<|im_middle|>", "<|im_end|>"),
                         "user": ("<|im_user|>user<|im_middle|>", "<|im_end|>"),
                         "assistant": ("<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
                         "tool": ("<|im_system|>tool<|im_middle|>", "<|im_end|>")},
                        "<|im_assistant|>assistant<|im_middle|>", default=("", "<|im_end|>")),
    "seed_oss": _seed_oss,
    "grok-2": lambda chat, add_ass: "".join(
        {"system": f"System: {_trim(c)}<|separator|>\n\n", "user": f"Human: {_trim(c)}<|separator|>\n\n",
         "assistant": f"Assistant: {c}<|separator|>\n\n"}.get(r, "") for r, c in chat)
        + ("Assistant:" if add_ass else ""),
    "pangu-embedded": _pangu,
    "solar-open": _per_message(lambda r: f"<|begin|>{r}<|content|>", "<|end|>", "<|begin|>assistant"),
}


def render(name: str, chat: list[Message], add_generation_prompt: bool) -> str:
    """The conversation in built-in format `name` (a name detect() returned)."""
    return _FORMATS[name](chat, add_generation_prompt)
