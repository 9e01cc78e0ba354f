"""One-off (device plan s33a: next/w16direct's bits against main on the DP4A route): the logits of one prefill
forward of P random token ids (seed 0) on the given prefill route, saved as .npy. Run it with
LLAMACMP_LIB=/tmp/base.so and /tmp/new.so into two files, then `python3 -c "import numpy as n, sys; a, b =
n.load(sys.argv[1]), n.load(sys.argv[2]); print('bits equal' if n.array_equal(a, b) else f'differ: max |d|
{abs(a - b).max()}')" A.npy B.npy`.
    python3 logits_dump.py MODEL.gguf OUT.npy [--route mma] [-p 512]   (from the repository root, PYTHONPATH=.)"""
import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path.cwd() / "benchmarks"))
from bench_model import load  # noqa: E402

from llamacmp.backends.base import StepBatch  # noqa: E402
from llamacmp.backends.cuda import CudaBackend  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("out")
ap.add_argument("--route", choices=("dp4a", "mma"), default="mma")
ap.add_argument("-p", type=int, default=512)
args = ap.parse_args()
be = CudaBackend(0)
be.routes = replace(be.routes, matmul_prefill=args.route)
cfg, model = load(args.model, be)
ids = [int(i) for i in np.random.default_rng(0).integers(0, cfg.n_vocab, args.p)]
st = be.new_state(cfg, args.p + 8)
logits = np.asarray(be.to_host(model.forward(StepBatch.build([(st, ids)]))))
np.save(args.out, logits)
print(f"{args.out}: logits {logits.shape}, route {args.route}")
