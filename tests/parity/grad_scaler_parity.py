"""Parity: Ember's GradScaler (C++) vs torch.amp.GradScaler (Python).

Both run the same gradient sequences (finite, injected inf/NaN, real fp32
overflow of scaled gradients, several param groups and optimizers, gradient
accumulation, clipping after unscale_, runs long enough to grow the scale) and
must give the same scale trajectory, growth tracker and skip decisions exactly,
and the same final weights, bitwise: both sides are the same computation (the
same ATen ops in the same order on the same shapes, one thread, one machine),
so any difference is a difference in what the scalers did. SGD is
torch.optim.SGD (foreach=False: LibTorch's C++ SGD, op for op). Adam is
LibTorch's C++ Adam step written out in Python (LibTorchAdam below):
torch.optim.Adam differs from it in one op (exp_avg.lerp_ against LibTorch's
mul_ + add_) and in sqrt(bias_correction2) (** 0.5), which round differently,
and over 2100 steps such a difference has no bound tight enough to mean
anything (tests/tolerance.py).

    python grad_scaler_parity.py DRIVER_EXECUTABLE [WORK_DIR] [--device cuda] [--fused]

With --device cuda both sides keep weights, gradients and the scale on the
GPU (ATen's CUDA _amp_* kernels); Python's optimizers then take their
per-tensor path (foreach=False), the one LibTorch's C++ optimizers have. Exit
77 (a skip) when there is no CUDA device.

With --fused, Ember's FusedSGD (Nesterov, weight decay) and FusedAdamW stepped
by GradScaler::step_async (the skip decided inside the kernels, no host sync)
against torch.optim.SGD/AdamW(fused=True), which take the same path in torch's
GradScaler (grad_scale and found_inf handed to the kernels): every weight must
be bitwise equal, AdamW's too. torch runs as it is, its own first step
included, except in a scenario whose first step torch skips: there torch's
fused SGD would go on from uninitialised momentum buffers (torch.empty_like),
so that scenario gives torch zeroed buffers (Ember's are zeros, which a real
first step overwrites) and says so. At least one scenario must compare with
torch as it is.
"""
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

SHAPES = [(4, 3), (3,), (5,), (6,)]
TOTAL = sum(math.prod(s) for s in SHAPES)


class LibTorchAdam(torch.optim.Optimizer):
    """torch::optim::Adam's step (torch/csrc/api/src/optim/adam.cpp, weight decay 0, no amsgrad), op for op
    and with the same double scalars, so that it is the same computation as the driver's C++ Adam."""

    def __init__(self, params, lr, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                bias_correction1 = 1 - math.pow(beta1, state["step"])  # std::pow(double, int64)
                bias_correction2 = 1 - math.pow(beta2, state["step"])
                state["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"].sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-(group["lr"] / bias_correction1))


def make_sequence(seed, steps, micro, inject, overflow_rate):
    """Initial weights + steps x micro gradient blocks (float32), with inf/NaN and huge values.
    `inject`: a probability per step, or a list of the steps that get an inf/NaN."""
    rng = np.random.default_rng(seed)
    init = rng.standard_normal(TOTAL).astype(np.float32)
    mags = 10.0 ** rng.uniform(-4, 4, size=(steps, micro, TOTAL))
    grads = (rng.standard_normal((steps, micro, TOTAL)) * mags).astype(np.float32)
    for t in range(steps):
        if (t in inject) if isinstance(inject, list) else (rng.random() < inject):  # an inf/NaN in one element of one micro-batch
            m, i = rng.integers(micro), rng.integers(TOTAL)
            grads[t, m, i] = rng.choice([np.inf, -np.inf, np.nan])
        if rng.random() < overflow_rate:  # finite, but x scale overflows fp32 once the scale is large
            m, i = rng.integers(micro), rng.integers(TOTAL)
            grads[t, m, i] = np.float32(3e34)
    return init, grads


def run_torch(init, grads, init_scale, growth, backoff, interval, clip, device, fused=False, zero_buffers=False):
    steps, micro, _ = grads.shape
    flat = torch.from_numpy(init.copy()).to(device)
    params, offset = [], 0
    for s in SHAPES:
        n = math.prod(s)
        params.append(flat[offset:offset + n].reshape(s).clone().requires_grad_(True))
        offset += n
    groups_a = [{"params": [params[0], params[1]]}, {"params": [params[2]], "lr": 0.02}]
    if fused:  # the fused kernels' other paths too: Nesterov, weight decay, decoupled (AdamW)
        opt_a = torch.optim.SGD(groups_a, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4, fused=True)
        opt_b = torch.optim.AdamW([params[3]], lr=0.01, weight_decay=1e-2, fused=True)
        if zero_buffers:
            # Only where torch's own first step was skipped: torch's fused SGD makes its momentum
            # buffers with torch.empty_like on its first step, and when GradScaler skips that step
            # (found_inf) the next one reads uninitialised memory (NaN, or any value). Ember's FusedSGD
            # starts them at zero, which a real first step overwrites (buf = g): zeros here give torch
            # the trajectory it would have with initialised buffers.
            for p in params[:3]:
                opt_a.state[p]["momentum_buffer"] = torch.zeros_like(p)
    else:
        opt_a = torch.optim.SGD(groups_a, lr=0.05, momentum=0.9, foreach=False)
        opt_b = LibTorchAdam([params[3]], lr=0.01)
    scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_factor=growth, backoff_factor=backoff,
                                  growth_interval=interval)
    out = {"scale": [], "tracker": [], "stepped_a": [], "stepped_b": []}
    g_all = torch.from_numpy(grads).to(device)
    for t in range(steps):
        for m in range(micro):
            g, offset = [], 0
            for s in SHAPES:
                n = math.prod(s)
                g.append(g_all[t, m, offset:offset + n].reshape(s))
                offset += n
            loss = sum((p * gi).sum() for p, gi in zip(params, g))
            scaler.scale(loss).backward()
        scaler.unscale_(opt_a)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params[:3], clip)
        scaler.step(opt_a)
        scaler.step(opt_b)
        for name, opt in (("stepped_a", opt_a), ("stepped_b", opt_b)):
            found = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
            out[name].append(0 if found else 1)
        scaler.update()
        out["scale"].append(scaler.get_scale())
        out["tracker"].append(scaler._get_growth_tracker())
        opt_a.zero_grad(set_to_none=True)
        opt_b.zero_grad(set_to_none=True)
    out["weights"] = [float(x) for p in params for x in p.detach().cpu().reshape(-1).tolist()]
    return out


SCENARIOS = [
    # name, seed, steps, micro, inject, overflow, init_scale, growth, backoff, interval, clip
    ("defaults_long_growth", 1, 2100, 1, [3, 7, 12, 40], 0.0, 65536.0, 2.0, 0.5, 2000, 0.0),
    ("dynamic_accum_clip", 2, 400, 2, 0.08, 0.08, 1024.0, 4.0, 0.25, 3, 1.0),
    ("overflow_driven", 3, 300, 1, 0.0, 0.15, 2.0 ** 20, 2.0, 0.5, 5, 0.5),
    # A clip value that is not a power of two, so that rounding of the clip coefficient shows.
    ("clip_rounding", 4, 200, 3, 0.05, 0.05, 4096.0, 2.0, 0.5, 10, 0.7),
]


def main():
    args = sys.argv[1:]
    device = "cpu"
    fused = "--fused" in args
    if fused:
        args.remove("--fused")
    if "--device" in args:
        i = args.index("--device")
        device = args[i + 1]
        del args[i:i + 2]
    if device == "cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        sys.exit(77)
    driver = args[0]
    work = Path(args[1]) if len(args) > 1 else Path(tempfile.mkdtemp())
    work = work / (device + ("-fused" if fused else ""))
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    print(f"device: {device}, optimizers: {'fused (step_async)' if fused else 'per-tensor'}")
    failures = 0
    as_is = 0  # scenarios compared with torch unmodified (its own first-step path)
    for name, seed, steps, micro, inject, overflow, init_scale, growth, backoff, interval, clip in SCENARIOS:
        init, grads = make_sequence(seed, steps, micro, inject, overflow)
        seq = work / f"{name}.bin"
        np.concatenate([init, grads.reshape(-1)]).astype("<f4").tofile(seq)
        args = [driver, str(seq), str(steps), str(micro), repr(init_scale), repr(growth), repr(backoff),
                str(interval), repr(clip), device] + (["fused"] if fused else [])
        ember = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
        ref = run_torch(init, grads, init_scale, growth, backoff, interval, clip, device, fused)
        reference = "torch as it is"
        if fused and ref["stepped_a"][0] == 0:  # torch read uninitialised momentum: compare where it is defined
            ref = run_torch(init, grads, init_scale, growth, backoff, interval, clip, device, fused,
                            zero_buffers=True)
            reference = "torch with zeroed momentum buffers (its skipped first step leaves them uninitialised)"
        as_is += reference == "torch as it is"

        problems = []
        for key in ("scale", "tracker", "stepped_a", "stepped_b"):
            if ember[key] != ref[key]:
                first = next(i for i, (a, b) in enumerate(zip(ember[key], ref[key])) if a != b)
                problems.append(f"{key} differs first at step {first}: ember {ember[key][first]} torch {ref[key][first]}")
        # Bitwise: the same computation on both sides (module docstring); the driver prints each float32
        # weight as the shortest text that reads back as the same double, Python's json reads it back.
        n_sgd = TOTAL - math.prod(SHAPES[3])
        if ember["weights"][:n_sgd] != ref["weights"][:n_sgd]:
            problems.append("SGD weights are not bitwise equal")
        if ember["weights"][n_sgd:] != ref["weights"][n_sgd:]:
            problems.append("AdamW weights are not bitwise equal (the same fused kernel on both sides)" if fused
                            else "Adam weights are not bitwise equal (LibTorch's Adam step on both sides)")
        # The scenario must exercise what it claims (a test that cannot fail proves nothing).
        skips = ref["stepped_a"].count(0) + ref["stepped_b"].count(0)
        grows = sum(1 for a, b in zip(ref["scale"], ref["scale"][1:]) if b > a)
        if skips == 0 or grows == 0:
            problems.append(f"scenario too easy: {skips} skips, {grows} growths")
        only_b = sum(1 for a, b in zip(ref["stepped_a"], ref["stepped_b"]) if a != b)
        status = "OK" if not problems else "FAIL"
        print(f"{status} {name}: {steps} steps x {micro} micro-batches, {skips} skipped optimizer steps "
              f"({only_b} where only one optimizer skipped), {grows} growths, final scale {ref['scale'][-1]:g}; "
              f"against {reference}")
        for p in problems:
            print("   ", p)
        failures += bool(problems)
    if as_is == 0:
        print("FAIL: no scenario was compared with torch unmodified (every first step skipped)")
        failures += 1
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
