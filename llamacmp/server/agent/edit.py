"""edit_file's matching (server-tools.cpp server_tool_edit_file): every old_text must be found once in the file's
original content, exactly, or else after a forgiving normalization of both (trailing white space dropped, smart
quotes, dashes and special spaces made ASCII); the edits must not overlap. When any edit needed the
normalization, the lines no edit touches are kept as they were in the file."""
from __future__ import annotations

from dataclasses import dataclass

_FUZZY = {**{chr(c): "'" for c in range(0x2018, 0x201C)}, **{chr(c): '"' for c in range(0x201C, 0x2020)},
          **{chr(c): "-" for c in range(0x2010, 0x2016)}, "\u2212": "-", "\u00a0": " ",
          **{chr(c): " " for c in range(0x2002, 0x200B)}, "\u202f": " ", "\u205f": " ", "\u3000": " "}
_FUZZY_TABLE = str.maketrans(_FUZZY)


class EditError(ValueError):
    """The edits cannot be applied; the message is the tool's {"error"}."""


@dataclass
class Edit:
    old_text: str
    new_text: str


@dataclass
class _Match:
    edit_index: int
    start: int            # offset into the base content (the original, or its normalized form)
    length: int
    new_text: str


def normalize(content: str) -> str:
    """Per line, so line count and positions stay: trailing ' ', '\\t', '\\r' dropped, look-alikes made ASCII."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY_TABLE) for line in content.split("\n"))


def _count(content: str, needle: str) -> int:
    return content.count(needle) if needle else 0      # non-overlapping, as the original


def apply_edits(original: str, edits: list[Edit], path: str) -> str:
    any_fuzzy = False
    for i, e in enumerate(edits):
        if e.old_text in original:
            continue
        if normalize(e.old_text) not in normalize(original):
            raise EditError(f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                            "content exactly")
        any_fuzzy = True
    base = normalize(original) if any_fuzzy else original
    matches = []
    for i, e in enumerate(edits):
        needle = normalize(e.old_text) if any_fuzzy else e.old_text
        # uniqueness is judged on normalized text: a duplicate differing only in white space still counts
        n = _count(normalize(original), normalize(e.old_text))
        if n > 1:
            raise EditError(f"found {n} occurrences of edits[{i}].old_text in {path}, it must be unique")
        matches.append(_Match(i, base.find(needle), len(needle), e.new_text))
    matches.sort(key=lambda m: m.start)
    for a, b in zip(matches, matches[1:]):
        if a.start + a.length > b.start:
            raise EditError(f"edits[{a.edit_index}] and edits[{b.edit_index}] overlap in {path}; merge them into "
                            "one edit or target disjoint regions")
    new = _keep_untouched_lines(original, base, matches) if any_fuzzy else _replace(base, matches, 0)
    if new == original:
        raise EditError("no changes made: the replacement(s) produced identical content")
    return new


def _replace(content: str, matches: list[_Match], offset: int) -> str:
    for m in reversed(matches):
        at = m.start - offset
        content = content[:at] + m.new_text + content[at + m.length:]
    return content


def _split_nl(content: str) -> list[str]:
    # only '\n' ends a line here ('\r' stays in it), unlike str.splitlines
    parts = content.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    return out + ([parts[-1]] if parts[-1] else [])


def _keep_untouched_lines(original: str, base: str, matches: list[_Match]) -> str:
    """Replace in the normalized text, but only within the lines the edits touch; the others come from the
    original, so its trailing white space and smart quotes elsewhere survive."""
    orig_lines = _split_nl(original)
    spans, pos = [], 0
    for line in _split_nl(base):
        spans.append((pos, pos + len(line)))
        pos += len(line)
    groups: list[list] = []                # [first line, end line (exclusive), matches]
    for m in matches:
        first = next(i for i, (s, e) in enumerate(spans) if s <= m.start < e)
        last = first
        while spans[last][1] < m.start + m.length:
            last += 1
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], last + 1)
            groups[-1][2].append(m)
        else:
            groups.append([first, last + 1, [m]])
    out, at = [], 0
    for first, end, ms in groups:
        out += orig_lines[at:first]
        lo, hi = spans[first][0], spans[end - 1][1]
        out.append(_replace(base[lo:hi], ms, lo))
        at = end
    return "".join(out + orig_lines[at:])
