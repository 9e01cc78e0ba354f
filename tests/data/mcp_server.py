"""A small MCP server for the tests (NDJSON JSON-RPC over stdio). Tools:

echo {message}        -> "echo: <message>"
add {a, b}            -> "<a + b>"
fail_once {}          -> a JSON-RPC error the first time per process, then "ok"
sleep {seconds}       -> sleeps, then "slept"
crash {}              -> exits without answering
notify {message}      -> a notification, then the reply, in one write()
env {name}            -> the value of environment variable <name>, and the working directory
spawn {}              -> starts a grandchild that inherits the pipes and sleeps; answers its pid
is_error {}           -> a result with isError
pid {}                -> this process's pid
info {}               -> "mcp info"

Flags: --noise (writes stderr lines and a non-JSON stdout line before each reply), --no-tools-list (answers
tools/list with an error), --hang-init (never answers initialize).
"""
import json
import os
import subprocess
import sys
import time

NOISE = "--noise" in sys.argv
STATE = {"failed": False}
OBJ = {"type": "object", "properties": {}}
TOOLS = [
    {"name": "echo", "description": "Echo back the input message",
     "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}},
    {"name": "add", "description": "Add two numbers",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}},
    {"name": "fail_once", "description": "Fails the first time", "inputSchema": OBJ},
    {"name": "sleep", "description": "Sleeps", "inputSchema": OBJ},
    {"name": "crash", "description": "Exits", "inputSchema": OBJ},
    {"name": "notify", "description": "Notifies, then answers", "inputSchema": OBJ},
    {"name": "env", "description": "An environment variable", "inputSchema": OBJ},
    {"name": "spawn", "description": "Starts a grandchild", "inputSchema": OBJ},
    {"name": "is_error", "description": "Answers isError", "inputSchema": OBJ},
    {"name": "pid", "description": "This process's pid"},
    {"name": "info", "description": "Named so that server 'get' offers get_info, a built-in's name"},
]


def text(s):
    return {"content": [{"type": "text", "text": s}]}


def call(name, args):
    if name == "echo":
        return text(f"echo: {args.get('message', '')}")
    if name == "add":
        return text(str(args.get("a", 0) + args.get("b", 0)))
    if name == "fail_once":
        if not STATE["failed"]:
            STATE["failed"] = True
            raise RuntimeError("transient error")
        return text("ok")
    if name == "sleep":
        time.sleep(float(args.get("seconds", 1)))
        return text("slept")
    if name == "crash":
        os._exit(3)
    if name == "env":
        return {"content": [{"type": "text", "text": os.environ.get(args["name"], "<unset>")},
                            {"type": "image", "data": ""}, {"type": "text", "text": os.getcwd()}]}
    if name == "spawn":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        return text(str(child.pid))
    if name == "is_error":
        return {"content": [{"type": "text", "text": "bad input"}], "isError": True}
    if name == "pid":
        return text(str(os.getpid()))
    if name == "info":
        return text("mcp info")
    raise KeyError(name)


def reply(req):
    method, rid, params = req.get("method"), req.get("id"), req.get("params") or {}
    if method == "initialize":
        if "--hang-init" in sys.argv:
            return None
        return {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "t"}}
    if method == "tools/list":
        if "--no-tools-list" in sys.argv:
            raise LookupError("no listing")
        return {"tools": TOOLS}
    if method == "tools/call":
        if params.get("name") == "notify":
            note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            out = {"jsonrpc": "2.0", "id": rid, "result": text(f"echo: {params['arguments'].get('message')}")}
            os.write(1, (json.dumps(note) + "\n" + json.dumps(out) + "\n").encode())
            return None
        return call(params.get("name"), params.get("arguments") or {})
    raise NotImplementedError(method)


def main():
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if "id" not in req:
            continue                    # a notification: no reply
        if NOISE:
            sys.stderr.write("noise on stderr\n")
            sys.stderr.flush()
            os.write(1, b"this is not JSON\n")
        try:
            result = reply(req)
            if result is None:
                continue
            out = {"jsonrpc": "2.0", "id": req["id"], "result": result}
        except Exception as e:          # noqa: BLE001 - every failure is a JSON-RPC error here
            out = {"jsonrpc": "2.0", "id": req["id"], "error": {"code": -32000, "message": str(e) or repr(e)}}
        os.write(1, (json.dumps(out) + "\n").encode())


if __name__ == "__main__":
    main()
