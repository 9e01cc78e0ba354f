"""Goldens for llama.cpp's built-in (non-jinja) chat formats, taken from llama.cpp's own test of them.

    python3 compat/gen_builtin_template_goldens.py SRC_TREE LABEL

SRC_TREE is a llama.cpp tree (the vendor/llama.cpp of a llama-cpp-python sdist); LABEL names the oracle (b8462,
0c1e570). llama.cpp's tests/test-chat-template.cpp asserts, for each of its cases, that a template source is
detected as a built-in format and that the fixed conversation renders to an expected string (its
`expected_output`, the legacy path that --no-jinja takes). This reads those literals out of the C++ file and
writes compat/goldens/builtin_templates_LABEL.json, which tests/test_chat_builtin.py replays against
llamacmp/chat_builtin.py. Nothing of llama.cpp is compiled or copied into llamacmp: only its asserted outputs.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).parent
_STR = r'(?:u8)?"((?:[^"\\]|\\.)*)"'
# a field is `/* .name= */ VALUE` (one case in current llama.cpp spells it `/* .template_str */`); a string may be
# wrapped in U8C(...) for UTF-8 literals
_FIELD = re.compile(r"/\* \.(\w+)=? \*/\s*(?:(?:U8C\()?" + _STR + r"|(true|false)|(\{\{[^\n]*\}\}|\{\}))", re.S)
_PAIR = re.compile(r'\{' + _STR + r',\s*' + _STR + r'\}')
_ESC = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'"}


def c_unescape(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESC[m.group(1)], s)


def conversation(text: str) -> list[dict]:
    """The test's fixed conversation (the first `std::vector<llama_chat_message> conversation {...}`)."""
    body = re.search(r"std::vector<llama_chat_message> conversation \{(.*?)\};", text, re.S).group(1)
    return [{"role": c_unescape(r), "content": c_unescape(c)} for r, c in _PAIR.findall(body)]


def cases(text: str) -> list[dict]:
    start = text.index("std::vector<TestCase> test_cases {")
    end = text.index("\n    };", start)
    out = []
    for block in re.split(r"\n        \{\n", text[start:end])[1:]:
        case: dict = {}
        for key, s, flag, pairs in _FIELD.findall(block):
            if flag:
                case[key] = flag == "true"
            elif pairs:
                case[key] = [{"role": c_unescape(r), "content": c_unescape(c)} for r, c in _PAIR.findall(pairs)]
            else:
                case[key] = c_unescape(s)
        out.append(case)
    return out


def main() -> None:
    tree, label = Path(sys.argv[1]), sys.argv[2]
    text = (tree / "tests" / "test-chat-template.cpp").read_text()
    names = re.findall(r'\{ "([\w.-]+)",\s+LLM_CHAT_TEMPLATE_\w+\s*\}',
                       (tree / "src" / "llama-chat.cpp").read_text())
    data = {"source": f"llama.cpp {label}: tests/test-chat-template.cpp, src/llama-chat.cpp",
            "builtin_names": names, "conversation": conversation(text), "cases": cases(text)}
    path = HERE / "goldens" / f"builtin_templates_{label}.json"
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    print(f"{path}: {len(data['cases'])} cases, {len(names)} names")


if __name__ == "__main__":
    main()
