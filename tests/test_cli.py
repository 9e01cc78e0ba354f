"""The console entry points end to end, as subprocesses, on a tiny random-weight GGUF with the numpy backend.

Expected outputs come from feeding the model in-process (engine/sequence.py, a plain greedy loop), so these tests
check the tools' plumbing (the CLIs drive the server's scheduler: engine/client.py) and formats against the model,
and the formats against llama.cpp's.
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

from pathlib import Path

import numpy as np
import pytest
import oracle_goldens

from llamacmp.backends.numpy_ref import NumpyBackend
from llamacmp.engine.client import SlotClient
from llamacmp.engine.sequence import Sequence
from llamacmp.engine.tasks import GenParams
from llamacmp.loader import load_model
from llamacmp.sampling import SamplingParams

TIMEOUT = 180


def tool_cmd(name: str) -> list[str]:
    """The installed console script when present, else the same main() through -m."""
    exe = shutil.which(f"llamacmp-{name}")
    if exe:
        return [exe]
    module = {"completion": "completion", "cli": "chat", "tokenize": "tokenize", "perplexity": "perplexity"}[name]
    return [sys.executable, "-m", f"llamacmp.cli.{module}"]


def run(name: str, *args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(tool_cmd(name) + list(args), input=stdin.encode(), capture_output=True,
                          timeout=TIMEOUT, env=full_env)


@pytest.fixture(scope="module")
def model(fixture_gguf):
    return str(fixture_gguf("tiny", "f32"))


@pytest.fixture(scope="module")
def lm(model):
    return load_model(model, NumpyBackend())


@pytest.fixture(scope="module")
def real_vocab_model(tmp_path_factory) -> str:
    """The tiny shape with Qwen3.5's real vocabulary (written once: both oracles' chat replies run on it)."""
    from llamacmp.fixtures import qwen_vocab, writer
    path = tmp_path_factory.mktemp("rv") / "rv.gguf"
    return str(writer.write_model(path, writer.SHAPES["tiny"], "f32", qwen_vocab.load_qwen35_vocab()))


def greedy_text(lm, prompt: str, n: int, ignore_eos: bool = True) -> tuple[str, list[int]]:
    """n greedy tokens (fewer at an end-of-generation token unless ignore_eos) fed one by one."""
    s = Sequence(lm, 4096)
    logits = s.feed(lm.tokenizer.encode(prompt, parse_special=True))
    tokens: list[int] = []
    while len(tokens) < n:
        x = np.array(logits, np.float32)
        if ignore_eos:
            x[list(lm.tokenizer.eog_ids)] = -np.inf
        tokens.append(int(np.argmax(x)))
        if tokens[-1] in lm.tokenizer.eog_ids:
            break
        logits = s.feed([tokens[-1]])
    return lm.tokenizer.decode(tokens, special=False), tokens


# -- llamacmp-completion ---------------------------------------------------------------------------------------

def test_completion_greedy_prints_prompt_then_16_tokens(model, lm):
    r = run("completion", "-m", model, "-p", "Hello", "-n", "16", "--temp", "0", "-no-cnv", "--ignore-eos")
    assert r.returncode == 0, r.stderr.decode()
    _, tokens = greedy_text(lm, "Hello", 16)
    assert len(tokens) == 16
    # raw piece bytes, exactly as llama-completion writes them (printf "%s": each piece up to a NUL byte)
    pieces = (lm.tokenizer.token_to_piece(t, False).split(b"\0", 1)[0] for t in tokens)
    assert r.stdout == b"Hello" + b"".join(pieces) + b"\n\n"
    err = r.stderr.decode()
    # llama.cpp's sampler chain counts accepted tokens: the prompt's and the 16 generated
    n_prompt = len(lm.tokenizer.encode("Hello"))
    assert re.search(rf"common_perf_print:    samplers time = +[\d.]+ ms / +{n_prompt + 16} tokens", err)
    assert re.search(r"common_perf_print:        eval time = +[\d.]+ ms / +15 runs   \( +[\d.]+ ms per token, "
                     r"+[\d.]+ tokens per second\)", err)
    assert re.search(r"common_perf_print: prompt eval time = +[\d.]+ ms / +\d+ tokens", err)


def test_completion_brief_command_line_prints_16_tokens(model, lm):
    """The literal `-p Hello -n 16 --temp 0`: the model has a template, so (as llama-completion) conversation
    mode turns on, 16 tokens are generated (fewer only on EOG) and EOF on stdin ends it."""
    r = run("completion", "-m", model, "-p", "Hello", "-n", "16", "--temp", "0")
    assert r.returncode == 0, r.stderr.decode()
    assert "chat template is available, enabling conversation mode" in r.stderr.decode()
    out = r.stdout.decode("utf-8", "replace")
    assert out.startswith("user\nHello\nassistant\n") and out.endswith("> EOF by user\n\n\n")
    n = int(re.search(r"eval time = +[\d.]+ ms / +(\d+) runs", r.stderr.decode()).group(1))
    assert n == 15 or "\n> " in out        # 16 sampled, the last one never decoded


def test_completion_no_display_prompt_and_reverse_prompt(model, lm):
    full, tokens = greedy_text(lm, "Hello", 12)
    # a reverse prompt is only looked for at the end of the output (llama.cpp's window), so end it on a token
    stop = lm.tokenizer.decode(tokens[:5])[-3:]
    r = run("completion", "-m", model, "-p", "Hello", "-n", "12", "--temp", "0", "-no-cnv", "--ignore-eos",
            "--no-display-prompt", "-r", stop)
    out = r.stdout.decode("utf-8", "replace")[:-2]
    assert stop in out and len(out) < len(full) and full.startswith(out)


def test_completion_ctrl_c_prints_perf_and_exits_130(model):
    import signal
    import time
    proc = subprocess.Popen(tool_cmd("completion") + ["-m", model, "-p", "Hi", "-n", "-1", "--ignore-eos",
                                                       "-no-cnv"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = b"-"
    while line and b"generate:" not in line:    # the last log line before generation starts
        line = proc.stderr.readline()
    assert line, "llamacmp-completion ended before generating"
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out.endswith(b"\n") and b"common_perf_print:        eval time" in err


def test_completion_escapes_and_prompt_file(model, lm, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text("Hello\\nworld")
    r = run("completion", "-m", model, "-f", str(f), "-n", "2", "--temp", "0", "-no-cnv", "--ignore-eos")
    assert r.stdout.decode("utf-8", "replace").startswith("Hello\nworld")
    r = run("completion", "-m", model, "-f", str(f), "-n", "2", "--temp", "0", "-no-cnv", "-e", "--no-escape")
    assert r.stdout.decode("utf-8", "replace").startswith("Hello\\nworld")


def test_completion_interactive_with_prefix_suffix(model):
    r = run("completion", "-m", model, "-p", "Hello", "-n", "4", "--temp", "0", "-no-cnv", "-i",
            "--in-prefix", "USER: ", "--in-suffix", "BOT:", "--ignore-eos", stdin="hi\n")
    out = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 0
    # piped input is echoed (llama.cpp's console does); typed tokens spend the -n budget as in llama-completion
    assert "USER: hi\nBOT:" in out and out.count("USER: ") == 2 and out.endswith("USER: EOF by user\n\n\n")


def test_completion_logit_bias_bans_the_greedy_token(model, lm):
    _, tokens = greedy_text(lm, "Hello", 1)
    r = run("completion", "-m", model, "-p", "Hello", "-n", "1", "--temp", "0", "-no-cnv", "--ignore-eos",
            "-l", f"{tokens[0]}-inf", "--no-display-prompt")
    assert r.returncode == 0
    assert r.stdout.decode("utf-8", "replace")[:-2] != lm.tokenizer.decode(tokens)


def test_completion_grammar_constrains_output(model):
    r = run("completion", "-m", model, "-p", "Answer:", "-n", "20", "--temp", "0", "-no-cnv",
            "--no-display-prompt", "--grammar", 'root ::= ("yes" | "no") " sir"')
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode() in ("yes sir [end of text]\n\n\n", "no sir [end of text]\n\n\n")
    r = run("completion", "-m", model, "-p", "x", "-n", "4", "-no-cnv", "--grammar", "root ::= (")
    assert r.returncode == 1 and "failed to parse grammar" in r.stderr.decode()


def test_completion_json_schema(model):
    schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], ' \
             '"additionalProperties": false}'
    r = run("completion", "-m", model, "-p", "JSON:", "-n", "40", "--temp", "0", "-no-cnv", "--no-display-prompt",
            "-j", schema)
    text = r.stdout.decode().removesuffix(" [end of text]\n\n\n")
    assert json.loads(text) in ({"ok": True}, {"ok": False})


def test_version_and_errors(model):
    r = run("completion", "--version")
    lines = r.stderr.decode().splitlines()
    assert r.returncode == 0 and re.fullmatch(r"version: 8462 \(([0-9a-f]{7,}|unknown)\)", lines[0])
    assert lines[1].startswith("built with")
    r = run("completion", "-m", model, "--frobnicate")
    assert r.returncode == 1 and r.stderr.decode().strip() == "error: invalid argument: --frobnicate"
    r = run("completion", "-m", model, "-mu", "https://example.org/m.gguf")
    assert r.returncode == 1 and "-mu is not supported" in r.stderr.decode()
    r = run("cli", "-m", model, "-i")
    assert r.returncode == 1 and "error: invalid argument: -i" in r.stderr.decode()


def test_device_flags_honoured_or_refused(model):
    r = run("completion", "-m", model, "-p", "Hi", "-n", "2", "-no-cnv", "-ngl", "0")
    assert r.returncode == 0 and "warning: -ngl 0: using the numpy reference backend" in r.stderr.decode()
    for flags, word in ((["-sm", "row"], "--split-mode row"), (["-dev", "GPU0"], "invalid device"),
                        (["-ctk", "iq4_nl"], "is not supported")):
        r = run("completion", "-m", model, "-p", "Hi", "-n", "2", "-no-cnv", *flags)
        assert r.returncode == 1 and word in r.stderr.decode(), flags
    # -ts is a layer split over the GPUs present (values past the last device ignored, as llama.cpp does)
    r = run("completion", "-m", model, "-p", "Hi", "-n", "2", "-no-cnv", "-ts", "3,1")
    assert r.returncode == 0, r.stderr.decode()


def test_hw_route_refused_where_nothing_is_routed(model):
    """--hw-route takes effect on a GPU (tests/test_routes.py, the CUDA tests) and is refused on the numpy backend."""
    r = run("completion", "-m", model, "-p", "Hi", "-n", "2", "-no-cnv", "-ngl", "0", "--hw-route", "imad")
    assert r.returncode == 1 and "--hw-route imad: the numpy backend has no hardware routes" in r.stderr.decode()
    r = run("completion", "-m", model, "-p", "Hi", "-n", "2", "-no-cnv", "-ngl", "0", "--hw-route", "auto")
    assert r.returncode == 0, r.stderr.decode()


def test_quantized_kv_cache_runs(model):
    r = run("completion", "-m", model, "-p", "Hello", "-n", "4", "--temp", "0", "-no-cnv", "--ignore-eos",
            "-ctk", "q8_0", "-ctv", "q4_0")
    assert r.returncode == 0 and r.stdout.startswith(b"Hello") and b"eval time" in r.stderr


def test_help_lists_options():
    r = run("completion", "--help")
    assert r.returncode == 0 and "--repeat-last-n N" in r.stdout.decode()


def test_missing_model_file_is_a_clear_error(tmp_path):
    r = run("completion", "-m", str(tmp_path / "nope.gguf"), "-p", "x")
    assert r.returncode == 1 and "nope.gguf" in r.stderr.decode()


# -- llamacmp-tokenize -----------------------------------------------------------------------------------------

def test_tokenize_formats(model, lm):
    ids = lm.tokenizer.encode("Hello world\n<|im_start|>", parse_special=True)
    r = run("tokenize", "-m", model, "-p", "Hello world\\n<|im_start|>", "--ids", "--log-disable")
    assert r.stdout.decode() == "[" + ", ".join(map(str, ids)) + "]\n"
    r = run("tokenize", "-m", model, "-p", "Hello world", "--show-count")
    lines = r.stdout.decode().splitlines()
    ids = lm.tokenizer.encode("Hello world")
    assert lines[0] == f"{ids[0]:6d} -> '{lm.tokenizer.decode([ids[0]])}'"
    assert lines[-1] == f"Total number of tokens: {len(ids)}"
    r = run("tokenize", "-m", model, "-p", "<|im_start|>", "--no-parse-special", "--ids")
    assert r.stdout.decode() == str(lm.tokenizer.encode("<|im_start|>", parse_special=False)) + "\n"
    r = run("tokenize", "-m", model, "--stdin", "--ids", stdin="a\\tb")
    assert r.stdout.decode() == str(lm.tokenizer.encode("a\tb")) + "\n"
    r = run("tokenize", "-m", model, "--stdin", "--ids", "--no-escape", stdin="a\\tb")
    assert r.stdout.decode() == str(lm.tokenizer.encode("a\\tb")) + "\n"


def test_tokenize_errors(model):
    assert run("tokenize", "-m", model, "--bogus").stderr.decode() == "Error: unknown option '--bogus'\n"
    assert run("tokenize", "-m", model).stderr.decode() == \
        "Error: must specify one of: --stdin, --file or --prompt.\n"
    r = run("tokenize", "-m", model, "-p", "x", "--stdin")
    assert r.returncode == 1 and "mutually exclusive" in r.stderr.decode()


# -- llamacmp-perplexity ---------------------------------------------------------------------------------------

def test_perplexity_output_and_value(model, lm, tmp_path):
    text = "The quick brown fox jumps over the lazy dog. " * 30
    f = tmp_path / "wiki.txt"
    f.write_text(text)
    n_ctx = 32
    r = run("perplexity", "-m", model, "-f", str(f), "-c", str(n_ctx), "--chunks", "3")
    assert r.returncode == 0, r.stderr.decode()
    out = r.stdout.decode()
    assert re.fullmatch(r"\d+\.\d\d minutes\n\[1\]\d+\.\d{4},\[2\]\d+\.\d{4},\[3\]\d+\.\d{4},\n\n", out), out
    m = re.search(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})", r.stderr.decode())
    assert m
    # independent computation: second half of each chunk, each chunk from an empty state
    toks = lm.tokenizer.encode(text)
    nll, count = 0.0, 0
    for i in range(3):
        chunk = toks[i * n_ctx:(i + 1) * n_ctx]
        logits = Sequence(lm, n_ctx).feed(chunk, all_logits=True).astype(np.float64)
        for j in range(n_ctx // 2, n_ctx - 1):
            row = logits[j]
            logz = row.max() + math.log(np.exp(row - row.max()).sum())
            nll += logz - row[chunk[j + 1]]
            count += 1
    assert float(m.group(1)) == pytest.approx(math.exp(nll / count), rel=1e-3)
    assert float(out.split(",")[-2].split("]")[1]) == pytest.approx(math.exp(nll / count), rel=1e-3)


def test_perplexity_needs_enough_tokens(model, tmp_path):
    f = tmp_path / "short.txt"
    f.write_text("too short")
    r = run("perplexity", "-m", model, "-f", str(f), "-c", "64")
    assert r.returncode == 0 and "you need at least 128 tokens" in r.stderr.decode()   # llama.cpp's status


# -- llamacmp-cli ---------------------------------------------------------------------------------------------

def test_chat_single_turn_with_prompt(model):
    r = run("cli", "-m", model, "-p", "Hello", "-st", "-n", "8", "--temp", "0", "--simple-io")
    out = r.stdout.decode("utf-8", "replace")
    assert r.returncode == 0, r.stderr.decode()
    assert "\n> Hello\n" in out and "[Start thinking]" in out
    assert re.search(r"\n\[ Prompt: [\d.]+ t/s \| Generation: [\d.]+ t/s \]\n", out)
    assert out.endswith("\nExiting...\n") and "\x1b" not in out


def test_chat_reads_stdin_line_by_line_with_commands(model, tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("file body")
    script = f"Hi\n/regen\n/clear\n/regen\n/read {note}\n/read {tmp_path}/missing\nsummarize /no_think\n/exit\n"
    r = run("cli", "-m", model, "-n", "4", "--temp", "0", "--verbose-prompt", stdin=script)
    out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode()
    assert r.returncode == 0, err
    assert out.count("[ Prompt:") == 3                 # Hi, its /regen, and the final message
    assert "Chat history cleared." in out and "No message to regenerate." in err
    assert f"Loaded text from '{note}'" in out and "file does not exist or cannot be opened" in err
    assert f"<|file_sep|>{note}\nfile body" in out      # the /read file joins the next message
    assert "summarize /no_think<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" in out
    assert out.endswith("\nExiting...\n")


def test_chat_reasoning_off_and_system_prompt(model):
    r = run("cli", "-m", model, "-p", "Hi", "-st", "-n", "4", "--reasoning", "off", "-sys", "Be brief",
            "--verbose-prompt", "--no-show-timings")
    out = r.stdout.decode("utf-8", "replace")
    assert "<|im_start|>system\nBe brief<|im_end|>" in out and "using custom system prompt" in out
    assert "<think>\n\n</think>\n\n" in out and "[ Prompt:" not in out and "[Start thinking]" not in out


def test_chat_reasoning_budget(model):
    # budget 0: </think> is forced before any thought, so no reasoning is shown; 2: two thoughts, then forced
    r = run("cli", "-m", model, "-p", "Hi", "-st", "-n", "6", "--temp", "0", "--reasoning-budget", "0",
            "--ignore-eos")
    assert r.returncode == 0 and "[Start thinking]" not in r.stdout.decode("utf-8", "replace")
    r = run("cli", "-m", model, "-p", "Hi", "-st", "-n", "8", "--temp", "0", "--reasoning-budget", "2",
            "--reasoning-budget-message", "Enough.", "--ignore-eos")
    out = r.stdout.decode("utf-8", "replace")
    assert "[Start thinking]" in out and "Enough.\n[End thinking]" in out


def test_env_vars_reach_the_tool(model):
    r = run("completion", "-m", model, "-p", "Hello", "--temp", "0", "-no-cnv", "--ignore-eos",
            env={"LLAMA_ARG_N_PREDICT": "3"})
    assert re.search(r"eval time = +[\d.]+ ms / +2 runs", r.stderr.decode())
    r = run("completion", "-m", model, "-p", "Hello", "--temp", "0", "-no-cnv", "--ignore-eos", "-n", "5",
            env={"LLAMA_ARG_N_PREDICT": "3"})
    assert "LLAMA_ARG_N_PREDICT environment variable is set, but will be overwritten" in r.stderr.decode()
    assert re.search(r"eval time = +[\d.]+ ms / +4 runs", r.stderr.decode())


def test_chat_no_cnv_is_refused_with_llamacpp_message(model):
    """llama-cli b8462, recorded on this fixture: these two lines open its stdout (then it carries on in chat mode
    regardless; llama.cpp 0c1e570 refuses -no-cnv in llama-cli). We print them and stop, status 1."""
    for flag in ("-no-cnv", "--no-conversation"):
        r = run("cli", "-m", model, flag, "-p", "Hi", "-st", "-n", "2")
        assert r.returncode == 1
        assert r.stdout == b"--no-conversation is not supported by llama-cli\nplease use llama-completion instead\n"
        assert "Loading model" not in r.stderr.decode()              # refused before the model loads


def test_completion_n0_prints_no_prompt(model):
    """llama-completion -n 0 never enters its loop: no prompt echo, no prompt evaluation (golden in cli.jsonl); in
    conversation mode the loop runs (interactive), as llama.cpp's does."""
    r = run("completion", "-m", model, "-p", "Hello", "-n", "0", "-no-cnv", "--temp", "0")
    assert r.returncode == 0 and r.stdout == b"\n\n"
    assert re.search(r"prompt eval time = +[\d.]+ ms / +0 tokens", r.stderr.decode())
    r = run("completion", "-m", model, "-p", "Hello", "-n", "1", "-no-cnv", "--temp", "0")
    assert r.stdout.startswith(b"Hello")                             # the echo is there when -n allows a token


def test_chat_image_command_is_refused_clearly(model):
    r = run("cli", "-m", model, "-n", "2", stdin="/image cat.png\n")
    assert "not supported" in r.stderr.decode() and r.returncode == 0


def test_no_model_and_no_bundled_model(tmp_path):
    from llamacmp.cli.common import BUNDLED_MODEL
    # -n 2 -no-cnv: the bundled model is the trained 21.6M-parameter demo (issue 9), slow-ish on numpy and never
    # trained to stop, so keep its generation short and out of conversation mode (its file has a chat template)
    r = run("completion", "-p", "def", "-n", "2", "-no-cnv")
    if BUNDLED_MODEL.exists():
        assert "no -m given: using the bundled demo model" in r.stderr.decode()
        assert r.returncode == 0 and r.stdout.decode().startswith("def")
    else:
        assert r.returncode == 1 and "error: --model is required" in r.stderr.decode()


# -- llama.cpp goldens: compat/compare_cli.py recorded llama-completion / llama-tokenize stdout on this fixture ----

GOLDENS = Path(__file__).resolve().parent.parent / "compat" / "goldens" / "cli.jsonl"


def _cli_case(row: dict) -> str:
    return f"{row['tool']} {row['args']}"


@pytest.mark.compat
@pytest.mark.parametrize("oracle,row", oracle_goldens.per_case("cli.jsonl", _cli_case))
def test_stdout_matches_llamacpp_golden(model, oracle, row, tmp_path):
    """Both oracles' recordings (b8462, 0c1e570); where they differ, compat/oracles.py DIVERGENCES says which one
    llamacmp follows."""
    row = oracle_goldens.expected("cli.jsonl", oracle, _cli_case(row), _cli_case)
    for name, text in row["files"].items():
        (tmp_path / name).write_text(text)
    args = shlex.split(row["args"].replace("{TMP}", str(tmp_path)))
    r = run(row["tool"].removeprefix("llama-"), "-m", model, *args, stdin=row["stdin"])
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == base64.b64decode(row["stdout_b64"])


@pytest.mark.compat
@pytest.mark.parametrize("oracle,path", oracle_goldens.per_oracle("cli_reply.jsonl"))
def test_chat_reply_matches_llamacli_with_blank_line_after_start_thinking(oracle, path, real_vocab_model):
    """llama-cli on the real-vocabulary fixture (compat/goldens/[0c1e570/]cli_reply.jsonl), the same bytes in both
    oracles: "[Start thinking]" is followed by a blank line (b8462: the "\\n" its reasoning kept from the prompt's
    "<think>\\n"; 0c1e570: written by the CLI, the reasoning stripped) and the greedy reply matches byte for byte."""
    golden = oracle_goldens.jsonl(path)[0]
    r = run("cli", "-m", real_vocab_model, *shlex.split(golden["args"]))
    assert r.returncode == 0, r.stderr.decode()
    want = base64.b64decode(golden["segment_b64"])
    assert want.startswith(b"\n> Hello\n\n[Start thinking]\n\n")
    assert want + b"\n[ Prompt:" in r.stdout


def test_client_resumes_from_the_reply_start_checkpoint(lm):
    """llama-cli's next turn re-renders the last reply without its reasoning, so the prompt diverges where the reply
    began: the slot resumes from the checkpoint it kept there (the server's prompt cache) instead of re-evaluating
    the whole conversation, and draws what a fresh slot cut the same way draws."""
    from llamacmp.run_plan import RunPlan
    plan = RunPlan(512, 1, "f16", "f16", 2048, 512)
    greedy = GenParams(SamplingParams(temp=0, ignore_eos=True), 6)
    first = list(range(20, 80))
    start = 50                                        # where the generation prompt (the reply) begins
    c = SlotClient(lm, plan)
    c.history = list(first)
    assert len(c.generate(greedy, checkpoint_hints=(start,)).tokens) == 6
    second = first[:start] + list(range(200, 230))    # the reply re-rendered, then the next user turn
    c.history = list(second)
    before = c.perf.snapshot()
    got = c.generate(greedy)
    assert c.perf.since(before).n_p_eval == len(second) - start
    fresh = SlotClient(lm, plan)
    fresh.history = list(second)
    assert got.tokens == fresh.generate(greedy, checkpoint_hints=(start,)).tokens
    assert c.history == second + got.tokens and c.engine.slots[0].state.n_past == len(second) + 5
