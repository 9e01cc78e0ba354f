"""llama-server 0c1e570's built-in agent tools (server-tools.cpp): read_file, file_glob_search, grep_search,
exec_shell_command, write_file, edit_file, get_info, with its names, parameters, outputs and error texts. They
follow registry.py's tool protocol; toolio.py decides where their files and processes are (host or isolate).

Off unless --tools names them (build_tools). One difference from llama-server: a parameter of the wrong JSON type
is a 400 naming it, where llama-server silently used the default."""
from __future__ import annotations

import base64
import os
import re
from typing import Callable

from .edit import Edit, EditError, apply_edits
from .globmatch import path_glob_match
from .registry import ToolParamError
from .toolio import make_io

_MISSING = object()
READ_MAX = 16 * 1024                    # bytes of read_file text without a line range
READ_MAX_BASE64 = 32 * 1024 * 1024
SEARCH_MAX = 100                        # file_glob_search / grep_search results
EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT = 60
INFO_MAX, INFO_TIMEOUT = 4096, 5
_JSON_TYPES = {str: "string", int: "integer", bool: "boolean", list: "array"}


def param(params: dict, key: str, typ: type, default=_MISSING):
    """params[key] checked against a JSON type; missing: the default, or a 400 when it is required."""
    if key not in params or (params[key] is None and default is not _MISSING):
        if default is _MISSING:
            raise ToolParamError(f"key '{key}' not found")
        return default
    v = params[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise ToolParamError(f"'{key}' must be of type {_JSON_TYPES[typ]}")
    return v


def _fn(name: str, description: str, properties: dict, required: list[str] | None = None) -> dict:
    parameters = {"type": "object", "properties": properties}
    if required is not None:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _p(type_: str, description: str) -> dict:
    return {"type": type_, "description": description}


def _lines(data: bytes) -> list[bytes]:
    # std::getline's lines: a final newline ends the last line, it does not start an empty one
    parts = data.split(b"\n")
    return parts[:-1] if parts and parts[-1] == b"" else parts


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class BuiltinTool:
    name = display_name = ""
    permission_write = support_stream = False
    uses_cwd = True

    def type(self) -> str:
        return "server"


class ReadFile(BuiltinTool):
    name, display_name = "read_file", "Read file"

    def definition(self) -> dict:
        return _fn(self.name, "Read the contents of a file. Optionally specify a 1-based line range. If append_loc "
                   "is true, each line is prefixed with its line number (e.g. \"1\u2192...\").", {
                       "path": _p("string", "Path to the file"),
                       "start_line": _p("integer", "First line to read, 1-based (default: 1)"),
                       "end_line": _p("integer", "Last line to read, 1-based inclusive (default: end of file)"),
                       "append_loc": _p("boolean", "Prefix each line with its line number")}, ["path"])

    def invoke(self, params: dict, stream=None) -> dict:
        path = param(params, "path", str)
        start, end = param(params, "start_line", int, 1), param(params, "end_line", int, -1)
        append_loc = param(params, "append_loc", bool, False)
        as_base64 = params.get("resp_type") == "base64"      # the x-resp-type header; the model cannot ask
        io = make_io(params)
        size = io.file_size(path)
        if size is None:
            return {"error": f"cannot stat file: {path}"}
        if as_base64:
            if size > READ_MAX_BASE64:
                return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
            data = io.read_file(path)
            if data is None:
                return {"error": f"failed to open file: {path}"}
            return {"base64": base64.b64encode(data).decode("ascii"), "size_bytes": len(data)}
        if size > READ_MAX and end == -1:
            return {"error": f"file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a "
                             "portion."}
        data = io.read_file(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        out = bytearray()
        for n, line in enumerate(_lines(data), 1):
            if n < start:
                continue
            if end != -1 and n > end:
                break
            piece = (f"{n}\u2192".encode() if append_loc else b"") + line + b"\n"
            if len(out) + len(piece) > READ_MAX:
                out += b"[output truncated]"
                break
            out += piece
        return {"plain_text_response": _text(bytes(out))}


class FileGlobSearch(BuiltinTool):
    name, display_name = "file_glob_search", "File search"

    def definition(self) -> dict:
        return _fn(self.name, "Recursively search for files matching a glob pattern under a directory. "
                   "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
                   "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
                   "A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. "
                   "A pattern containing '/' matches the full relative path; unless already anchored with "
                   "\"**/\" or a leading '/', it is automatically prefixed with \"**/\". "
                   "Use type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' "
                   "in the output. Note: directory listings do not apply .gitignore filtering.", {
                       "path": _p("string", "Base directory to search in"),
                       "include": _p("string", "Glob pattern for files to include (e.g. \"*.cpp\" or "
                                     "\"src/**/*.cpp\"). Default: **"),
                       "exclude": _p("string", "Glob pattern for files to exclude"),
                       "type": _p("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
                       "max_depth": _p("integer", "Maximum depth to descend into subdirectories (default: 0 = "
                                       "unlimited; 1 = direct children only)"),
                       "limit": _p("integer", f"Maximum number of results to return, capped at {SEARCH_MAX} "
                                   f"(default {SEARCH_MAX})")}, ["path"])

    def invoke(self, params: dict, stream=None) -> dict:
        io = make_io(params)
        path = param(params, "path", str)
        base = io.resolve(path)
        include, exclude = param(params, "include", str, "**"), param(params, "exclude", str, "")
        kind = param(params, "type", str, "file")
        max_depth = max(0, param(params, "max_depth", int, 0))
        limit = param(params, "limit", int, SEARCH_MAX)
        if limit < 1:
            return {"error": f"invalid limit: {limit} (expected 1 or more)"}
        if kind not in ("file", "dir", "all"):
            return {"error": f"invalid type: {kind} (expected \"file\", \"dir\" or \"all\")"}
        listing = io.list_entries(base, max_depth, kind)
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        matches = [(rel, is_dir) for rel, is_dir in listing.entries
                   if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]
        shown = matches[:min(limit, SEARCH_MAX)]
        text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
        text += f"\n---\nTotal matches: {len(matches)}\n"
        if len(matches) > len(shown):
            text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). Refine the glob "
                     "pattern to narrow the search.]\n")
        if listing.truncated:
            text += "[results truncated: time budget or unreadable directory]\n"
        # `entries` / `base` are the same data for a client (the web page's picker); the model reads the text
        return {"plain_text_response": text,
                "entries": [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown],
                "base": base}


class GrepSearch(BuiltinTool):
    name, display_name = "grep_search", "Grep search"

    def definition(self) -> dict:
        return _fn(self.name, "Search for a pattern in files under a path. Returns matching lines with file paths "
                   "(and, unless searching a single file, paths relative to the given directory). "
                   "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
                   "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
                   "include/exclude: a pattern with no '/' matches the basename at any depth; a pattern "
                   "containing '/' matches the full relative path (auto-anchored with \"**/\" unless already "
                   "anchored).", {
                       "path": _p("string", "File or directory to search in"),
                       "pattern": _p("string", "Pattern to search for (regular expression unless literal is true)"),
                       "include": _p("string", "Glob pattern to filter files (default: **)"),
                       "exclude": _p("string", "Glob pattern to exclude files"),
                       "return_line_numbers": _p("boolean", "If true, include line numbers in results"),
                       "literal": _p("boolean", "Treat pattern as a literal string instead of a regular expression "
                                     "(default: false)"),
                       "ignore_case": _p("boolean", "Case-insensitive search (default: false)"),
                       "context_lines": _p("integer", "Number of lines of context to show before and after each "
                                           "match (default: 0)")}, ["path", "pattern"])

    def invoke(self, params: dict, stream=None) -> dict:
        path, pattern = param(params, "path", str), param(params, "pattern", str)
        include, exclude = param(params, "include", str, "**"), param(params, "exclude", str, "")
        show_num = param(params, "return_line_numbers", bool, False)
        literal, ignore_case = param(params, "literal", bool, False), param(params, "ignore_case", bool, False)
        ctx = max(0, param(params, "context_lines", int, 0))
        try:    # Python's re, where llama-server has std::regex (ECMAScript): the common syntax is the same
            rx = re.compile(re.escape(pattern) if literal else pattern, re.IGNORECASE if ignore_case else 0)
        except re.error as e:
            return {"error": f"invalid regex: {e}"}
        io = make_io(params)
        files = self._files(io, path, include, exclude)
        if isinstance(files, dict):
            return files
        return {"plain_text_response": self._search(io, files, rx, show_num or ctx > 0, ctx)}

    @staticmethod
    def _files(io, path: str, include: str, exclude: str):
        """(absolute path, path shown) pairs, or an {"error"} result."""
        abs_path = io.resolve(path)
        if io.is_regular_file(abs_path):
            return [(abs_path, path)]
        if not io.is_directory(abs_path):
            return {"error": f"path does not exist: {path}"}
        listing = io.list_entries(abs_path, 0, "file")
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        return [(abs_path.rstrip("/") + "/" + rel, rel) for rel, _ in listing.entries
                if path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))]

    @staticmethod
    def _search(io, files, rx, show_num: bool, ctx: int) -> str:
        out, total, limited = [], 0, False
        for fpath, shown in files:
            if limited:
                break
            data = io.read_file(fpath)
            if data is None:
                continue
            lines = [_text(x) for x in _lines(data)]
            for i, line in enumerate(lines):
                if total >= SEARCH_MAX:
                    limited = True
                    break
                if not rx.search(line):
                    continue
                for j in range(max(0, i - ctx), min(len(lines) - 1, i + ctx) + 1):
                    sep = ":" if j == i else "-"
                    out.append(f"{shown}{sep}{f'{j + 1}{sep}' if show_num else ''}{lines[j]}\n")
                if ctx > 0:
                    out.append("--\n")
                total += 1
        text = "".join(out) + f"\n---\nTotal matches: {total}\n"
        if limited:
            text += f"[{SEARCH_MAX} matches limit reached. Narrow the path/pattern/include to see more.]\n"
        return text


class ExecShellCommand(BuiltinTool):
    name, display_name = "exec_shell_command", "Execute shell command"
    permission_write = support_stream = True

    def definition(self) -> dict:
        return _fn(self.name, "Execute a shell command and return its output (stdout and stderr combined).", {
            "command": _p("string", "Shell command to execute"),
            "timeout": _p("integer", f"Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT})"),
            "max_output_size": _p("integer", f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT})")},
            ["command"])

    def invoke(self, params: dict, stream: Callable[[str], bool] | None = None) -> dict:
        command = param(params, "command", str)
        timeout = min(param(params, "timeout", int, 10), EXEC_MAX_TIMEOUT)
        max_output = max(0, min(param(params, "max_output_size", int, EXEC_MAX_OUTPUT), EXEC_MAX_OUTPUT))
        io = make_io(params)
        args = ["sh", "-c", command]
        if stream is None:
            res = io.run(args, max_output, timeout)
            return {"plain_text_response": res.output + self._tail(res)}
        alive = [True]

        def on_chunk(chunk: str) -> bool:
            alive[0] = stream(chunk)
            return alive[0]
        res = io.run(args, max_output, timeout, on_chunk)
        if alive[0]:
            stream(self._tail(res))
        return {}

    @staticmethod
    def _tail(res) -> str:
        return f"\n[exit code: {res.exit_code}]" + (" [exit due to timed out]" if res.timed_out else "")


class WriteFile(BuiltinTool):
    name, display_name = "write_file", "Write file"
    permission_write = True

    def definition(self) -> dict:
        return _fn(self.name, "Write content to a file, creating it (including parent directories) if it does not "
                   "exist. May use with edit_file for more complex edits.", {
                       "path": _p("string", "Path of the file to write"),
                       "content": _p("string", "Content to write")}, ["path", "content"])

    def invoke(self, params: dict, stream=None) -> dict:
        path, content = param(params, "path", str), param(params, "content", str)
        data = content.encode("utf-8", errors="surrogatepass")
        if not make_io(params).write_file(path, data):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file written successfully", "path": path, "bytes": len(data)}


class EditFile(BuiltinTool):
    name, display_name = "edit_file", "Edit file"
    permission_write = True

    def definition(self) -> dict:
        item = {"type": "object", "properties": {
            "old_text": _p("string", "Exact text to find; must be unique in the file and must not overlap with other "
                           "edits"),
            "new_text": _p("string", "Text to replace old_text with")}, "required": ["old_text", "new_text"]}
        return _fn(self.name, "Edit a file using exact text replacement. Each edits[].old_text must be unique in the "
                   "file and is matched against the original content, not incrementally. Merge nearby changes into "
                   "one edit instead of overlapping edits. Use write_file to replace the whole file.", {
                       "path": _p("string", "Path to the file to edit"),
                       "edits": {"type": "array", "description": "One or more exact text replacements to apply",
                                 "items": item}}, ["path", "edits"])

    def invoke(self, params: dict, stream=None) -> dict:
        path = param(params, "path", str)
        if "edits" not in params:
            raise ToolParamError("key 'edits' not found")
        raw = params["edits"]
        if not isinstance(raw, list) or not raw:
            return {"error": "\"edits\" must be a non-empty array"}
        edits = []
        for i, e in enumerate(raw):
            if not isinstance(e, dict):
                raise ToolParamError(f"edits[{i}] must be an object")
            edits.append(Edit(param(e, "old_text", str), param(e, "new_text", str)))
            if not edits[-1].old_text:
                return {"error": f"edits[{i}].old_text must not be empty"}
        io = make_io(params)
        data = io.read_file(path)
        if data is None:
            return {"error": f"failed to open file: {path}"}
        try:   # surrogateescape: bytes that are not UTF-8 go back to the file unchanged
            new = apply_edits(data.decode("utf-8", errors="surrogateescape"), edits, path)
        except EditError as e:
            return {"error": str(e)}
        if not io.write_file(path, new.encode("utf-8", errors="surrogateescape")):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file edited successfully", "path": path, "edits_applied": len(edits)}


class GetInfo(BuiltinTool):
    name, display_name = "get_info", "Get Runtime Info"

    def definition(self) -> dict:
        return _fn(self.name, "Returns runtime info: the OS name/version and the current working directory", {})

    def invoke(self, params: dict, stream=None) -> dict:
        io = make_io(params)
        res = io.run(["uname", "-a"], INFO_MAX, INFO_TIMEOUT)
        os_info = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
        cwd = params.get("cwd") or ""
        if not cwd and not params.get("runtime"):
            cwd = os.getcwd()
        elif not cwd:
            pwd = io.run(["pwd"], INFO_MAX, INFO_TIMEOUT)
            cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        return {"os": os_info, "cwd": cwd}


ALL_TOOLS = (ReadFile, FileGlobSearch, GrepSearch, ExecShellCommand, WriteFile, EditFile, GetInfo)
NAMES = tuple(t.name for t in ALL_TOOLS)


def build_tools(enabled: list[str]) -> list:
    """--tools' names ("all" = every one), in llama-server's order; an unknown name is refused at startup."""
    for name in enabled:
        if name != "all" and name not in NAMES:
            raise ValueError(f"unknown tool \"{name}\". available tools: {', '.join(NAMES)}")
    return [t() for t in ALL_TOOLS if "all" in enabled or t.name in enabled]
