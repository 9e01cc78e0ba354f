"""Open a GGUF and turn it into a ready model: validated config, weights on the backend, tokenizer."""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from .backends.base import Backend
from .config import ConfigError, ModelConfig
from .gguf_file import GGUFError, GGUFFile
from .models import model_class
from .weights import load_weights

log = logging.getLogger("llamacmp.engine")

_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass
class LoadedModel:
    path: str
    gguf: GGUFFile
    cfg: ModelConfig
    model: object          # models.<arch>.Model
    tokenizer: object      # tokenizer.Tokenizer
    backend: Backend

    @property
    def metadata(self) -> dict:
        return self.gguf.metadata


def _check_layers(f: GGUFFile) -> None:
    """block_count must be the number of layers whose tensors the file holds (checked before anything is sized by
    it: a block_count of 2^31 must not build a list); a smaller one would run part of the model silently."""
    key = f"{f.architecture}.block_count"
    n = f.metadata.get(key)
    if isinstance(n, bool) or not isinstance(n, int):
        raise GGUFError(f"{f.path}: '{key}' must be an integer, got {n!r:.40}")
    present = {int(m.group(1)) for m in map(_LAYER.match, f.names()) if m}
    n_present = max(present) + 1 if present else 0
    if n != n_present:
        raise GGUFError(f"{f.path}: '{key}' is {n} but the file has tensors for {n_present} layers "
                        f"(blk.0 .. blk.{n_present - 1})")


def _check_tokenizer_keys(f: GGUFFile) -> None:
    md = f.metadata
    tmpl = md.get("tokenizer.chat_template")
    if tmpl is not None and not isinstance(tmpl, str):
        raise GGUFError(f"{f.path}: 'tokenizer.chat_template' must be a string, got {type(tmpl).__name__}")
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is not None and not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        raise GGUFError(f"{f.path}: 'tokenizer.ggml.tokens' must be an array of strings")
    n = len(tokens or ())
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id",
                "tokenizer.ggml.eot_token_id"):
        v = md.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n):
            raise GGUFError(f"{f.path}: '{key}' must be a token id in 0..{n - 1}, got {v!r:.40}")


def load_tokenizer(f: GGUFFile):
    from .tokenizer import Tokenizer
    md = f.metadata
    if "tokenizer.ggml.tokens" not in md:
        raise GGUFError(f"{f.path}: no tokenizer in the file (missing 'tokenizer.ggml.tokens')")
    if md.get("tokenizer.ggml.model") != "gpt2":
        raise GGUFError(f"{f.path}: tokenizer.ggml.model '{md.get('tokenizer.ggml.model')}' is not supported "
                        "(llamacmp reads byte-level BPE, 'gpt2')")
    try:
        return Tokenizer.from_metadata(
            tokens=md["tokenizer.ggml.tokens"],
            merges=md.get("tokenizer.ggml.merges", []),
            token_types=md.get("tokenizer.ggml.token_type", [1] * len(md["tokenizer.ggml.tokens"])),
            pre=md.get("tokenizer.ggml.pre", "qwen35"),
            eos_id=md.get("tokenizer.ggml.eos_token_id"),
            bos_id=md.get("tokenizer.ggml.bos_token_id"),
            add_bos=bool(md.get("tokenizer.ggml.add_bos_token", False)),
        )
    except Exception as e:  # tokens/merges that contradict each other; the tokenizer library says which
        raise GGUFError(f"{f.path}: the tokenizer in the file is inconsistent ({e})") from None


@dataclass(frozen=True)
class ModelFile:
    """An opened GGUF with its validated config: the header is parsed once per start (~2 s with the real
    vocabulary) and this value goes to the run plan, the memory plan and the loader."""
    gguf: GGUFFile
    cfg: ModelConfig

    @property
    def path(self) -> str:
        return str(self.gguf.path)


def open_model(path: str | os.PathLike, overrides: dict | None = None) -> ModelFile:
    """Parse the header, refuse an unknown architecture or a bad config (GGUFError naming the file).
    overrides: --override-kv's key -> value, put in the metadata first (override_metadata)."""
    f = GGUFFile(path)
    if overrides:
        override_metadata(f, overrides)
    model_class(f.architecture)          # an unknown architecture is refused before the weights are read
    _check_layers(f)
    _check_tokenizer_keys(f)
    n_vocab = len(f.metadata.get("tokenizer.ggml.tokens", [])) or f.info("token_embd.weight").shape[0]
    try:
        cfg = ModelConfig.from_metadata(f.metadata, n_vocab=n_vocab, tied=not f.has("output.weight"))
    except (ConfigError, TypeError, ValueError) as e:   # wrong-typed values land here too
        raise GGUFError(f"{f.path}: {e}") from None
    return ModelFile(f, cfg)


def override_metadata(f: GGUFFile, overrides: dict) -> None:
    """--override-kv, as llama_model_loader applies it: a key the file has keeps its type (an override of another
    type is an error naming both, as llama.cpp's validate_override); a key it lacks is added. A key nothing reads
    changes nothing, as in llama.cpp."""
    md = f.metadata
    for key, value in overrides.items():
        if key in md and _kind(md[key]) != _kind(value):
            raise GGUFError(f"{f.path}: --override-kv {key}: the file's value is {_kind(md[key])}, the override "
                            f"{_kind(value)}")
        log.info("validate_override: Using metadata override (%5s) '%s' = %s", _kind(value), key, value)
        md[key] = value


def _kind(v) -> str:
    """llama.cpp's override types: bool, int, float, str (other GGUF values, arrays: their Python type)."""
    for kind, t in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(v, t):
            return kind
    return type(v).__name__


def check_weight_types(f: GGUFFile, backends: list[Backend]) -> None:
    """Refuse a tensor whose type a backend does not run (Backend.weight_types), naming the file, the tensor and
    its type: the tools call this before the memory plan, the loader again before any upload."""
    for be in backends:
        if be.weight_types is None:
            continue
        for name in f.names():
            t = f.info(name).type_name
            if t not in be.weight_types:
                raise GGUFError(f"{f.path}: tensor '{name}' has type {t}, which the {be.name} backend does not run "
                                f"yet: {t} runs on the numpy backend only so far (-ngl 0)")


def load_model(source: str | os.PathLike | ModelFile, backend: Backend, mtp: bool = True) -> LoadedModel:
    """mtp: upload the file's MTP block, if it has one (False: left on disk, as llama.cpp does without
    --spec-type draft-mtp; the memory plan then does not count it either)."""
    f, cfg, weights = _open(source, [backend])
    if not mtp:
        weights.mtp = None
    return LoadedModel(str(f.path), f, cfg, model_class(f.architecture)(cfg, weights, backend), load_tokenizer(f),
                       backend)


def load_split_model(source: str | os.PathLike | ModelFile, backends: list[Backend], ratios=None,
                     bridge: str = "auto", micro_batch: int = 512) -> LoadedModel:
    """The model's layers split over `backends` (-sm layer): lm.model is a split.model.SplitModel of the file's
    model class, lm.backend its SplitBackend. ratios: -ts (None: equal); bridge: auto | host | peer; micro_batch:
    -ub (pipelined prefill)."""
    from .split.model import SplitModel
    f, cfg, weights = _open(source, backends)
    model = SplitModel(model_class(f.architecture), cfg, weights, backends, ratios, bridge, micro_batch)
    return LoadedModel(str(f.path), f, cfg, model, load_tokenizer(f), model.backend)


def load_placed(source: str | os.PathLike | ModelFile, backends: list[Backend], ratios=None, bridge: str = "auto",
                micro_batch: int = 512, log=None, mtp: bool = True) -> LoadedModel:
    """One backend: load_model; several: load_split_model, with one line per part on `log` (device, layers,
    memory, bridge)."""
    if len(backends) == 1:
        return load_model(source, backends[0], mtp)
    lm = load_split_model(source, backends, ratios, bridge, micro_batch)
    if log is not None:
        for line in lm.model.describe():
            log.write(line + "\n")
    return lm


def _open(source: str | os.PathLike | ModelFile, backends: list[Backend]):
    mf = source if isinstance(source, ModelFile) else open_model(source)
    check_weight_types(mf.gguf, backends)
    return mf.gguf, mf.cfg, load_weights(mf.gguf, mf.cfg)
