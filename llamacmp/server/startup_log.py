"""llama-server's start-up lines, in its words (tools/server/server.cpp, server-context.cpp, src/llama-model*.cpp
at b8462): the model file and its tensor-type mix, the contexts and their memory, the chat template, the slots.

Each function returns the lines; server/app.py and server/context.py log them at INFO (so -lv, --log-disable,
--log-file and --log-timestamps apply as to every other line).
"""
from __future__ import annotations

import math
from collections import Counter

from .. import memplan
from ..engine.slot_log import slot_head, srv
from ..gguf_file import GGUFFile, file_type_name

MIB = 1 << 20
GIB = 1 << 30
_VERSION_NAMES = {2: "GGUF V2", 3: "GGUF V3 (latest)"}
EXAMPLE_CHAT = [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "How are you?"}]


def model_lines(f: GGUFFile, n_ctx_train: int) -> list[str]:
    """llama_model_loader's summary (no per-key dump) and print_info's file and size lines."""
    names = f.names()
    version = _VERSION_NAMES.get(f.version, "unknown")
    out = [f"llama_model_loader: loaded meta data with {len(f.metadata)} key-value pairs and {len(names)} tensors "
           f"from {f.path} (version {version})"]
    types = Counter(f.info(n).type_name.lower() for n in names)
    out += [f"llama_model_loader: - type {t:>4}: {n:4d} tensors" for t, n in types.items()]
    n_bytes = sum(f.nbytes(n) for n in names)
    n_elements = sum(math.prod(f.info(n).shape) for n in names)
    size = f"{n_bytes / MIB:.2f} MiB" if n_bytes < GIB else f"{n_bytes / GIB:.2f} GiB"
    out += [f"print_info: file format = {version}",
            f"print_info: file type   = {file_type_name(f.metadata)}",
            f"print_info: file size   = {size} ({n_bytes * 8.0 / max(1, n_elements):.2f} BPW) ",
            f"print_info: arch                  = {f.architecture}",
            f"print_info: n_ctx_train           = {n_ctx_train}",
            f"print_info: model params          = {_params(n_elements)}",
            f"print_info: general.name          = {f.metadata.get('general.name', '')}"]
    return out


def _params(n: int) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n / 1e3:.2f} K"


def context_lines(cfg, n_slots: int, n_ctx_slot: int, unified: bool, n_batch: int, n_ubatch: int,
                  k_type: str, v_type: str) -> list[str]:
    """llama_context's sizes, then the KV cache and the recurrent (GDN) state as the engine allocates them: one
    K/V cache of n_ctx_slot rows and one conv + recurrent state per slot."""
    n_ctx = n_ctx_slot if unified else n_ctx_slot * n_slots
    def cache(t: str) -> int:
        return sum(memplan.exact(memplan.kv_quant.cache_bytes(t, n_ctx_slot, cfg.n_head_kv, cfg.head_dim))
                   for _ in cfg.attn_layers) * n_slots
    k, v = cache(k_type), cache(v_type)
    conv = memplan.exact((cfg.conv_kernel - 1) * cfg.conv_channels * 4) * len(cfg.gdn_layers) * n_slots
    ssm = memplan.exact(cfg.ssm_v_heads * cfg.ssm_head_dim * cfg.ssm_head_dim * 4) * len(cfg.gdn_layers) * n_slots
    return [f"llama_context: n_seq_max     = {n_slots}",
            f"llama_context: n_ctx         = {n_ctx}",
            f"llama_context: n_ctx_seq     = {n_ctx_slot}",
            f"llama_context: n_batch       = {n_batch}",
            f"llama_context: n_ubatch      = {n_ubatch}",
            f"llama_context: kv_unified    = {'true' if unified else 'false'}",
            f"llama_kv_cache: size = {(k + v) / MIB:7.2f} MiB ({n_ctx_slot * n_slots:6d} cells, "
            f"{len(cfg.attn_layers):3d} layers, {n_slots:2d}/{n_slots} seqs), K ({k_type}): {k / MIB:7.2f} MiB, "
            f"V ({v_type}): {v / MIB:7.2f} MiB",
            f"llama_memory_recurrent: size = {(conv + ssm) / MIB:7.2f} MiB ({n_slots:6d} cells, "
            f"{len(cfg.gdn_layers):3d} layers, {n_slots:2d} seqs), R (f32): {conv / MIB:7.2f} MiB, "
            f"S (f32): {ssm / MIB:7.2f} MiB"]


def slot_lines(n_slots: int, n_ctx_slot: int, cache_ram_mib: int) -> list[str]:
    out = [srv("load_model", f"initializing slots, n_slots = {n_slots}")]
    out += [slot_head("load_model", i, -1) + f"new slot, n_ctx = {n_ctx_slot}" for i in range(n_slots)]
    if cache_ram_mib != 0:
        limit = "no limit" if cache_ram_mib < 0 else f"{cache_ram_mib} MiB"
        out += [srv("load_model", f"prompt cache is enabled, size limit: {limit}"),
                srv("load_model", "use `--cache-ram 0` to disable the prompt cache")]
    return out


def template_lines(template, override: str, override_file: str, thinking: bool) -> list[str]:
    """Where the template came from (llamacmp's line: llama-server names it only through the example), the
    example_format llama-server prints, and whether thinking is on."""
    if override_file:
        source = f"--chat-template-file {override_file}"
    elif override:
        source = "--chat-template"
    else:
        source = "the model's tokenizer.chat_template"
    try:
        example = template.render(EXAMPLE_CHAT, enable_thinking=thinking)
    except Exception as e:          # the server still starts: requests will say what is wrong with the template
        example = f"(the template failed on the example: {e})"
    return [srv("load_model", f"chat template from {source}"),
            f"init: chat template, example_format: '{example}'",
            srv("init", f"init: chat template, thinking = {int(thinking)}")]
