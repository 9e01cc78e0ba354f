"""A numpy emulation of attention_mma.cu's attn_prefill_mma_kernel at the fragment level (ldmatrix, ldmatrix.trans and
mma.sync m16n8k16 lane layouts as the PTX ISA gives them), against plain causal attention: a check of the kernel's
index logic that needs no GPU (written before the kernel first ran; ~1 minute).

    python3 tools/emu_attn_mma.py    # prints the relative error per case: ~2e-4 (Q and P in f16)
"""
import numpy as np


def ldsm(smem, addr, trans=False):
    # addr[lane] = (row, col) in halves; returns r[4][32] pairs (2 halves) per lane
    out = np.zeros((4, 32, 2), np.float32)
    for i in range(4):
        M = np.array([smem[addr[8*i+j][0], addr[8*i+j][1]:addr[8*i+j][1]+8] for j in range(8)])  # 8x8
        for l in range(32):
            g, t = l // 4, l % 4
            out[i, l] = M[g, 2*t:2*t+2] if not trans else M[2*t:2*t+2, g]
    return out


def mma(d, a, b0, b1):
    # d [32][4], a [4][32][2], b0/b1 [32][2]
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for l in range(32):
        g, t = l // 4, l % 4
        A[g, 2*t:2*t+2] = a[0][l]; A[g+8, 2*t:2*t+2] = a[1][l]; A[g, 2*t+8:2*t+10] = a[2][l]; A[g+8, 2*t+8:2*t+10] = a[3][l]
        B[2*t:2*t+2, g] = b0[l]; B[2*t+8:2*t+10, g] = b1[l]
    D = A @ B
    for l in range(32):
        g, t = l // 4, l % 4
        d[l][0] += D[g, 2*t]; d[l][1] += D[g, 2*t+1]; d[l][2] += D[g+8, 2*t]; d[l][3] += D[g+8, 2*t+1]


def kernel(q, K, V, pos, Dh, G, scale):
    # one kv head; rows r = t*G + g; returns out [rows, Dh]
    total = q.shape[0]; BR = 64; BK = 64; DT = Dh // 8; KS = Dh // 16; NT = BK // 8
    out = np.zeros((total, Dh))
    for r0 in range(0, total, BR):
        Qs = np.zeros((BR, Dh)); 
        for r in range(BR):
            if r0 + r < total: Qs[r] = (q[r0 + r] * scale).astype(np.float16)
        last = min(r0 + BR, total) - 1; kmax = pos[last // G] + 1
        for w in range(4):
            qpos = [[(pos[(r0 + w*16 + l//4 + 8*h) // G] if r0 + w*16 + l//4 + 8*h < total else -1) for h in range(2)] for l in range(32)]
            o = np.zeros((DT, 32, 4)); m = np.full((32, 2), -1e30); lsum = np.zeros((32, 2))
            for k0 in range(0, kmax, BK):
                Ks = np.zeros((BK, Dh)); Vs = np.zeros((BK, Dh))
                for key in range(BK):
                    if k0 + key < kmax: Ks[key] = K[k0 + key]; Vs[key] = V[k0 + key]
                s = np.zeros((NT, 32, 4))
                for ks in range(KS):
                    a = ldsm(Qs, [(w*16 + (l & 15), ks*16 + (l >> 4)*8) for l in range(32)])
                    for np_ in range(NT // 2):
                        b = ldsm(Ks, [(np_*16 + (l & 7) + ((l >> 4) << 3), ks*16 + ((l >> 3) & 1)*8) for l in range(32)])
                        mma(s[2*np_], a, b[0], b[1]); mma(s[2*np_+1], a, b[2], b[3])
                p = np.zeros((NT//2, 4, 32, 2))
                for l in range(32):
                    t = l % 4; mx = [-1e30, -1e30]
                    for nt in range(NT):
                        for e in range(4):
                            key = k0 + nt*8 + 2*t + (e & 1)
                            if key > qpos[l][e >> 1]: s[nt, l, e] = -1e30
                # quad max
                mxl = np.full((32, 2), -1e30)
                for l in range(32):
                    for nt in range(NT):
                        for e in range(4): mxl[l, e >> 1] = max(mxl[l, e >> 1], s[nt, l, e])
                for l in range(32):
                    quad = [l ^ x for x in (0, 1, 2, 3)]
                    mx = mxl[quad].max(axis=0)
                    for h in range(2):
                        mnew = max(m[l, h], mx[h]); corr = np.exp(m[l, h] - mnew); m[l, h] = mnew; lsum[l, h] *= corr
                        o[:, l, 2*h:2*h+2] *= corr
                    for nt in range(NT):
                        pv = [0.0 if s[nt, l, e] <= -1e30 else np.exp(s[nt, l, e] - m[l, e >> 1]) for e in range(4)]
                        for e in range(4): lsum[l, e >> 1] += pv[e]
                        p[nt >> 1][(nt & 1)*2 + 0][l] = np.float16(pv[0:2]); p[nt >> 1][(nt & 1)*2 + 1][l] = np.float16(pv[2:4])
                for kk in range(BK // 16):
                    for dp in range(DT // 2):
                        b = ldsm(Vs, [(kk*16 + (l & 7) + ((l >> 3) & 1)*8, dp*16 + (l >> 4)*8) for l in range(32)], trans=True)
                        mma(o[2*dp], p[kk], b[0], b[1]); mma(o[2*dp+1], p[kk], b[2], b[3])
            for l in range(32):
                g, t = l // 4, l % 4
                for h in range(2):
                    rr = r0 + w*16 + g + 8*h
                    if rr >= total: continue
                    L = sum(lsum[l ^ x, h] for x in (0, 1, 2, 3))
                    for dt in range(DT): out[rr, dt*8 + 2*t: dt*8 + 2*t + 2] = o[dt, l, 2*h:2*h+2] / L
    return out


rng = np.random.default_rng(0)
for (Dh, G, Ltok, n_past) in ((64, 1, 70, 0), (64, 2, 40, 30), (128, 4, 20, 5)):
    ctx = n_past + Ltok
    K = rng.standard_normal((ctx, Dh)).astype(np.float16).astype(np.float64)
    V = rng.standard_normal((ctx, Dh)).astype(np.float16).astype(np.float64)
    qt = rng.standard_normal((Ltok, G, Dh))
    pos = np.arange(n_past, n_past + Ltok)
    q = qt.reshape(Ltok * G, Dh)
    scale = 1 / np.sqrt(Dh)
    got = kernel(q, K, V, pos, Dh, G, scale)
    ref = np.zeros_like(got)
    for r in range(Ltok * G):
        t = r // G; sc = K[:pos[t] + 1] @ q[r] * scale; p = np.exp(sc - sc.max()); ref[r] = p @ V[:pos[t] + 1] / p.sum()
    print(Dh, G, Ltok, n_past, np.linalg.norm(got - ref) / np.linalg.norm(ref))
