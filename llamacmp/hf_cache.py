"""-hf / --hf-repo user/repo[:quant] without network: the GGUF that llama.cpp (or huggingface_hub) already put in a
local cache, found with llama.cpp's rules (common/hf-cache.cpp, common/download.cpp of 0c1e570; the b8462 layout
too). llamacmp never downloads; when nothing matches, the error says where it looked.

Caches, in order:
  - the Hugging Face hub layout llama.cpp 0c1e570 uses: the first of $LLAMA_CACHE, $HF_HUB_CACHE,
    $HUGGINGFACE_HUB_CACHE, $HF_HOME/hub, $XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub;
    models--<user>--<repo>/refs/main names the snapshot, snapshots/<commit>/ holds the files;
  - llama.cpp b8462's flat cache: $LLAMA_CACHE, else $XDG_CACHE_HOME/llama.cpp, else ~/.cache/llama.cpp;
    manifest=<user>=<repo>=<tag>.json names the file, stored as <user>_<repo>_<file>.
The quant tag matches a file name case-insensitively followed by '.' or '-' (default Q4_K_M, then Q8_0, then the
first model file); mmproj / imatrix / mtp- files are not models; of a split model, part 1 is taken.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

REPO = re.compile(r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$")
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")
DEFAULT_TAGS = ("Q4_K_M", "Q8_0")


class HfCacheError(ValueError):
    pass


def split_repo_tag(value: str) -> tuple[str, str]:
    repo, _, tag = value.partition(":")
    if not REPO.match(repo):
        raise HfCacheError("error: invalid HF repo format, expected <user>/<model>[:quant]")
    return repo, tag


def hub_dir(env: dict) -> Path:
    home = Path(env.get("HOME") or Path.home())
    for var, sub in (("LLAMA_CACHE", ""), ("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""), ("HF_HOME", "hub"),
                     ("XDG_CACHE_HOME", "huggingface/hub")):
        if env.get(var):
            return Path(env[var]) / sub
    return home / ".cache/huggingface/hub"


def legacy_dir(env: dict) -> Path:
    if env.get("LLAMA_CACHE"):
        return Path(env["LLAMA_CACHE"])
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "llama.cpp"
    return Path(env.get("HOME") or Path.home()) / ".cache/llama.cpp"


def is_model(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return name.endswith(".gguf") and not any(x in base for x in NOT_MODELS)


def _first_part(name: str) -> bool:
    m = SPLIT.search(name)
    return m is None or int(m.group(1)) == 1


def best_model(names: list[str], tag: str) -> str | None:
    """llama.cpp's find_best_model over relative file names (sorted, so the choice does not depend on the disk)."""
    for t in [tag] if tag else DEFAULT_TAGS:
        pattern = re.compile(re.escape(t) + r"[.-]", re.IGNORECASE)
        for name in names:
            if is_model(name) and pattern.search(name) and _first_part(name):
                return name
    if not tag:
        return next((n for n in names if is_model(n) and _first_part(n)), None)
    return None


def _snapshot(repo_path: Path) -> Path | None:
    refs = repo_path / "refs"
    if not refs.is_dir():
        return None
    commits = {f.name: f.read_text().strip() for f in sorted(refs.iterdir()) if f.is_file()}
    commit = commits.get("main") or next((c for c in commits.values() if c), "")
    snap = repo_path / "snapshots" / commit
    return snap if commit and snap.is_dir() else None


def _from_hub(hub: Path, repo: str, tag: str, hf_file: str) -> Path | None:
    snap = _snapshot(hub / ("models--" + repo.replace("/", "--")))
    if snap is None:
        return None
    names = sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*") if p.is_file())
    name = hf_file if hf_file in names else (None if hf_file else best_model(names, tag))
    return snap / name if name else None


def _from_legacy(cache: Path, repo: str, tag: str, hf_file: str) -> Path | None:
    clean = repo.replace("/", "_") + "_"
    if not hf_file:
        manifest = cache / ("manifest=" + repo.replace("/", "=") + "=" + (tag or "latest") + ".json")
        if manifest.is_file():
            try:
                hf_file = json.loads(manifest.read_text())["ggufFile"]["rfilename"]
            except (ValueError, KeyError, TypeError):
                hf_file = ""
    if hf_file:
        path = cache / (clean + hf_file.replace("/", "_").replace("\\", "_"))
        return path if path.is_file() else None
    names = sorted(p.name[len(clean):] for p in cache.glob(glob_escape(clean) + "*.gguf")) if cache.is_dir() else []
    name = best_model(names, tag)
    return cache / (clean + name) if name else None


def glob_escape(s: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", s)


def resolve(value: str, hf_file: str = "", env: dict | None = None) -> str:
    """The local path of -hf `value` (and -hff `hf_file`); HfCacheError naming the places looked in otherwise."""
    env = dict(os.environ if env is None else env)
    repo, tag = split_repo_tag(value)
    hub, legacy = hub_dir(env), legacy_dir(env)
    for found in (_from_hub(hub, repo, tag, hf_file), _from_legacy(legacy, repo, tag, hf_file)):
        if found is not None:
            return str(found)
    what = hf_file or f"a GGUF matching {tag or ' or '.join(DEFAULT_TAGS)}"
    raise HfCacheError(
        f"error: -hf {value}: {what} is not in the local caches; looked in\n"
        f"  {hub / ('models--' + repo.replace('/', '--'))} (Hugging Face hub layout, llama.cpp 0c1e570)\n"
        f"  {legacy} ({repo.replace('/', '_')}_*.gguf and manifest files, llama.cpp b8462)\n"
        "llamacmp does not download models: fetch it once with llama.cpp (-hf) or `hf download`, or pass -m FILE")
