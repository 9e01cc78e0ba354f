"""The typed result of parsing a command line: what every tool reads, with llama.cpp's defaults.

args.py fills these from LLAMA_ARG_* variables and argv; nothing downstream looks at strings again.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .sampling import SamplingParams
from .server.agent.mcp_config import McpConfig
from .spec import SpecConfig

TOOLS = ("cli", "completion", "server", "perplexity", "tokenize", "bench")


@dataclass(slots=True)
class ServerParams:
    """llama-server's own settings (scope S in common/arg.cpp); args.py fills them as `server.<field>`."""
    host: str = "127.0.0.1"             # a path ending in .sock: a UNIX socket
    port: int = 8080
    api_keys: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)     # sorted: the first names the model, as llama-server
    tags: list[str] = field(default_factory=list)        # informational: listed by /models
    endpoint_metrics: bool = False
    endpoint_slots: bool = True
    endpoint_props: bool = False
    timeout: int = 600
    threads_http: int = -1
    cache_prompt: bool = True
    cache_ram_mib: int = 8192           # -1: no limit, 0: off
    cache_idle_slots: bool = False      # --cache-idle-slots: on a launch, idle slots go to the -cram cache (off by
                                        # default here, unlike llama-server: see args.py)
    ctx_checkpoints: int = 32
    checkpoint_every: int = 8192        # -1: off
    sleep_idle_seconds: int = -1        # --sleep-idle-seconds: free the model after this long idle (-1: never)
    slot_prompt_similarity: float = 0.10
    cont_batching: bool = True
    kv_unified: bool | None = None      # None: on when -np is auto
    prefill_assistant: bool = True
    webui: bool = True                  # --ui/--webui: the chat page at / (server/webui.py)
    public_path: str = ""               # --path: serve this folder at / instead of the page
    slot_save_path: str = ""            # /slots save|restore write and read files here
    media_path: str = ""                # --media-path: file:// image URLs resolve under it (off when empty)
    api_prefix: str = ""                # --api-prefix: every route served under it ("" = at /)
    ssl_key_file: str = ""              # --ssl-key-file / --ssl-cert-file: HTTPS when both are given
    ssl_cert_file: str = ""
    embedding: bool = False             # --embeddings: /embedding and /v1/embeddings answer
    pooling: str = "none"               # --pooling none|mean|cls|last (qwen35 GGUFs name none: llama.cpp's default)
    embd_normalize: int = 2             # --embd-normalize: a request's embd_normalize when it gives none
    # CORS (server/cors.py); --tools without --cors-origins narrows the origins to "localhost" (args.py)
    cors_origins: str = "*"             # "*", "localhost" (reflect a localhost Origin only) or the header's value
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True       # with "*": the request's Origin is echoed back
    tools: list[str] = field(default_factory=list)      # --tools: built-in agent tools (server/agent/builtin.py)
    tools_runtime: str = ""             # --tools-runtime: where they run (server/agent/runtime.py)
    models_max: int = 4                 # router mode (no -m, server/router.py): reported by its /props
    models_autoload: bool = True
    mcp_file: McpConfig = field(default_factory=McpConfig)    # --mcp-servers-config (server/agent/mcp_config.py)
    mcp_json: McpConfig = field(default_factory=McpConfig)    # --mcp-servers-json
    ui_mcp_proxy: bool = False          # --webui-mcp-proxy: /cors-proxy fetches URLs for the page (cors_proxy.py)


@dataclass(slots=True)
class Params:
    tool: str
    # model and input
    model: str = ""
    kv_overrides: dict = field(default_factory=dict)    # --override-kv: GGUF metadata key -> value (loader.py)
    hf_repo: str = ""                   # -hf user/repo[:quant]: -m from the local caches (hf_cache.py)
    hf_file: str = ""                   # -hff: that file of the repo
    prompt: str = ""
    prompt_file: str = ""
    system_prompt: str = ""
    n_predict: int = -1
    n_ctx: int = 0                      # 0: the model's n_ctx_train
    n_batch: int = 2048
    n_ubatch: int = 512
    n_keep: int = 0
    # devices and memory (parsed and checked; the numpy backend ignores placement)
    n_gpu_layers: str = "auto"
    threads: int = -1
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    tensor_split: tuple[float, ...] = ()
    split_mode: str = "layer"
    main_gpu: int = 0
    devices: tuple[int, ...] | None = None   # -dev: None every visible GPU, () none (numpy reference)
    split_bridge: str = "auto"          # --split-bridge (llamacmp/split/)
    n_parallel: int = 1
    mmap: bool = True
    mlock: bool = False
    kv_offload: bool = True
    # long context (llamacmp's own; issue 7)
    sparse_prefill: bool = False        # --sparse-prefill: block-sparse attention for long prompt chunks
    sparse_budget: float = 0.25         # fraction of causal key blocks a head may visit
    sparse_min_len: int = 16384         # chunks seeing fewer keys stay dense
    device_mem_cap: int = 0             # bytes; 0: the GPU's free memory less 512 MiB
    hw_route: str = "auto"              # --hw-route (llamacmp's own; backends/routes.py): auto = the probe's choice
    warmup: bool = True
    # sampling
    sampling: SamplingParams = field(default_factory=SamplingParams)
    grammar: str = ""                   # GBNF text (--grammar / --grammar-file)
    json_schema: dict | None = None     # -j / -jf
    # conversation / display
    conversation: bool | None = None    # None: auto (on when the model has a template)
    interactive: bool = False
    interactive_first: bool = False
    single_turn: bool = False
    multiline_input: bool = False
    antiprompt: list[str] = field(default_factory=list)
    input_prefix: str = ""
    input_suffix: str = ""
    input_prefix_bos: bool = False
    special: bool = False
    escape: bool = True
    display_prompt: bool = True
    verbose_prompt: bool = False
    simple_io: bool = False
    show_timings: bool = True
    color: str = "auto"
    # chat templates and reasoning
    use_jinja: bool = False
    chat_template: str = ""
    chat_template_file: str = ""
    chat_template_kwargs: dict = field(default_factory=dict)
    reasoning_format: str = "auto"
    reasoning: str = "auto"
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""
    # logging
    log_disable: bool = False
    log_file: str = ""
    verbosity: int = 3
    log_colors: str = "auto"            # --log-colors on|off|auto
    log_prefix: bool = False            # --log-prefix: the level letter before each line
    log_timestamps: bool = False        # --log-timestamps: the time since start before each line
    # perplexity
    n_chunks: int = -1
    ppl_stride: int = 0
    ppl_output_type: int = 0
    # tokenize
    ids_only: bool = False
    read_stdin: bool = False
    no_bos: bool = False
    no_parse_special: bool = False
    show_count: bool = False
    # multimodal (vision projector)
    mmproj: str = ""                    # -mm FILE
    mmproj_auto: bool = True            # --no-mmproj: ignore -mm
    image: list[str] = field(default_factory=list)   # --image FILE[,FILE] (cli)
    image_min_tokens: int = 0           # --image-min-tokens / --image-max-tokens: 0 = the projector's default
    image_max_tokens: int = 0
    # speculative decoding (--spec-*; spec.py), checked in run_plan.py
    spec: SpecConfig = field(default_factory=SpecConfig)
    # llama-server
    server: ServerParams = field(default_factory=ServerParams)
    # bookkeeping: which dests the user set (CLI or env), for the GGUF general.sampling.* rule
    user_set: set[str] = field(default_factory=set)

    @property
    def mmproj_path(self) -> str:
        """The projector to load: -mm, unless --no-mmproj."""
        return self.mmproj if self.mmproj_auto else ""

    @property
    def enable_thinking(self) -> bool:
        """--reasoning on/off sets the template kwarg; an explicit kwarg wins over auto."""
        if self.reasoning in ("on", "off"):
            return self.reasoning == "on"
        return bool(self.chat_template_kwargs.get("enable_thinking", True))


def tool_defaults(tool: str) -> Params:
    """Per-tool defaults where llama.cpp's examples change them."""
    p = Params(tool=tool)
    if tool in ("cli", "server"):
        p.use_jinja = True
    if tool == "server":
        p.n_parallel = -1                # auto: 4 slots with a unified KV cache
    if tool == "cli":
        p.verbosity = 1                  # llama-cli: LOG_LEVEL_ERROR by default
    if tool == "perplexity":
        p.n_ctx = 512                    # perplexity.cpp: params.n_ctx = 512 before parsing
        p.escape = False
    return p
