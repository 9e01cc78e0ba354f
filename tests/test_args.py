"""The option table: llama.cpp's names, defaults, env vars, scopes, errors and the GGUF sampling-default rule."""
from __future__ import annotations

import math

import pytest

from llamacmp.args import (OPTIONS, ArgError, Unsupported, apply_gguf_sampling, options_for, parse_args,
                           process_escapes, usage_text, version_text)


def parse(tool, *argv, env=None):
    return parse_args(tool, list(argv), env or {}).params


def test_llamacpp_defaults():
    p = parse("completion")
    s = p.sampling
    assert (s.temp, s.top_k, s.top_p, s.min_p, s.typ_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (s.penalty_last_n, s.penalty_repeat, s.penalty_freq, s.penalty_present) == (64, 1.0, 0.0, 0.0)
    assert s.samplers == ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                          "temperature")
    assert (p.n_predict, p.n_ctx, p.n_batch, p.n_ubatch, s.seed) == (-1, 0, 2048, 512, -1)
    assert (p.cache_type_k, p.flash_attn, p.n_gpu_layers, p.split_mode) == ("f16", "auto", "auto", "layer")
    assert p.escape and p.display_prompt and p.conversation is None


def test_jinja_default_differs_per_tool():
    assert parse("cli").use_jinja is True
    assert parse("server").use_jinja is True
    assert parse("completion").use_jinja is False
    assert parse("completion", "--jinja").use_jinja is True
    assert parse("cli", "--no-jinja").use_jinja is False


def test_perplexity_defaults_follow_perplexity_cpp():
    p = parse("perplexity")
    assert p.n_ctx == 512 and p.escape is False


def test_short_long_and_underscore_spellings():
    a = parse("completion", "-n", "7", "--top-k", "3", "-c", "128", "-b", "64", "-ub", "16")
    b = parse("completion", "--n-predict", "7", "--top_k", "3", "--ctx_size", "128", "--batch_size", "64",
              "--ubatch-size", "16")
    for p in (a, b):
        assert (p.n_predict, p.sampling.top_k, p.n_ctx, p.n_batch, p.n_ubatch) == (7, 3, 128, 64, 16)


def test_underscore_is_not_rewritten_in_short_options():
    with pytest.raises(ArgError, match=r"^error: invalid argument: -n_gpu$"):
        parse("completion", "-n_gpu", "1")


def test_unknown_flag_message():
    with pytest.raises(ArgError) as e:
        parse("completion", "--no-such-flag")
    assert str(e.value) == "error: invalid argument: --no-such-flag"


def test_bad_int_message_has_usage():
    with pytest.raises(ArgError) as e:
        parse("completion", "-n", "many")
    text = str(e.value)
    assert text.startswith('error while handling argument "-n": stoi\n\nusage:\n-n,    --predict, --n-predict N')
    assert text.endswith("to show complete usage, run with -h")


def test_bad_float_and_missing_value():
    with pytest.raises(ArgError, match='"--temp": stof'):
        parse("completion", "--temp", "hot")
    with pytest.raises(ArgError, match="^expected value for argument$"):
        parse("completion", "-m")


def test_on_off_auto_values():
    assert parse("cli", "-fa", "1").flash_attn == "on"
    assert parse("cli", "-fa", "disabled").flash_attn == "off"
    with pytest.raises(ArgError, match="unknown value for --flash-attn: 'maybe'"):
        parse("cli", "-fa", "maybe")


def test_env_applied_then_cli_overrides_with_warning():
    env = {"LLAMA_ARG_CTX_SIZE": "4096", "LLAMA_ARG_TOP_K": "7"}
    r = parse_args("completion", ["--top-k", "3"], env)
    assert r.params.n_ctx == 4096 and r.params.sampling.top_k == 3
    assert r.warnings == ("warn: LLAMA_ARG_TOP_K environment variable is set, but will be overwritten by command "
                          "line argument --top-k",)


def test_env_booleans_and_negated_env():
    assert parse("completion", env={"LLAMA_ARG_JINJA": "true"}).use_jinja is True
    assert parse("completion", env={"LLAMA_ARG_NO_MMAP": "1"}).mmap is False
    assert parse("completion", env={"LLAMA_ARG_MMAP": "off"}).mmap is False
    with pytest.raises(ArgError, match='environment variable "LLAMA_ARG_N_PREDICT": stoi'):
        parse("completion", env={"LLAMA_ARG_N_PREDICT": "x"})


def test_scope_is_enforced():
    with pytest.raises(ArgError, match="invalid argument: -i"):
        parse("cli", "-i")
    with pytest.raises(ArgError, match="invalid argument: --chunks"):
        parse("completion", "--chunks", "3")
    assert parse("perplexity", "--chunks", "3").n_chunks == 3
    with pytest.raises(ArgError, match="invalid argument: -p"):
        parse("server", "-p", "hi")


def test_known_but_unsupported_flags_are_refused_clearly():
    for argv in (["-mu", "http://x/m.gguf"], ["--lora", "a.gguf"], ["-md", "draft.gguf"],
                 ["-ctk", "q5_1"]):
        with pytest.raises(Unsupported) as e:
            parse("completion", *argv)
        assert "not supported" in str(e.value)
    p = parse("completion", "-ctk", "q8_0", "-ctv", "q4_0")              # formats kv_quant implements
    assert (p.cache_type_k, p.cache_type_v) == ("q8_0", "q4_0")
    with pytest.raises(ArgError, match="unknown value for --cache-type-k: 'q9'"):
        parse("completion", "-ctk", "q9")
    with pytest.raises(Unsupported, match="downloading"):
        parse("completion", env={"LLAMA_ARG_MODEL_URL": "http://x/m.gguf"})
    assert parse("completion", env={"LLAMA_ARG_HF_REPO": "a/b"}).hf_repo == "a/b"   # resolved from the caches


def test_sampler_flags():
    p = parse("completion", "--temp", "0", "--top-p", "0.5", "--min-p", "0.1", "--typical", "0.9",
              "--repeat-penalty", "1.1", "--repeat-last-n", "-1", "--presence-penalty", "0.2",
              "--frequency-penalty", "0.3", "-s", "42", "--ignore-eos", "-l", "15043+1", "-l", "7-inf",
              "--samplers", "top_k;temperature")
    s = p.sampling
    assert (s.temp, s.top_p, s.min_p, s.typ_p, s.penalty_repeat, s.penalty_last_n) == (0, 0.5, 0.1, 0.9, 1.1, -1)
    assert (s.penalty_present, s.penalty_freq, s.seed, s.ignore_eos) == (0.2, 0.3, 42, True)
    assert s.logit_bias[15043] == 1.0 and math.isinf(s.logit_bias[7]) and s.logit_bias[7] < 0
    assert s.samplers == ("top_k", "temperature")
    assert parse("completion", "--sampling-seq", "kt").sampling.samplers == ("top_k", "temperature")
    with pytest.raises(ArgError, match="unknown sampler"):
        parse("completion", "--samplers", "top_k;warp")


def test_escapes_processed_unless_no_escape():
    assert parse("completion", "-p", r"a\nb\t\x41\\").prompt == "a\nb\tA\\"
    assert parse("completion", "--no-escape", "-p", r"a\nb").prompt == r"a\nb"
    assert process_escapes(r"\q stays") == r"\q stays"


def test_escapes_are_llamacpps_set_and_hex_is_a_raw_byte():
    """string_process_escapes: only \\n \\r \\t \\' \\" \\\\ and \\xHH; \\xHH is a byte of the UTF-8 text."""
    assert process_escapes(r"\a\b\f\v\?") == r"\a\b\f\v\?"           # not C's full set
    assert process_escapes(r"\'\"") == "'\""
    assert process_escapes(r"\xc3\xa9") == "\u00e9"                       # two bytes that make one character
    assert process_escapes(r"\x80").encode("utf-8", "surrogateescape") == b"\x80"    # a byte, not U+0080
    assert process_escapes(r"\x4") == r"\x4" and process_escapes(r"\x4G!") == r"\x4G!"   # strtol must read 2
    assert process_escapes("\u00e9\\n") == "\u00e9\n"


def test_a_raw_byte_escape_tokenizes_as_that_byte():
    from llamacmp.fixtures.qwen_vocab import tiny_vocab
    from llamacmp.tokenizer import Tokenizer
    v = tiny_vocab()
    tok = Tokenizer.from_metadata(v.tokens, v.merges, v.token_types, v.pre, v.eos_id, v.bos_id, v.add_bos)
    ids = tok.encode(process_escapes(r"a\xffb"))
    assert b"".join(tok.token_to_piece(t) for t in ids) == b"a\xffb"


def test_prompt_and_system_files(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("from file")
    s = tmp_path / "s.txt"
    s.write_text("system text\n")
    p = parse("cli", "-f", str(f), "-sysf", str(s))
    assert p.prompt == "from file" and p.system_prompt == "system text"
    with pytest.raises(ArgError, match="failed to open file"):
        parse("cli", "-f", str(tmp_path / "missing.txt"))


def test_reasoning_flags_and_kwargs():
    p = parse("cli", "--reasoning", "off", "--reasoning-budget", "0", "--chat-template-kwargs",
              '{"enable_thinking": true, "x": 1}')
    assert p.reasoning == "off" and p.reasoning_budget == 0 and p.chat_template_kwargs["x"] == 1
    assert p.enable_thinking is False                      # --reasoning off wins over the kwarg
    assert parse("cli", "--chat-template-kwargs", '{"enable_thinking": false}').enable_thinking is False
    assert parse("cli").enable_thinking is True
    with pytest.raises(ArgError):
        parse("cli", "--chat-template-kwargs", "[1]")


def test_gguf_sampling_defaults_apply_unless_user_set():
    md = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.top_p": 0.9,
          "general.sampling.sequence": "kpt"}
    p = parse("completion", "--top-k", "5")
    changed = apply_gguf_sampling(p, md)
    assert p.sampling.temp == pytest.approx(0.6) and p.sampling.top_p == pytest.approx(0.9)
    assert p.sampling.top_k == 5 and "top_k" not in changed
    assert p.sampling.samplers == ("top_k", "top_p", "temperature")
    p = parse("completion", "--samplers", "temperature")
    apply_gguf_sampling(p, md)
    assert p.sampling.samplers == ("temperature",)
    md = {"general.sampling.mirostat": 2, "general.sampling.mirostat_tau": 3.0, "general.sampling.xtc_probability": 0.3,
          "general.sampling.xtc_threshold": 0.2}
    p = parse("completion", "--mirostat-ent", "4")
    apply_gguf_sampling(p, md)
    assert (p.sampling.mirostat, p.sampling.mirostat_tau) == (2, 4.0)
    assert (p.sampling.xtc_probability, p.sampling.xtc_threshold) == (pytest.approx(0.3), pytest.approx(0.2))


def test_sampler_flags_set_their_fields():
    s = parse("completion", "--dry-multiplier", "0.8", "--dry-base", "2", "--dry-allowed-length", "3",
              "--dry-penalty-last-n", "64", "--dry-sequence-breaker", "a", "--dry-sequence-breaker", "b",
              "--xtc-probability", "0.5", "--xtc-threshold", "0.2", "--top-nsigma", "1.5", "--dynatemp-range", "0.3",
              "--dynatemp-exp", "2", "--mirostat", "1", "--mirostat-lr", "0.2", "--mirostat-ent", "4",
              "--adaptive-target", "0.4", "--adaptive-decay", "0.5").sampling
    assert (s.dry_multiplier, s.dry_base, s.dry_allowed_length, s.dry_penalty_last_n) == (0.8, 2.0, 3, 64)
    assert s.dry_sequence_breakers == ("a", "b")
    assert (s.xtc_probability, s.xtc_threshold, s.top_n_sigma) == (0.5, 0.2, 1.5)
    assert (s.dynatemp_range, s.dynatemp_exponent) == (0.3, 2.0)
    assert (s.mirostat, s.mirostat_eta, s.mirostat_tau) == (1, 0.2, 4.0)
    assert (s.adaptive_target, s.adaptive_decay) == (0.4, 0.5)
    assert parse("completion").sampling.dry_sequence_breakers == ("\n", ":", "\"", "*")
    assert parse("completion", "--dry-sequence-breaker", "none").sampling.dry_sequence_breakers == ()
    for argv, msg in ((["--dry-base", "0.5"], "dry-base"), (["--mirostat", "3"], "mirostat"),
                      (["--dry-penalty-last-n", "-2"], "dry-penalty-last-n"),
                      (["--dry-sequence-breaker", ""], "non-empty")):
        with pytest.raises(ArgError, match=msg):
            parse("completion", *argv)


def test_every_option_has_a_llamacpp_style_name_and_help():
    for o in OPTIONS:
        assert o.names and all(n.startswith("-") for n in o.names + o.neg), o
        assert o.help, o
        assert o.value == "" or o.parse is not None or o.unsupported, o


def test_help_lists_the_tools_options_only():
    text = usage_text("completion")
    assert "-i,    --interactive" in text and "--chunks" not in text
    assert "(env: LLAMA_ARG_CTX_SIZE)" in text
    assert {o.names[0] for o in options_for("tokenize")} >= {"-m", "-p", "-f", "--ids", "--stdin", "--no-bos"}


def test_version_text():
    first, second = version_text().splitlines()
    import re
    assert re.fullmatch(r"version: 8462 \(([0-9a-f]{7,}|unknown)\)", first)      # llama.cpp's `version: N (<commit>)`
    assert second.startswith("built with ") and "llamacmp" in second


def test_grammar_and_json_schema_flags(tmp_path):
    assert parse("completion", "--grammar", 'root ::= "yes"').grammar == 'root ::= "yes"'
    f = tmp_path / "g.gbnf"
    f.write_text('root ::= "no"')
    assert parse("completion", "--grammar-file", str(f)).grammar == 'root ::= "no"'
    assert parse("completion", "-j", '{"type": "object"}').json_schema == {"type": "object"}
    with pytest.raises(ArgError, match='"-j": expected a JSON object'):
        parse("completion", "-j", "[1]")


def test_prompt_file_keeps_crlf(tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"a\r\nb\r\n")
    assert parse("completion", "-f", str(f)).prompt == "a\r\nb\r\n"      # llama.cpp reads it as bytes
