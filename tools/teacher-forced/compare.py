# compare.py REF.f32 TEST.f32 VOCAB IDS: top-1 agreement, mean KL(ref||test) over the full vocabulary and over
# ref's top-20 (a token missing from test's top-20 takes test's 20th logprob), teacher-forced positions 0..n-2
import sys, numpy as np
V = int(sys.argv[3]); ids = [int(x) for x in open(sys.argv[4]).read().split()]
def lsm(path):
    a = np.fromfile(path, dtype=np.float32).reshape(-1, V).astype(np.float64)
    a -= a.max(1, keepdims=True); return a - np.log(np.exp(a).sum(1, keepdims=True))
r, t = lsm(sys.argv[1]), lsm(sys.argv[2]); n = min(len(r), len(t)) - 1
r, t = r[:n], t[:n]
agree = (r.argmax(1) == t.argmax(1)).mean()
kl_full = (np.exp(r) * (r - t)).sum(1)
K = 20
kl20 = []
for i in range(n):
    rt = np.argsort(-r[i])[:K]; tt = np.argsort(-t[i])[:K]; floor = t[i][tt[-1]]
    tv = np.array([t[i][j] if j in set(tt) else floor for j in rt])
    kl20.append((np.exp(r[i][rt]) * (r[i][rt] - tv)).sum())
gap = np.sort(r, 1)[:, -1] - np.sort(r, 1)[:, -2]
print(f"positions {n}: top-1 agreement {agree*100:.2f}%  mean KL full {kl_full.mean():.5f}  "
      f"mean KL top-20 {np.mean(kl20):.5f}  max KL {kl_full.max():.4f}  ref gaps<0.05: {(gap<0.05).sum()}")
