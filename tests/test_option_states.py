"""Every llama.cpp flag is honoured, a no-op said once on stderr, or refused naming it (issue 23, docs/CLI.md)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from llamacmp.args import Unsupported, parse_args
from llamacmp.cli.bench_options import BenchError, parse_bench_args
from llamacmp.params import tool_defaults
from llamacmp.server.listen import listening_address, uvicorn_kwargs, with_prefix

ROOT = Path(__file__).resolve().parents[1]


def parse(tool, *argv):
    return parse_args(tool, list(argv), {})


def test_noop_flags_are_said_once_each():
    r = parse("cli", "-t", "4", "--mlock", "-t", "8", "--no-mmap", "-tb", "2")
    said = [w for w in r.warnings if "changes nothing" in w]
    assert [w.split(":")[1].strip().split()[0] for w in said] == ["-t", "--mlock", "--no-mmap", "-tb"]
    assert "one Python thread" in said[0]
    assert parse("cli").warnings == ()          # nothing said when nothing was passed


@pytest.mark.parametrize("tool,argv", [
    ("server", ["--spec-draft-model", "d.gguf"]), ("cli", ["--spec-ngram-mod-n-max", "8"]), ("server", ["-md", "d.gguf"]),
    ("server", ["--spec-type", "ngram-simple"]), ("completion", ["--control-vector", "v.gguf"]),
    ("server", ["--models-preset", "p.ini"]), ("server", ["--models-dir", "/m"]), ("server", ["--reuse-port"]),
    ("perplexity", ["--hellaswag"]), ("server", ["--kv-unified-per-slot", "4096"]),
])
def test_refused_flags_name_themselves(tool, argv):
    with pytest.raises(Unsupported, match=argv[0].lstrip("-")):
        parse(tool, *argv)


def test_split_mode_row_is_refused_the_same_way_everywhere():
    messages = set()
    for tool in ("cli", "completion", "server", "perplexity"):
        with pytest.raises(Unsupported) as e:
            parse(tool, "-sm", "row")
        messages.add(str(e.value))
    with pytest.raises(BenchError) as e:
        parse_bench_args(["-sm", "row"])
    messages.add(str(e.value))
    assert len(messages) == 1 and "--split-mode row" in messages.pop()
    assert parse("server", "-sm", "none").params.split_mode == "none"


def test_default_only_flags():
    assert parse("completion", "--rope-freq-base", "0", "--yarn-ext-factor", "-1").params is not None
    with pytest.raises(Unsupported, match="--rope-freq-base 10000"):
        parse("completion", "--rope-freq-base", "10000")
    with pytest.raises(Unsupported, match="--rope-scaling yarn"):
        parse("server", "--rope-scaling", "yarn")


def test_flags_that_take_effect():
    p = parse("server", "-cms", "4096", "--api-prefix", "/llm/", "--reasoning-effort", "high",
              "--no-context-shift", "--offline").params
    assert p.server.checkpoint_every == 4096 and p.server.api_prefix == "/llm"
    assert p.chat_template_kwargs == {"reasoning_effort": "high"}
    assert parse("server", "--reasoning-effort", "default").params.chat_template_kwargs == {}


def test_binary_file_prompt_keeps_crlf(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"line one\r\nline two\r\n")
    assert parse("completion", "-bf", str(f)).params.prompt == "line one\r\nline two\r\n"


def test_tokenize_takes_the_common_options_and_says_they_do_nothing():
    r = parse("tokenize", "-m", "x.gguf", "-p", "hi", "-ngl", "99", "-c", "4096", "-ctkd", "q8_0")
    assert r.params.n_gpu_layers == "auto" and r.params.n_ctx == 0
    assert any("-ngl changes nothing" in w and "tokenizer" in w for w in r.warnings)


def test_bench_noops_and_refusals():
    s = parse_bench_args(["-t", "4", "--numa", "distribute", "-mg", "0"])
    assert len(s["notes"]) == 2
    with pytest.raises(BenchError, match="-mg 1"):
        parse_bench_args(["-mg", "1"])
    with pytest.raises(BenchError, match="-ts"):
        parse_bench_args(["-ts", "1/1"])


def test_api_prefix_and_tls_listening():
    from fastapi import FastAPI
    inner = FastAPI()
    inner.add_api_route("/health", lambda: {"status": "ok"}, methods=["GET"])
    client = TestClient(with_prefix(inner, "/llm"))
    assert client.get("/llm/health").json() == {"status": "ok"}
    assert client.get("/health").status_code == 404
    p = tool_defaults("server")
    p.server.ssl_key_file, p.server.ssl_cert_file, p.server.api_prefix = "k.pem", "c.pem", "/llm"
    assert uvicorn_kwargs(p)["ssl_certfile"] == "c.pem"
    assert listening_address(p) == "https://127.0.0.1:8080/llm"
    p.server.ssl_cert_file = ""
    with pytest.raises(ValueError, match="together"):
        uvicorn_kwargs(p)


def _diff_module():
    if "option_table_diff" not in sys.modules:
        spec = importlib.util.spec_from_file_location("option_table_diff", ROOT / "compat/option_table_diff.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["option_table_diff"] = mod      # dataclasses look their module up while the file runs
        spec.loader.exec_module(mod)
    return sys.modules["option_table_diff"]


def test_option_table_parser_reads_common_arg_cpp():
    d = _diff_module()
    src = '''
    add_opt(common_arg(
        {"-x", "--ex"}, {"--no-ex"}, "N", "help with a // slash and a }",
        [](common_params & params, int value) { params.x = value; }
    ).set_examples({LLAMA_EXAMPLE_SERVER, LLAMA_EXAMPLE_CLI}).set_env("LLAMA_ARG_X"));
    // add_opt(common_arg({"--commented"}, "gone", [](common_params &) {}));
    add_opt(common_arg({"--common"}, "h", [](common_params &) {}).set_excludes({LLAMA_EXAMPLE_SERVER}));
    '''
    assert d.common_options(src) == [(("-x", "--ex", "--no-ex"), "LLAMA_ARG_X", {"SERVER", "CLI"}, set()),
                                     (("--common",), "", {"COMMON"}, {"SERVER"})]


@pytest.mark.skipif(not all(Path(t, "common/arg.cpp").exists() for t in _diff_module().TREES.values()),
                    reason="llama.cpp b8462 / 0c1e570 sources not in /work/cache/src (see compat/option_table_diff.py)")
def test_no_llama_cpp_flag_without_a_state():
    d = _diff_module()
    gaps = [(tool, row[0]) for tool in d.EXAMPLES for row in d.rows(tool) if "MISSING" in row[2]]
    assert gaps == []
    assert sum(len(d.rows(t)) for t in d.EXAMPLES) > 700     # both versions' tables were read


def test_tokenize_without_model_fails_with_llama_tokenize_message(capsys):
    from llamacmp.cli.tokenize import run
    assert run(["-p", "hello"]) == 1
    assert capsys.readouterr().err == "Error: must specify --model.\n"      # b8462 tokenize.cpp, before the prompt


@pytest.mark.skipif(not all(Path(t, "common/arg.cpp").exists() for t in _diff_module().TREES.values()),
                    reason="llama.cpp b8462 / 0c1e570 sources not in /work/cache/src (see compat/option_table_diff.py)")
def test_generated_flag_table_does_not_depend_on_the_hash_seed(tmp_path):
    """A flag whose spellings share a state with different reasons was listed in set order (it changed between runs)."""
    import subprocess
    outs = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"cli_{seed}.md"
        out.write_text((ROOT / "docs/CLI.md").read_text())
        subprocess.run([sys.executable, str(ROOT / "compat/option_table_diff.py"), "--markdown", str(out)], check=True,
                       capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed})
        outs.append(out.read_text())
    assert outs[0] == outs[1] == outs[2] == (ROOT / "docs/CLI.md").read_text()
