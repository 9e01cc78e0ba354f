"""The bundled demo model's MTP head (llamacmp/demo_model.py, training/split_mtp_head.py): the head joined to the
trunk is the trained file, the join refuses another trunk, the cache is reused, and the CLI without -m drafts with
it under --spec-type draft-mtp."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # training/ (split_mtp_head) is not an installed package

from llamacmp import demo_model as dm  # noqa: E402
from llamacmp.spec import has_mtp_head  # noqa: E402

# training/README.md "The MTP head of the demo model": the file train_mtp.py exported (not in the repository)
TRAINED = Path(os.environ.get("LLAMACMP_TRAINED_MTP", "/work/cache/mtp/default-mtp.gguf"))
TRAINED_SHA256 = "27dacee72e9f8489e63c4b0972b21bbd5384163f4a0dea86a3c9b684f5f397fa"

pytestmark = pytest.mark.skipif(not (dm.BUNDLED_MODEL.exists() and dm.BUNDLED_MTP_HEAD.exists()),
                                reason="llamacmp/data/default.gguf or default-mtp-head.gguf is missing")


@pytest.fixture(scope="module")
def joined(tmp_path_factory) -> Path:
    return dm.with_mtp_head(cache=tmp_path_factory.mktemp("cache"))


def tensors(path: Path) -> list[tuple[str, int, bytes]]:
    return [(t.name, int(t.tensor_type), t.data.tobytes()) for t in gguf.GGUFReader(str(path)).tensors]


def kv(path: Path) -> dict:
    return {k: v for k, (v, _) in dm.read_kv(gguf.GGUFReader(str(path))).items()}


def test_joined_file_is_the_trunk_plus_the_head(joined):
    trunk, head, both = tensors(dm.BUNDLED_MODEL), tensors(dm.BUNDLED_MTP_HEAD), tensors(joined)
    assert both == trunk + head and len(head) == 15
    t_kv, j_kv, h_kv = kv(dm.BUNDLED_MODEL), kv(joined), kv(dm.BUNDLED_MTP_HEAD)
    assert j_kv[dm.BLOCK_COUNT] == t_kv[dm.BLOCK_COUNT] + 1 == h_kv[dm.HEAD_BLOCK_COUNT]
    assert j_kv[dm.NEXTN] == 1 and dm.NEXTN not in t_kv
    assert {k: v for k, v in j_kv.items() if k not in (dm.BLOCK_COUNT, dm.NEXTN)} == {
        k: v for k, v in t_kv.items() if k != dm.BLOCK_COUNT}
    assert list(j_kv) == [k for k in t_kv for k in ((k, dm.NEXTN) if k == dm.BLOCK_COUNT else (k,))]
    names = {name for name, _, _ in both}
    assert has_mtp_head(names, j_kv[dm.BLOCK_COUNT])
    assert not has_mtp_head({name for name, _, _ in trunk}, t_kv[dm.BLOCK_COUNT])


def test_the_head_records_its_trunk():
    h_kv = kv(dm.BUNDLED_MTP_HEAD)
    assert h_kv[dm.HEAD_TRUNK_SHA256] == dm.sha256(dm.BUNDLED_MODEL)
    assert h_kv[dm.HEAD_TRUNK_NAME] == "default.gguf" and h_kv[dm.HEAD_NEXTN] == 1


@pytest.mark.skipif(not TRAINED.exists(), reason=f"the trained file {TRAINED} is not here (LLAMACMP_TRAINED_MTP)")
def test_joined_file_is_the_trained_file(joined):
    assert tensors(joined) == tensors(TRAINED)                 # what the loader reads: every tensor's bytes
    assert dm.sha256(joined) == dm.sha256(TRAINED) == TRAINED_SHA256     # and, as written today, every byte


def test_split_of_the_joined_file_remakes_the_bundled_head(joined, tmp_path):
    from training.split_mtp_head import split
    out = split(joined, dm.BUNDLED_MODEL, tmp_path / "head.gguf")
    assert out.read_bytes() == dm.BUNDLED_MTP_HEAD.read_bytes()


def other_trunk(tmp_path: Path) -> Path:
    """default.gguf with one byte of its last tensor changed: same names and metadata, another file."""
    path = tmp_path / "default.gguf"
    shutil.copyfile(dm.BUNDLED_MODEL, path)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 1]))
    return path


def test_join_refuses_another_trunk(tmp_path):
    with pytest.raises(dm.DemoModelError, match="trained on a trunk with sha256 .* not joining them"):
        dm.with_mtp_head(trunk=other_trunk(tmp_path), cache=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()                   # refused before anything is written


def test_split_refuses_a_file_that_is_not_this_trunk_plus_a_head(joined, tmp_path):
    from training.split_mtp_head import split
    with pytest.raises(ValueError, match="no qwen35.nextn_predict_layers"):
        split(dm.BUNDLED_MODEL, dm.BUNDLED_MODEL, tmp_path / "head.gguf")
    with pytest.raises(ValueError, match="trunk tensor .* is not byte-identical"):
        split(joined, other_trunk(tmp_path), tmp_path / "head.gguf")


def test_cached_join_is_reused_and_a_broken_one_rewritten(tmp_path):
    first = dm.with_mtp_head(cache=tmp_path)
    stamp = first.stat().st_mtime_ns
    assert dm.with_mtp_head(cache=tmp_path) == first and first.stat().st_mtime_ns == stamp
    whole = first.read_bytes()
    for cut in (1000, len(whole) - 1):                         # a file cut short in its header, in its last tensor
        first.write_bytes(whole[:cut])
        assert not dm.joined_is_valid(first, dm.BUNDLED_MODEL, dm.BUNDLED_MTP_HEAD)
    again = dm.with_mtp_head(cache=tmp_path)
    assert again == first and again.stat().st_size > 20_000_000 and [p.name for p in tmp_path.rglob("*")] == [
        "demo", first.name]                                    # no temporary file left behind


def completion(*args: str, cache: Path) -> subprocess.CompletedProcess:
    """This tree's llamacmp-completion (not an installed one), the numpy backend (-ngl 0), no -m."""
    env = {**os.environ, "LLAMACMP_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "llamacmp.cli.completion", "-ngl", "0", "-no-cnv", "--temp", "0",
                           *args], capture_output=True, timeout=300, env=env, cwd=ROOT)


def test_cli_without_model_drafts_with_the_demo_head_and_keeps_greedy_text(tmp_path):
    on = completion("-p", "def ", "-n", "24", "--spec-type", "draft-mtp", cache=tmp_path)
    err = on.stderr.decode()
    assert on.returncode == 0, err
    assert "using the numpy reference backend" in err
    assert re.search(r"no -m given: using the bundled demo model with its MTP head .*demo/default-mtp-\w+\.gguf", err)
    drafted = re.search(r"draft acceptance = [\d.]+ \( *(\d+) accepted / *(\d+) generated\)", err)
    assert drafted and int(drafted.group(2)) > 0, err            # the head drafted: the joined file has one
    off = completion("-p", "def ", "-n", "24", cache=tmp_path)
    assert off.returncode == 0 and off.stdout == on.stdout and on.stdout.startswith(b"def ")
    err_off = off.stderr.decode()
    assert f"no -m given: using the bundled demo model {dm.BUNDLED_MODEL}" in err_off   # MTP off: default.gguf
    assert "draft acceptance" not in err_off


def test_cli_says_why_when_the_cache_cannot_be_written(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")                         # $LLAMACMP_CACHE/demo cannot be made under a file
    r = completion("-p", "def ", "-n", "1", "--spec-type", "draft-mtp", cache=blocked)
    assert r.returncode == 1 and "error: cannot write the demo model with its MTP head" in r.stderr.decode()
