"""Where a tool's file and process operations happen (server-tools.cpp's tools_io): on this host, or inside an
isolate named by the x-tool-runtime header / --tools-runtime (a running docker or podman container, an ssh host),
where every operation is a POSIX command run through `<engine> exec` or `ssh`.

make_io(params) picks one from params["cwd"] / params["runtime"]; an unknown or unsafe runtime is an error, never
a silent fallback to the host."""
from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from .proc import ExecResult, run_process

GIT_LS_MAX = 8 * 1024 * 1024          # bytes of `git ls-files` output
LIST_TIMEOUT = 15                     # seconds for one listing, git and walker together
ISOLATE_TIMEOUT = 15                  # seconds for an isolate's helper command (stat, cat, mkdir, find)
ISOLATE_READ_MAX = 64 * 1024 * 1024
# listed but never descended into: they can be enormous
JUNK_DIRS = (".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build", "target",
             ".cache", ".idea", ".vscode")
ENGINES = ("docker", "podman")


@dataclass
class Listing:
    entries: list[tuple[str, bool]] = field(default_factory=list)   # ('/'-separated path under base, is a dir)
    err: str = ""
    truncated: bool = False


def entry_depth(rel: str) -> int:
    return 1 + rel.count("/")


def _lines(text: str, strip_dot_slash: bool = False) -> list[str]:
    out = []
    for line in text.split("\n"):
        line = line.rstrip("\r")
        if strip_dot_slash and line.startswith("./"):
            line = line[2:]
        if line:
            out.append(line.replace("\\", "/"))
    return out


class HostIO:
    """The tools run on this machine; relative paths resolve against cwd (else the server's directory)."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        p = os.path.expanduser(path) if path == "~" or path.startswith(("~/", "~\\")) else path   # not ~user
        if not os.path.isabs(p):
            p = os.path.join(self.cwd or os.getcwd(), p)
        return os.path.normpath(p)     # no "." or ".." reaches git or the client

    def is_directory(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    def file_size(self, path: str) -> int | None:
        try:
            return os.path.getsize(self.resolve(path))
        except OSError:
            return None

    def read_file(self, path: str) -> bytes | None:
        try:
            return Path(self.resolve(path)).read_bytes()
        except OSError:
            return None

    def write_file(self, path: str, content: bytes) -> bool:
        target = Path(self.resolve(path))
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        except OSError:
            return False
        return True

    def run(self, args: list[str], max_output: int, timeout_s: int, on_chunk=None) -> ExecResult:
        return run_process(args, max_output, timeout_s, on_chunk, True, self.cwd)

    def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        """kind: "file", "dir" or "all". Files come from `git ls-files` (so .gitignore applies) when base is in a
        repository; otherwise, and for directories, from a walk that skips links and JUNK_DIRS' insides."""
        if not os.path.isdir(base):
            return Listing(err="path does not exist or is not a directory")
        deadline = time.monotonic() + LIST_TIMEOUT
        if kind == "file":
            res = self.run(["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                           GIT_LS_MAX, LIST_TIMEOUT)
            if res.exit_code == 0 and not res.timed_out:
                return Listing(entries=[(rel, False) for rel in _lines(res.output)
                                        if not (max_depth > 0 and entry_depth(rel) > max_depth)
                                        and os.path.isfile(os.path.join(base, rel))])
        return self._walk(base, max_depth, kind, deadline)

    @staticmethod
    def _walk(base: str, max_depth: int, kind: str, deadline: float) -> Listing:
        out = Listing()
        stack = [(base, "", 0)]
        while stack:
            d, rel_dir, depth = stack.pop()
            try:
                children = sorted(os.scandir(d), key=lambda e: e.name)
            except OSError:
                out.truncated = True       # a subtree the caller never sees
                continue
            for e in children:
                if time.monotonic() >= deadline:
                    out.truncated = True
                    return out
                rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
                try:
                    is_dir = e.is_dir()
                    is_file = not is_dir and e.is_file()
                    is_link = e.is_symlink()
                except OSError:
                    continue
                if is_dir:
                    if kind in ("dir", "all"):
                        out.entries.append((rel, True))
                    # a link can loop back to an ancestor: listed, never walked
                    if e.name not in JUNK_DIRS and not is_link and (max_depth == 0 or depth + 1 < max_depth):
                        stack.append((e.path, rel, depth + 1))
                elif is_file and kind in ("file", "all"):
                    out.entries.append((rel, False))
        return out


class IsolateIO:
    """Every operation is a POSIX command (sh, cat, wc, mkdir, find, timeout) inside the isolate; subclasses say
    how a command line reaches it (build_argv)."""

    def __init__(self, cwd: str = ""):
        self.cwd = cwd

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return self.cwd + "/" + path

    def _exec(self, inner: list[str], max_output: int, combine_stderr: bool = True) -> ExecResult:
        return run_process(self.build_argv(inner, False), max_output, ISOLATE_TIMEOUT, None, combine_stderr)

    def _ok(self, inner: list[str]) -> bool:
        res = self._exec(inner, 4096)
        return res.exit_code == 0 and not res.timed_out

    def is_directory(self, path: str) -> bool:
        return self._ok(["sh", "-c", '[ -d "$1" ]', "_", self.resolve(path)])

    def is_regular_file(self, path: str) -> bool:
        return self._ok(["sh", "-c", '[ -f "$1" ]', "_", self.resolve(path)])

    def file_size(self, path: str) -> int | None:
        res = self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        if res.exit_code != 0 or res.timed_out or not res.output.strip().isdigit():
            return None
        return int(res.output.strip())

    def read_file(self, path: str) -> bytes | None:
        # stderr kept out: it must not be spliced into the file's bytes
        res = self._exec(["cat", "--", self.resolve(path)], ISOLATE_READ_MAX, combine_stderr=False)
        if res.exit_code != 0 or res.timed_out:
            return None
        return res.raw

    def write_file(self, path: str, content: bytes) -> bool:
        # the content travels on stdin: no argv for the far side to re-parse, no temporary file on the host
        argv = self.build_argv(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.resolve(path)],
                               True)
        res = run_process(argv, 4096, ISOLATE_TIMEOUT, None, True, "", content)
        return res.exit_code == 0 and not res.timed_out

    def run(self, args: list[str], max_output: int, timeout_s: int, on_chunk=None) -> ExecResult:
        # an in-isolate `timeout`: killing the host-side client leaves the isolate's process tree running
        inner = ["timeout", f"{timeout_s}s", *args]
        if self.cwd:          # 127: what a shell reports for a command it could not run
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return run_process(self.build_argv(inner, True), max_output, timeout_s + 5, on_chunk, True)

    def list_entries(self, base: str, max_depth: int, kind: str) -> Listing:
        abs_base = self.resolve(base)
        if not self.is_directory(base):
            return Listing(err="path does not exist or is not a directory")
        if kind == "file":
            res = self._exec(["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard', "_",
                              abs_base], GIT_LS_MAX)
            if res.exit_code == 0 and not res.timed_out:
                return Listing(entries=[(r, False) for r in _lines(res.output)
                                        if not (max_depth > 0 and entry_depth(r) > max_depth)])
        out = Listing()
        for want_dirs in (True, False):
            if (kind in ("dir", "all")) if want_dirs else (kind in ("file", "all")):
                out.entries += [(r, want_dirs) for r in self._find(abs_base, max_depth, want_dirs, out)]
        return out

    def _find(self, abs_base: str, max_depth: int, dirs: bool, out: Listing) -> list[str]:
        # -mindepth/-maxdepth: busybox's find knows them as well as GNU's
        prune = " -o ".join(f"-name {n}" for n in JUNK_DIRS)
        cmd = 'cd "$1" && find . -mindepth 1' + (f" -maxdepth {max_depth}" if max_depth > 0 else "")
        cmd += f" \\( {prune} \\) -prune" + (" -print -o -type d -print" if dirs else " -o -type f -print")
        res = self._exec(["sh", "-c", cmd, "_", abs_base], GIT_LS_MAX)
        out.truncated = out.truncated or res.timed_out
        return _lines(res.output, strip_dot_slash=True)


class ContainerIO(IsolateIO):
    """An already-running container, through `<engine> exec` (docker and podman take the same verbs)."""

    def __init__(self, engine: str, container_id: str, cwd: str = ""):
        super().__init__(cwd)
        self.engine, self.container_id = engine, container_id

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container_id, *inner]


class SshIO(IsolateIO):
    """A remote host over ssh: remoting, not isolation. Key-based auth and a known host key only, as there is no
    console to answer a prompt."""

    def __init__(self, target: str, cwd: str = ""):
        super().__init__(cwd)
        self.target = target

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        # the remote shell parses the command line again, so `inner` travels as one quoted word
        return ["ssh", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o",
                "KbdInteractiveAuthentication=no", "-o", "StrictHostKeyChecking=yes",
                *([] if needs_stdin else ["-n"]), self.target, shlex.join(inner)]


# an id or target that starts with '-' would be read as an option (--privileged, -oProxyCommand=...)
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SSH_TARGET = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")


def parse_container_spec(spec: str) -> tuple[str, str, bool] | None:
    """"<engine>:<image>" (spawn) or "<engine>-container:<id>" (attach) -> (engine, image or id, attach)."""
    for engine in ENGINES:
        if spec.startswith(engine + "-container:"):
            return engine, spec[len(engine) + len("-container:"):], True
        if spec.startswith(engine + ":"):
            return engine, spec[len(engine) + 1:], False
    return None


def make_io(params: dict):
    cwd, runtime = params.get("cwd") or "", params.get("runtime") or ""
    if not isinstance(cwd, str) or not isinstance(runtime, str):
        raise ValueError("cwd and runtime must be strings")
    if not runtime:
        return HostIO(cwd)
    container = parse_container_spec(runtime)
    if container is not None:
        engine, arg, attach = container
        if not attach:       # spawning belongs to --tools-runtime, which owns the container; a call only attaches
            raise RuntimeError(f"tool runtime must name a running container: {runtime}")
        if not _CONTAINER_ID.fullmatch(arg):
            raise RuntimeError(f"invalid container id: {arg}")
        return ContainerIO(engine, arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[len("ssh:"):]
        if not _SSH_TARGET.fullmatch(target):
            raise RuntimeError(f"invalid ssh target: {target}")
        return SshIO(target, cwd)
    raise RuntimeError(f"unknown tool runtime: {runtime}")   # never fall back to the host
