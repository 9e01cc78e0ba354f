"""Issue 7 on the GPU in one call: KV-format quality and long-context speed/memory, markdown tables for RESULTS.md.

    python3 benchmarks/long_context.py --trained /tmp/trained-q8_0.gguf --heldout /tmp/trained-heldout.txt \
        --m9b /tmp/m9b.gguf --json /tmp/long_context.json            # all parts, ~4.5 min on an H200

Parts (--parts a,b,c,d,e; each runs in its own process so that device memory starts clean and a failure in one
does not lose the others; estimated H200 time with the defaults in brackets):
  a  perplexity per KV format on the trained model's held-out text through llamacmp-perplexity's own code path
     (-c 2048 = the training length, --chunks 16; -ctk/-ctv f16, q8_0, q4_0, tq3, q8_0/tq3, tq3/tq3)   [~40 s]
  b  retrieval accuracy (benchmarks/retrieval.py's documents and scoring) at 4K, 16K, 64K for f16, q8_0/tq3,
     tq3/tq3 and f16 with --sparse-prefill (min length 8192), the same documents for every configuration [~90 s]
  c  decode t/s at a 131072-token context, -ctk/-ctv f16 vs tq3, 9B shapes (make_9b's random Q8_0 file), the
     greedy CUDA graph of llamacmp-bench; the context is filled by writing random keys/values straight into the
     cache (what decode reads does not depend on the values; a real 128K prefill would cost minutes)     [~35 s]
  d  prefill of one 9B attention layer over a whole 64K and 128K prompt in -ub 512 chunks, dense vs
     --sparse-prefill (budget 0.25): write + probe + selection + kernel, per chunk timed; the probe + selection
     column drains the queue before it starts (else it absorbs the previous chunk's attention kernel), its host
     column is sparse_attn's selection and lists alone; the whole-model estimate adds 8 such layers to the rest
     of the model measured at pp4096 and scaled linearly                                              [~45 s]
  e  device memory of 9B Q8_0 at -c 262144 under --device-mem-cap 16 (tq3/tq3, then q8_0/tq3): the memory plan,
     the arena, and the device's used memory (cudaMemGetInfo, CUDA context included) after a 2048-token
     prompt and 16 decode steps through the engine's Sequence                                           [~50 s]
make_9b writes /tmp/m9b.gguf when it is missing (~60 s, counted in c). Trimmed to fit 5 minutes: perplexity at
2048 only, retrieval at 3 lengths with --docs 5 (the 95% intervals are wide: +-25 points; the trained model
retrieves at chance, so answer-token NLL and the KL against f16 dense at the answer positions are the measures
that move), decode at one depth,
prefill timed on one attention layer instead of the whole model, memory at one short prompt (the KV cache of the
full context is allocated up front, so a longer prompt changes only activations, which the plan bounds).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GIB = 1 << 30
PPL_PAIRS = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("tq3", "tq3"), ("q8_0", "tq3"), ("f16", "tq3")]
RETRIEVAL_CONFIGS = "f16/f16,q8_0/tq3,tq3/tq3,f16/f16+sparse"    # K/V formats, +sparse: with --sparse-prefill


def _bytes_rel(k: str, v: str) -> float:
    from llamacmp import kv_quant
    return (kv_quant.BYTES_PER_VALUE[k] + kv_quant.BYTES_PER_VALUE[v]) / (2 * kv_quant.BYTES_PER_VALUE["f16"])


# -- a: perplexity -------------------------------------------------------------------------------------------------

def part_a(args) -> dict:
    from llamacmp.cli import perplexity
    rows = []
    for k, v in PPL_PAIRS:
        err = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = perplexity.main(["-m", args.trained, "-f", args.heldout, "-c", str(args.ppl_ctx), "--chunks",
                                  str(args.ppl_chunks), "-b", "2048", "-ub", "512", "-ctk", k, "-ctv", v])
        m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", err.getvalue())
        if rc != 0 or not m:
            rows.append({"k": k, "v": v, "error": err.getvalue()[-400:]})
            continue
        rows.append({"k": k, "v": v, "ppl": float(m.group(1)), "pm": float(m.group(2)),
                     "seconds": time.perf_counter() - t0})
    base = next((r["ppl"] for r in rows if r.get("ppl") and (r["k"], r["v"]) == ("f16", "f16")), None)
    lines = [f"| -ctk | -ctv | bytes/token vs f16 | PPL (-c {args.ppl_ctx}, {args.ppl_chunks} chunks) | delta vs f16 |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['k']} | {r['v']} | {_bytes_rel(r['k'], r['v']):.3f} | failed: "
                         f"{r['error'].strip().splitlines()[-1] if r['error'].strip() else '?'} | |")
            continue
        delta = f"{100 * (r['ppl'] / base - 1):+.2f}%" if base else "?"
        lines.append(f"| {r['k']} | {r['v']} | {_bytes_rel(r['k'], r['v']):.3f} | {r['ppl']:.4f} +/- {r['pm']:.4f} "
                     f"| {delta} |")
    return {"rows": rows, "table": lines}


# -- b: retrieval --------------------------------------------------------------------------------------------------

def _score(session, prompt: list[int], answer: list[int]) -> tuple[int, int, float, float, np.ndarray]:
    """retrieval.score_doc's teacher-forced scoring, keeping the log-probabilities of every answer step:
    (all right, tokens right, summed NLL, prefill seconds, logp [len(answer), n_vocab])."""
    session.reset()
    t0 = time.perf_counter()
    logits = session.feed(prompt)
    prefill = time.perf_counter() - t0
    rows = []
    for i, tok in enumerate(answer):
        x = np.asarray(logits, np.float64)
        rows.append(x - (x.max() + math.log(np.exp(x - x.max()).sum())))
        if i + 1 < len(answer):
            logits = session.feed([tok])
    logp = np.stack(rows)
    hits = int((logp.argmax(1) == np.asarray(answer)).sum())
    return int(hits == len(answer)), hits, float(-logp[np.arange(len(answer)), answer].sum()), prefill, logp


def part_b(args) -> dict:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import retrieval
    from llamacmp.backends.select import select_backend
    from llamacmp.engine.sequence import Sequence
    from llamacmp.loader import load_model
    from llamacmp.sparse_attn import SparseConfig
    be = select_backend()
    lm = load_model(args.trained, be)
    lengths = [int(x) for x in args.ret_lengths.split(",")]
    ratio, docs = [retrieval.TOKENS_PER_WORD], {}
    for i in range(args.ret_docs):                      # the same documents for every configuration
        for n in lengths:
            docs[n, i] = retrieval.make_doc(lm.tokenizer, n, i, 0, 8, 8, ratio)
    rows, base = [], {}
    t_all = time.perf_counter()
    configs = [(c.split("+")[0].split("/")[0], c.split("+")[0].split("/")[1], c.endswith("+sparse"))
               for c in args.ret_configs.split(",")]
    for ci, (k, v, sparse) in enumerate(configs):
        be.sparse = SparseConfig(budget=args.sparse_budget, min_len=args.ret_sparse_min) if sparse else None
        be.sparse_stats = None
        res = {n: retrieval.LengthResult(n) for n in lengths}
        kl = {n: [] for n in lengths}
        sessions = {n: Sequence(lm, n, 512, 512, k, v) for n in lengths}
        t0 = time.perf_counter()
        for i in range(args.ret_docs):
            if time.perf_counter() - t0 > args.ret_seconds_per_config:
                break
            for n in lengths:
                prompt, answer = docs[n, i]
                exact, hits, nll, prefill, logp = _score(sessions[n], prompt, answer)
                if ci == 0:
                    base[n, i] = logp
                elif (n, i) in base:        # KL(first config || this one) at the answer positions
                    p = np.exp(base[n, i])
                    kl[n].append(float(np.mean(np.sum(p * (base[n, i] - logp), axis=1))))
                r = res[n]
                r.docs, r.exact, r.token_hits, r.nll_sum = r.docs + 1, r.exact + exact, r.token_hits + hits, \
                    r.nll_sum + nll
                r.answer_tokens += len(answer)
                r.prompt_tokens.append(len(prompt))
                r.prefill_s += prefill
        del sessions
        density = be.sparse_stats.density if sparse and be.sparse_stats else None
        rows.append({"k": k, "v": v, "sparse": sparse, "density": density, "seconds": time.perf_counter() - t0,
                     "lengths": [res[n].row() | {"kl_vs_first": float(np.mean(kl[n])) if kl[n] else 0.0}
                                 for n in lengths]})
    be.sparse = None
    first = f"{configs[0][0]}/{configs[0][1]}{' sparse' if configs[0][2] else ''}"
    lines = ["| -ctk | -ctv | prefill | " + " | ".join(f"{n // 1024}K: exact (95% CI) / answer-token acc. / NLL / "
                                                       f"KL vs {first}, docs" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for r in rows:
        cells = [f"{x['accuracy']:.2f} ({x['accuracy_95ci'][0]:.2f}-{x['accuracy_95ci'][1]:.2f}) / "
                 f"{x['token_accuracy']:.3f} / {x['answer_nll']:.3f} / {x['kl_vs_first']:.2e}, {x['docs']}"
                 for x in r["lengths"]]
        mode = (f"sparse (budget {args.sparse_budget}, from {args.ret_sparse_min} keys; "
                f"{100 * r['density']:.0f}% of blocks)" if r["sparse"] and r["density"] is not None else
                "sparse (not engaged)" if r["sparse"] else "dense")
        lines.append(f"| {r['k']} | {r['v']} | {mode} | " + " | ".join(cells) + " |")
    return {"rows": rows, "table": lines, "seconds": time.perf_counter() - t_all}


# -- c, d: the 9B shapes -------------------------------------------------------------------------------------------

def _make_9b_if_missing(path: str) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_model
    if not os.path.exists(path):
        t0 = time.time()
        bench_model.make_9b(path)
        print(f"wrote {path} in {time.time() - t0:.0f} s", flush=True)


def _load_9b(path: str, be):
    _make_9b_if_missing(path)
    import bench_model
    return bench_model.load(path, be)


def fill_kv(be, st, cfg, n: int, chunk: int = 4096, seed: int = 0) -> None:
    """Write n positions of random keys/values into every attention layer's cache of `st` (in its formats) with
    the backend's own KV write, and mark them present."""
    from llamacmp.lib._native import SIGNATURES
    rng = np.random.default_rng(seed)
    Hk, Dh = cfg.n_head_kv, cfg.head_dim
    k = be.from_host(rng.standard_normal((chunk, Hk, Dh)).astype(np.float32), "f32", "random keys")
    v = be.from_host(rng.standard_normal((chunk, Hk, Dh)).astype(np.float32), "f32", "random values")
    codes = {"f32": 0, "f16": 1, "q8_0": 2, "q4_0": 3, "tq3": 4}
    for p0 in range(0, n, chunk):
        L = min(chunk, n - p0)
        pos = be.from_host(np.arange(p0, p0 + L, dtype=np.int32), "i32", "positions")
        for layer in range(len(cfg.attn_layers)):
            kc, vc = st.k[layer], st.v[layer]
            if "cmp_kv_write_q" in SIGNATURES:
                be.native.cmp_kv_write_q(k.ptr, v.ptr, pos.ptr, kc.ptr, vc.ptr, codes[st.k_type], codes[st.v_type],
                                         L, Hk, Dh)
            else:
                be.native.cmp_kv_write(k.ptr, v.ptr, pos.ptr, kc.ptr, vc.ptr, codes[st.k_type], L, Hk, Dh)
    be.synchronize()
    st.n_past = n


def part_cd(args) -> dict:
    from llamacmp.backends.base import StepBatch
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.backends.cuda_graphs import CapturedStep
    from llamacmp.sparse_attn import SparseConfig
    be = CudaBackend()
    cfg, model = _load_9b(args.m9b, be)
    out = {}
    if "c" in args.parts:
        rows = []
        for kv in ("f16", "tq3"):
            try:
                st = be.new_state(cfg, args.depth + args.n_gen + 8, kv, kv)
            except ValueError as e:
                rows.append({"kv": kv, "error": str(e)})
                continue
            fill_kv(be, st, cfg, args.depth)
            graph = CapturedStep(be, model, [st], greedy=True)
            graph.set_tokens([1])
            for _ in range(4):
                graph.step_greedy()
            be.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.n_gen):
                graph.step_greedy()
            be.synchronize()
            dt = time.perf_counter() - t0
            rows.append({"kv": kv, "tok_s": args.n_gen / dt, "ms_per_tok": 1e3 * dt / args.n_gen})
            del graph, st
        lines = [f"| -ctk/-ctv | tg{args.n_gen} @ d{args.depth} t/s | ms/token |", "|---|---:|---:|"]
        lines += [f"| {r['kv']} | {r['tok_s']:.1f} | {r['ms_per_tok']:.2f} |" if "error" not in r else
                  f"| {r['kv']} | refused: {r['error']} | |" for r in rows]
        out["c"] = {"rows": rows, "table": lines}
    if "d" in args.parts:
        # the rest of the model: pp4096 of the whole model (dense; attention is a small part at 4K)
        st = be.new_state(cfg, 4096 + 8, "f16", "f16")
        ids = [int(i) for i in np.random.default_rng(1).integers(0, cfg.n_vocab, 4096)]
        model.forward(StepBatch.build([(st, ids[:512])]))
        st.n_past = 0
        be.synchronize()
        t0 = time.perf_counter()
        for c0 in range(0, 4096, 512):
            model.forward(StepBatch.build([(st, ids[c0:c0 + 512])]))
        be.synchronize()
        t_pp4096 = time.perf_counter() - t0
        del st
        rows = []
        from llamacmp.lib._native import SIGNATURES
        # dense, sparse with the selection on the host, then (where the library has it) on the device: last, so
        # that a failure of the newest kernel loses no other row
        lengths = [int(x) for x in args.prefill_lengths.split(",")]
        runs = [(n, sparse, False) for n in lengths for sparse in (False, True)]
        runs += [(n, True, True) for n in lengths] if "cmp_sparse_select" in SIGNATURES else []
        for n, sparse, on_device in runs:
            be.sparse = SparseConfig(budget=args.sparse_budget, min_len=args.sparse_min) if sparse else None
            be.sparse_stats, be.sparse_device_select = None, on_device
            try:
                row = _attention_prefill(be, cfg, n, sparse, args.prefill_ub)
            except Exception as e:             # the device selection is new: report it, keep the other rows
                if not on_device:
                    raise
                row = {"error": f"{type(e).__name__}: {e}"}
            finally:
                be.sparse, be.sparse_device_select = None, False
            rows.append(row | {"n": n, "sparse": sparse, "device_select": on_device})
        layers = len(cfg.attn_layers)
        lines = [f"| prompt (-ub {args.prefill_ub}) | attention | one attention layer s | of which probe + selection s "
                 f"(probe kernel, copies, host) | of which host selection s (ms per sparse chunk) | blocks visited "
                 f"| est. whole prefill s (8 layers + rest, rest from pp4096 = {t_pp4096:.2f} s) |",
                 "|---:|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['n']} | sparse, device selection | failed: {r['error']} | | | | |")
                continue
            est = layers * r["seconds"] + t_pp4096 * r["n"] / 4096
            mode = ("sparse" if r["engaged"] else "sparse (NOT engaged: attention does not call sparse_lists)") \
                if r["sparse"] else "dense"
            mode += ", device selection" if r["device_select"] else ""
            per = 1e3 * r["host_s"] / max(r["chunks_sparse"], 1)
            lines.append(f"| {r['n']} | {mode} | {r['seconds']:.2f} | {r['probe_s']:.2f} | {r['host_s']:.2f} "
                         f"({per:.1f}) | {100 * r['density']:.0f}% | {est:.1f} |")
        out["d"] = {"rows": rows, "table": lines, "pp4096_s": t_pp4096}
    return out


def _attention_prefill(be, cfg, n: int, sparse: bool, chunk: int = 512) -> dict:
    """One attention layer (layer slot 0) over an n-token prompt in `chunk`-row pieces: random post-RoPE q, k, v
    (one random chunk reused: the cost does not depend on the values), write + attend per chunk, timed."""
    from llamacmp.backends.base import StepBatch
    rng = np.random.default_rng(2)
    Hq, Hk, Dh = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    q = be.from_host(rng.standard_normal((chunk, Hq, Dh)).astype(np.float32), "f32")
    k = be.from_host(rng.standard_normal((chunk, Hk, Dh)).astype(np.float32), "f32")
    v = be.from_host(rng.standard_normal((chunk, Hk * Dh)).astype(np.float32), "f32")
    st = be.new_state(cfg, n, "f16", "f16")
    probe, host = [0.0], [0.0]
    inner = be.sparse_lists if hasattr(be, "sparse_lists") else None
    from llamacmp import sparse_attn as sa
    host_fns = {name: getattr(sa, name) for name in ("select_from_stats", "block_lists")}

    def timed(*a, **kw):                       # benchmark instrumentation: time the probe + selection
        # sparse_lists copies the probe statistics to the host, which waits for every kernel queued before it
        # (the previous chunk's attention): drain the queue first so that only the probe and selection count
        be.synchronize()
        t = time.perf_counter()
        r = inner(*a, **kw)
        probe[0] += time.perf_counter() - t
        return r

    def host_timed(fn):                        # and the host part of it: sparse_attn's selection and lists
        def f(*a, **kw):
            t = time.perf_counter()
            r = fn(*a, **kw)
            host[0] += time.perf_counter() - t
            return r
        return f
    if inner is not None:
        be.sparse_lists = timed
        for name, fn in host_fns.items():
            setattr(sa, name, host_timed(fn))
    try:
        be.synchronize()
        t0 = time.perf_counter()
        for p0 in range(0, n, chunk):
            batch = StepBatch.build([(st, [0] * chunk)])
            be.attention(q, k, v, batch, 0, cfg)
            st.n_past += chunk
        be.synchronize()
        seconds = time.perf_counter() - t0
    finally:
        if inner is not None:
            del be.sparse_lists
            for name, fn in host_fns.items():
                setattr(sa, name, fn)
    stats = be.sparse_stats
    engaged = bool(stats and stats.chunks_sparse)
    return {"seconds": seconds, "probe_s": probe[0], "host_s": host[0], "engaged": engaged,
            "chunks_sparse": stats.chunks_sparse if stats else 0, "density": stats.density if engaged else 1.0}


# -- e: memory -----------------------------------------------------------------------------------------------------

def part_e(args) -> dict:
    from llamacmp import memplan
    from llamacmp.args import parse_args
    from llamacmp.backends.cuda import CudaBackend
    from llamacmp.engine.sequence import Sequence
    from llamacmp.loader import load_model
    _make_9b_if_missing(args.m9b)
    rows = []
    for k, v in (("tq3", "tq3"), ("q8_0", "tq3")):
        p = parse_args("completion", ["-c", str(args.mem_ctx), "-ctk", k, "-ctv", v, "--device-mem-cap",
                                      str(args.cap_gib)]).params
        be = CudaBackend(arena_bytes=p.device_mem_cap)
        free0, total = be.native.mem_info()
        row = {"k": k, "v": v}
        try:
            plan = memplan.prepare_device(be, args.m9b, p, args.mem_ctx, 1)
            row["plan_gib"] = plan.total / GIB
            lm = load_model(args.m9b, be)
            s = Sequence(lm, args.mem_ctx, 2048, 512, k, v)
            ids = [int(i) % lm.cfg.n_vocab for i in np.random.default_rng(3).integers(0, lm.cfg.n_vocab, 2048)]
            logits = s.feed(ids)
            for _ in range(16):
                logits = s.feed([int(np.argmax(np.asarray(logits)))])
            be.synchronize()
            free1, _ = be.native.mem_info()
            row.update(arena_reserved_gib=be.arena.reserved / GIB, arena_in_use_gib=be.arena.in_use / GIB,
                       device_used_gib=(total - free1) / GIB, process_gib=(free0 - free1) / GIB, ok=True)
            del s, lm
        except Exception as e:          # a refusal or an out-of-memory is the result
            row.update(ok=False, error=f"{type(e).__name__}: {e}")
        be.arena.close()
        rows.append(row)
    lines = [f"| -ctk | -ctv | plan GiB | arena reserved GiB | arena in use GiB | device used GiB (all, CUDA context "
             f"incl.) | result (-c {args.mem_ctx}, cap {args.cap_gib} GiB) |", "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if r.get("ok"):
            lines.append(f"| {r['k']} | {r['v']} | {r['plan_gib']:.2f} | {r['arena_reserved_gib']:.2f} | "
                         f"{r['arena_in_use_gib']:.2f} | {r['device_used_gib']:.2f} | ran (2048-token prompt + 16) |")
        else:
            lines.append(f"| {r['k']} | {r['v']} | {r.get('plan_gib', float('nan')):.2f} | | | | {r['error'][:200]} |")
    return {"rows": rows, "table": lines}


# -- driver --------------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="a,b,c,d,e")
    ap.add_argument("--trained", default="/tmp/trained-q8_0.gguf")
    ap.add_argument("--heldout", default="/tmp/trained-heldout.txt")
    ap.add_argument("--m9b", default="/tmp/m9b.gguf")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--ppl-ctx", type=int, default=2048)
    ap.add_argument("--ppl-chunks", type=int, default=16)
    ap.add_argument("--ret-lengths", default="4096,16384,65536")
    ap.add_argument("--ret-docs", type=int, default=5)
    ap.add_argument("--ret-seconds-per-config", type=float, default=25)
    ap.add_argument("--ret-sparse-min", type=int, default=8192)
    ap.add_argument("--ret-configs", default=RETRIEVAL_CONFIGS, help="K/V[+sparse],... (default: %(default)s)")
    ap.add_argument("--sparse-budget", type=float, default=0.25)
    ap.add_argument("--sparse-min", type=int, default=16384)
    ap.add_argument("--depth", type=int, default=131072)
    ap.add_argument("--n-gen", type=int, default=64)
    ap.add_argument("--prefill-lengths", default="65536,131072")
    ap.add_argument("--prefill-ub", type=int, default=512, help="part d: rows per prefill chunk (-ub)")
    ap.add_argument("--mem-ctx", type=int, default=262144)
    ap.add_argument("--cap-gib", type=float, default=16)
    ap.add_argument("--one", help=argparse.SUPPRESS)        # run one part in this process (the driver's child)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        fn = {"a": part_a, "b": part_b, "cd": part_cd, "e": part_e}[args.one]
        res = fn(args)
        Path(args.out).write_text(json.dumps(res, default=float))
        return 0
    parts = args.parts.split(",")
    groups = [g for g in ("a", "b", "cd", "e") if any(p in parts for p in g)]
    results, t_all = {}, time.perf_counter()
    for g in groups:
        out = f"/tmp/long_context_{g}_{os.getpid()}.json"
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "--one", g, "--out", out] + [a for a in (argv or sys.argv[1:])]
        rc = subprocess.run(cmd).returncode
        took = time.perf_counter() - t0
        if rc != 0 or not os.path.exists(out):
            print(f"\npart {g}: failed (exit {rc}) after {took:.0f} s", flush=True)
            results[g] = {"error": rc, "seconds": took}
            continue
        res = json.loads(Path(out).read_text())
        for key, val in (res.items() if g == "cd" else [(g, res)]):
            val["seconds_part"] = took
            results[key] = val
            print(f"\n### part {key} ({took:.0f} s)\n")
            print("\n".join(val["table"]), flush=True)
    print(f"\nall parts: {time.perf_counter() - t_all:.0f} s")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": argv or sys.argv[1:]}
        try:
            from llamacmp.lib._native import Native
            meta["gpu"] = Native().device_name()
        except Exception as e:          # the name is informative only
            meta["gpu"] = f"unknown ({e})"
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
