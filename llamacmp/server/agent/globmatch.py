"""llama.cpp's glob (common/common.cpp glob_match) and the tools' path rule (server-tools.cpp path_glob_match):
`*` matches within one path segment, `**` across segments, `?` one non-'/' character, `[...]` a class
(`!` negates, `a-z` ranges, a leading `]` or `-` is literal); an unclosed `[` matches itself."""
from __future__ import annotations

import posixpath
from functools import lru_cache


def _class_match(c: str, body: str) -> bool:
    """body: the text between '[' and ']'."""
    negated = body.startswith("!")
    if negated:
        body = body[1:]
    if body[:1] in ("]", "-"):
        if body[0] == c:
            return not negated
        body = body[1:]
    i, matched = 0, False
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-" and body[i + 2] != "]":
            if body[i] <= c <= body[i + 2]:
                matched = True
                break
            i += 3
        else:
            if body[i] == c:
                matched = True
                break
            i += 1
    return matched != negated


def _class_end(pattern: str, p: int) -> int:
    """Index of the ']' closing the class opened at p, or -1."""
    e = p + 1
    if e < len(pattern) and pattern[e] in "]-":
        e += 1
    while e < len(pattern) and pattern[e] != "]":
        e += 1
    return e if e < len(pattern) else -1


def glob_match(pattern: str, text: str) -> bool:
    @lru_cache(maxsize=None)
    def m(p: int, s: int) -> bool:       # memoized: the recursive original is exponential on many stars
        if p == len(pattern):
            return s == len(text)
        if pattern.startswith("**", p):
            return m(p + 2, s) or (s < len(text) and m(p, s + 1))
        c = pattern[p]
        if c == "*":
            while s < len(text) and text[s] != "/":
                if m(p + 1, s):
                    return True
                s += 1
            return m(p + 1, s)
        if c == "?" and s < len(text) and text[s] != "/":
            return m(p + 1, s + 1)
        if c == "[":
            end = _class_end(pattern, p)
            if end >= 0:
                return s < len(text) and _class_match(text[s], pattern[p + 1:end]) and m(end + 1, s + 1)
            return s < len(text) and text[s] == "[" and m(p + 1, s + 1)
        return s < len(text) and c == text[s] and m(p + 1, s + 1)
    return m(0, 0)


def path_glob_match(pattern: str, rel_path: str) -> bool:
    """No '/' in the pattern: it matches the basename at any depth; else the whole relative path, anchored with
    '**/' unless it already starts with '**/' or '/'."""
    if "/" not in pattern:
        return glob_match(pattern, posixpath.basename(rel_path))
    if pattern == "**" or pattern.startswith("**/") or pattern.startswith("/"):
        return glob_match(pattern, rel_path)
    return glob_match("**/" + pattern, rel_path)
