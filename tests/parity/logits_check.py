"""What the pretrained-model parity scripts share (gpt2_parity.py, vit_parity.py): the driver call and the
logits comparison against the issue's bound."""
import subprocess

# The bound, relative to the largest logit. Where the two sides are
# not one computation, they differ only in how each Linear rounds: PyTorch's
# nn.Linear / transformers' Conv1D add the bias inside one addmm, LibTorch's
# Linear may matmul and then add it, one more float32 rounding (2^-24 of the
# output) per projection, and BLAS may block the sums differently (a few
# 2^-24 more). Through at most 12 blocks of 4 projections each, with layer
# norms that do not amplify relative error, that is about 48 x a few x 6e-8,
# some 1e-6 of the largest logit at most: 1e-5 holds with room on any CPU,
# and the scripts print whether the logits came out bitwise (they do here).
REL = 1e-5


def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)


def run(driver, *args):
    """Runs tests/parity/pretrained_driver.cpp; its stdout (the load report)."""
    r = subprocess.run([driver, *map(str, args)], capture_output=True, text=True, timeout=900)
    check(r.returncode == 0, f"driver failed ({r.returncode}): {r.stderr[-3000:]}")
    return r.stdout


def close(got, want, what):
    """got within REL of want's largest |logit|; says whether they came out bitwise equal."""
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    check(diff <= REL * scale, f"{what}: logits differ by {diff:.3e}, over {REL} x the largest |logit| {scale:.3e}")
    return "bitwise equal" if diff == 0 else f"max difference {diff:.2e} = {diff / scale:.1e} of the largest"
