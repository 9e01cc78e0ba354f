"""Which tests of llama.cpp's server suite cannot run here with the local qwen35 model, and why. A test listed
here is skipped on both servers as "not applicable"; everything else runs on both, including tests that assert
the exact replies of their tiny models (those fail on both servers alike: the comparison is server vs server on
the same model).

Keys are (test file, regular expression matched against the rest of the node id); the first match wins."""
from __future__ import annotations

import re

VISION = "needs a vision projector (their tinygemma3 mmproj, downloaded); the local model has none"
DOWNLOAD = "downloads a file from the internet (none here)"
ROUTER_HF = ("router mode loads models by Hugging Face name (ggml-org/tinygemma3-GGUF...) from llama.cpp's "
             "download cache; nothing is downloaded here")

NOT_APPLICABLE: list[tuple[str, str, str]] = [
    ("test_basic.py", r"test_load_split_model", "loads a model split in several files, downloaded"),
    ("test_vision_api.py", r"", VISION),
    ("test_slot_save.py", r"image|multimodal|mmproj", VISION),
    ("test_compat_anthropic.py", r"vision_base64_with_multimodal_model|tool_result_with_image", VISION),
    ("test_security.py", r"test_local_media_file", VISION),
    ("test_rerank.py", r"", "needs a reranker (jina-reranker-v1-tiny: a classification head, --reranking); "
                            "a qwen35 model has none"),
    ("test_lora.py", r"", "needs LoRA adapters made for their stories15M MoE model (downloaded)"),
    ("test_speculative.py", r"", "needs a separate draft model (stories15M q4_0, downloaded)"),
    ("test_router.py", r"^(?!test_router_props$)(?!.*non-existent)", ROUTER_HF),
    ("test_stream.py", r"", ROUTER_HF),
]


def not_applicable(nodeid: str) -> str:
    """The reason a test is not applicable here, or '' when it runs. nodeid: 'unit/test_x.py::test_y[params]'."""
    path, _, rest = nodeid.partition("::")
    name = path.rsplit("/", 1)[-1]
    for file, pattern, reason in NOT_APPLICABLE:
        if name == file and re.search(pattern, rest):
            return reason
    return ""
