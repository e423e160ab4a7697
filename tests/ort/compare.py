"""Compares fusebox's outputs with onnxruntime's, pairwise: `compare.py EXPECTED GOT
[EXPECTED GOT ...]`. Each max abs error must be within 1e-3 of that expected output's range.
Prints the figures; exits 1 when any pair differs."""

import sys

import numpy as np

ok_all = True
args = sys.argv[1:]
for want_path, got_path in zip(args[0::2], args[1::2]):
    want = np.load(want_path).astype(np.float64)
    got = np.load(got_path).astype(np.float64)
    if want.shape != got.shape:
        print(f"{got_path}: shape mismatch: fusebox {got.shape} vs onnxruntime {want.shape}")
        ok_all = False
        continue
    rng = float(want.max() - want.min())
    err = float(np.abs(want - got).max())
    ok = err <= 1e-3 * max(rng, 1e-12)
    ok_all &= ok
    print(f"{got_path.rsplit('/', 1)[-1]}: max abs error {err:.3g}, output range {rng:.3g}, "
          f"relative {err / max(rng, 1e-12):.3g} -> {'ok' if ok else 'FAIL'} (limit 1e-3)")
sys.exit(0 if ok_all else 1)
