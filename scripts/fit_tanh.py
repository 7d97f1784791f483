"""Fits the rational tanh of the softcap (src/model/tanh_fit.hpp, read by the CPU and CUDA kernels):
tanh(u) ≈ u·P(u²)/Q(u²), P and Q of degree 4 in u², Q(0) = 1, on u in [0, 9] (tanh(9) rounds
to 1 in float32), by least squares on the linearised relative error, reweighted by 1/|Q|
until it settles (Loeb's iteration). Prints the coefficients and the relative error of a
float32 Horner evaluation. Run: python scripts/fit_tanh.py (numpy)."""
import numpy as np

LIMIT, DEGREE = 9.0, 4
u = np.linspace(1e-4, LIMIT, 20000)
t = np.tanh(u)
z = u * u
weights = np.ones_like(u)
for _ in range(40):
    columns = [u * z**k for k in range(DEGREE + 1)] + [-t * z**k for k in range(1, DEGREE + 1)]
    a = np.stack(columns, axis=1)
    scale = weights / t
    c, *_ = np.linalg.lstsq(a * scale[:, None], t * scale, rcond=None)
    p, q = c[:DEGREE + 1], np.concatenate([[1.0], c[DEGREE + 1:]])
    weights = 1 / np.abs(np.polyval(q[::-1], z))

f32 = np.float32
uf = u.astype(f32)
zf = uf * uf
num, den = f32(0), f32(0)
for k in range(DEGREE, -1, -1):
    num, den = num * zf + f32(p[k]), den * zf + f32(q[k])
err = np.abs((uf * num / den).astype(np.float64) - t) / t
print("P:", ", ".join(f"{x:.10e}" for x in p))
print("Q:", ", ".join(f"{x:.10e}" for x in q))
print(f"max relative error, float32 evaluation on (0, {LIMIT}]: {err.max():.3g}")
