"""Floating-point tolerances of the Python and shell tests, derived from the arithmetic (issue 41).

The CPU under CI differs from run to run (Intel or AMD, AVX-512 or not), and the torch wheel's BLAS and
oneDNN pick their kernels by vendor and instruction set: two computations that are not the same op
sequence can differ by a few ulps on one machine and by more on another. So every comparison of
floating results in these tests is one of three kinds, said at the call:

  1. Bitwise (==, torch.equal), when both sides are the same computation: the same ops in the same order
     on the same shapes, with the same thread count, in processes of the same machine and environment
     (so the same dispatch level). Say why it is the same computation.
  2. Within bound(...) of each other, relative to a stated magnitude:

         bound(eps, n, steps, k) = k * eps * n * steps

     eps: the precision's machine epsilon (EPS32 = 2^-23: one rounding moves a value by at most eps/2 of
     itself, so two roundings of the same value differ by at most eps of it); n: the longest reduction
     whose order or blocking differs between the two sides (a sum of n terms in another order differs
     by at most n * eps * sum|terms|: the worst case, not the typical sqrt(n)); steps: how many times
     such an error is made and carried along (optimizer steps: first-order, linear growth); k: a factor
     the call derives (AdamW's step m / (sqrt(v) + eps) is homogeneous of degree 0 in the gradient, so a
     relative error e of the gradient moves the step by at most 2 e of it: k = 2; SGD with momentum mu
     carries an error 1 / (1 - mu) times).
  3. Printed precision: a number written with 7 significant digits (metrics.jsonl, the CSV) is within
     PRINTED7 = 5e-7 of itself, relative.

Where float32's bound is too loose to catch a bug (long reductions, many steps), the comparison runs in
float64 instead (tests/dist/ddp_worker.cpp --dtype float64): the same bound is then 2^29 times smaller and
still far above what any machine's rounding gives. A bound is derived before it is run, and never raised
to make a run pass.

Standard library only at import: shell tests import it with the system python3 (no torch).
"""
import math

EPS64 = 2.0 ** -52  # float64 machine epsilon
EPS32 = 2.0 ** -23  # float32
EPS_BF16 = 2.0 ** -7  # bfloat16 (8 significant bits)
EPS16 = 2.0 ** -10  # float16
PRINTED7 = 5e-7  # half a unit in the 7th significant digit: "{:.7g}" of x is within 5e-7 |x| of x

_EPS = {"float64": EPS64, "double": EPS64, "float32": EPS32, "float": EPS32, "bfloat16": EPS_BF16,
        "bf16": EPS_BF16, "float16": EPS16, "half": EPS16}


def eps(dtype):
    """Machine epsilon of a dtype: a torch.dtype, or its name ("float32", "float64", "bfloat16", ...)."""
    name = str(dtype).replace("torch.", "")
    if name not in _EPS:
        raise ValueError(f"tolerance.eps: no epsilon for dtype {dtype!r} (known: {sorted(_EPS)})")
    return _EPS[name]


def bound(eps_, n=1, steps=1, k=1.0):
    """k x eps x n x steps: the relative bound of rule 2 (module docstring). `eps_` is a number (EPS32) or
    a dtype. Every argument is >= 1 but eps_ (a bound below one rounding is not a bound)."""
    e = eps_ if isinstance(eps_, float) else eps(eps_)
    if n < 1 or steps < 1 or k < 1:
        raise ValueError(f"tolerance.bound: n, steps and k are >= 1 (got n={n}, steps={steps}, k={k})")
    return k * e * n * steps


def adamw_step_ratio(steps, betas):
    """The largest |m_hat| / sqrt(v_hat) AdamW can take within `steps` steps, whatever the gradients: by
    Cauchy-Schwarz, sqrt(sum_i a_i^2 / b_i), a_i and b_i the bias-corrected weights of step i's gradient in
    m_hat and in v_hat (1 at the first step; 1.17 by step 21 with betas (0.9, 0.999))."""
    b1, b2 = betas
    worst = 0.0
    for t in range(1, steps + 1):
        s = sum(((1 - b1) * b1 ** (t - i) / (1 - b1 ** t)) ** 2 / ((1 - b2) * b2 ** (t - i) / (1 - b2 ** t))
                for i in range(1, t + 1))
        worst = max(worst, math.sqrt(s))
    return worst


def adamw_bound(eps_, n, steps, lr, betas, weight_decay=0.0, max_weight=0.0):
    """The elementwise bound (max |a - b|) of two AdamW runs from the same start that are different
    computations of the same mathematics: each step's gradient is known to n x eps relative (n the longest
    reduction whose order differs); AdamW's step lr m_hat / (sqrt(v_hat) + eps) is homogeneous of degree 0
    in the gradient, so it moves by at most 2 n eps of its size (k = 2), and its size is at most
    lr (max |m_hat| / sqrt(v_hat) + weight_decay max |w|) (adamw_step_ratio); the steps' errors add (first
    order: linear growth, no amplification). So 2 eps n steps lr (ratio + weight_decay max |w|): relative
    to the magnitude of the steps, not of the weights (a weight that starts at 0 has none)."""
    step = lr * (adamw_step_ratio(steps, betas) + weight_decay * max_weight)
    return bound(eps_, n=n, steps=steps, k=2) * step


def max_abs(a, b):
    """The worst tensor of two state dicts by max |a - b| (in float64), and its name."""
    if a.keys() != b.keys():
        raise AssertionError(f"different tensors: only in a {sorted(a.keys() - b.keys())}, "
                             f"only in b {sorted(b.keys() - a.keys())}")
    worst, where = 0.0, None
    for k in a:
        x, y = a[k].double(), b[k].double()
        if x.shape != y.shape:
            raise AssertionError(f"{k}: shape {list(x.shape)} vs {list(y.shape)}")
        d = (x - y).abs().max().item() if x.numel() else 0.0
        if d > worst or where is None:
            worst, where = d, k
    return worst, where


def relative_l2(a, b):
    """The worst tensor of two state dicts by ||a - b|| / ||b|| (L2, in float64), and its name.
    A tensor of b that is all zeros counts by ||a - b|| (relative to 1)."""
    if a.keys() != b.keys():
        raise AssertionError(f"different tensors: only in a {sorted(a.keys() - b.keys())}, "
                             f"only in b {sorted(b.keys() - a.keys())}")
    worst, where = 0.0, None
    for k in a:
        x, y = a[k].double(), b[k].double()
        if x.shape != y.shape:
            raise AssertionError(f"{k}: shape {list(x.shape)} vs {list(y.shape)}")
        scale = y.norm().item() or 1.0
        d = (x - y).norm().item() / scale
        if d > worst or where is None:
            worst, where = d, k
    return worst, where


def relative_max(a, b):
    """The worst tensor of two state dicts by max|a - b| / max|b| (in float64), and its name: elementwise
    differences against the tensor's largest magnitude."""
    if a.keys() != b.keys():
        raise AssertionError(f"different tensors: only in a {sorted(a.keys() - b.keys())}, "
                             f"only in b {sorted(b.keys() - a.keys())}")
    worst, where = 0.0, None
    for k in a:
        x, y = a[k].double(), b[k].double()
        if x.shape != y.shape:
            raise AssertionError(f"{k}: shape {list(x.shape)} vs {list(y.shape)}")
        if x.numel() == 0:
            continue
        scale = y.abs().max().item() or 1.0
        d = (x - y).abs().max().item() / scale
        if d > worst or where is None:
            worst, where = d, k
    return worst, where


def identical(a, b):
    """The names of the tensors of two state dicts that are not bitwise equal (same computation: rule 1)."""
    import torch

    if a.keys() != b.keys():
        return sorted(a.keys() ^ b.keys())
    return [k for k in a if not torch.equal(a[k], b[k])]


def forward_reduction_length(state, extra=0):
    """The summed length of the dot products one forward pass takes through every layer of a model, from
    its state dict: each weight tensor of two or more dimensions contributes its fan-in (elements per
    output row: a Linear's in_features, a convolution's C_in / groups x kh x kw), plus `extra` (the
    reductions that have no weight: pooling, attention, normalisation). It bounds the reductions along any
    path from the input to an output, for bound(EPS32, n=...) of two forward passes that are different
    computations."""
    n = sum(t.numel() // t.shape[0] for t in state.values() if t.is_floating_point() and t.dim() >= 2)
    return n + extra
