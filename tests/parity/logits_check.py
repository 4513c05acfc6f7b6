"""What the pretrained-model parity scripts share (gpt2_parity.py, vit_parity.py): the driver call and the
logits comparison against the issue's bound."""
import subprocess

REL = 1e-5  # the bound, relative to the largest logit


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
