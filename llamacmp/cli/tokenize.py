"""llamacmp-tokenize: llama.cpp's `llama-tokenize` (tools/tokenize): same flags, same output, same errors.

Default output is one `%6d -> '%s'` line per token with the raw piece bytes; --ids prints a Python-style list.
Only the tokenizer is loaded (no weights, no backend).
"""
from __future__ import annotations

import sys

from ..args import ArgError, parse_args, process_escapes, resolve_hf_or_exit
from .common import CliError, resolve_model

USAGE = """usage: {argv0} [options]

The tokenize program tokenizes a prompt using a given model,
and prints the resulting tokens to standard output.

It needs a model file, a prompt, and optionally other flags
to control the behavior of the tokenizer.

    The possible options are:

    -h, --help                           print this help and exit
    -m MODEL_PATH, --model MODEL_PATH    path to model.
    --ids                                if given, only print numerical token IDs, and not token strings.
                                         The output format looks like [1, 2, 3], i.e. parseable by Python.
    -f PROMPT_FNAME, --file PROMPT_FNAME read prompt from a file.
    -p PROMPT, --prompt PROMPT           read prompt from the argument.
    --stdin                              read prompt from standard input.
    --no-bos                             do not ever add a BOS token to the prompt, even if normally the model uses a BOS token.
    --no-escape                          do not escape input (such as \\n, \\t, etc.).
    --no-parse-special                   do not parse control tokens.
    --log-disable                        disable logs. Makes stderr quiet when loading the model.
    --show-count                         print the total number of tokens.
"""


def _arg_error(e: ArgError, argv: list[str]) -> str:
    """llama-tokenize words its errors differently from common/arg.cpp."""
    text = str(e)
    if text.startswith("error: invalid argument: "):
        return f"Error: unknown option '{text.split(': ', 2)[2]}'"
    if text == "expected value for argument":
        flag = argv[-1] if argv else ""
        long = {"-m": "--model", "-p": "--prompt", "-f": "--file"}.get(flag, flag)
        return f"Error: {long} requires an argument."
    return text


def _read_prompt(p, argv: list[str]) -> str:
    sources = sum(bool(x) for x in (p.read_stdin, p.prompt_file, "-p" in argv or "--prompt" in argv))
    if sources > 1:
        raise CliError("Error: --stdin, --file and --prompt are mutually exclusive.")
    if sources == 0:
        raise CliError("Error: must specify one of: --stdin, --file or --prompt.")
    if p.read_stdin:
        text = sys.stdin.buffer.read().decode("utf-8", errors="replace")
        return process_escapes(text) if p.escape else text
    return p.prompt                      # -p / -f text, escapes already processed by args.py


def run(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(USAGE.format(argv0="llamacmp-tokenize"))
        return 0
    try:
        parsed = parse_args("tokenize", argv)
        p = parsed.params
    except ArgError as e:
        sys.stderr.write(_arg_error(e, argv) + "\n")
        return 1
    if not p.model and not p.hf_repo:     # llama-tokenize checks the model before the prompt source
        sys.stderr.write("Error: must specify --model.\n")
        return 1
    for w in parsed.warnings:
        sys.stderr.write(w + "\n")
    try:
        resolve_hf_or_exit(p)
    except SystemExit as e:
        return int(e.code or 1)
    try:
        prompt = _read_prompt(p, argv)
        tok = _load_tokenizer(resolve_model(p, sys.stderr), p.log_disable)
    except CliError as e:
        sys.stderr.write(f"{e}\n")
        return 1
    ids = tok.encode(prompt, parse_special=not p.no_parse_special, add_special=not p.no_bos)
    _print_tokens(tok, ids, p.ids_only, p.show_count)
    return 0


def _load_tokenizer(path: str, quiet: bool):
    from ..gguf_file import GGUFError, GGUFFile
    from ..loader import load_tokenizer
    try:
        return load_tokenizer(GGUFFile(path))
    except (GGUFError, OSError) as e:
        if not quiet:
            sys.stderr.write(f"{e}\n")
        raise CliError(f"Error: could not load model from file '{path}'.") from None


def _print_tokens(tok, ids: list[int], ids_only: bool, show_count: bool) -> None:
    out = sys.stdout.buffer
    if ids_only:
        out.write(("[" + ", ".join(str(i) for i in ids) + "]\n").encode())
    else:
        for i in ids:
            # raw piece bytes, as printf("%s") writes them (a piece may be half a UTF-8 character)
            out.write(f"{i:6d} -> '".encode() + tok.token_to_piece(i) + b"'\n")
    if show_count:
        out.write(f"Total number of tokens: {len(ids)}\n".encode())
    out.flush()


def main(argv: list[str] | None = None) -> int:
    return run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
