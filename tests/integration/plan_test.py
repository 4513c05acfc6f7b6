"""The recipe tools end to end: `RECIPE --measure` (what tools/ember plan
plans from) on every image recipe, `--find-batch-size` and `--find-lr`.

- Parameters and training FLOPs of FashionNet equal the counts from its
  layer shapes, written out here (two widths).
- The training loop's peak memory predicted from two small batch sizes (the
  line through them) is within 15% of the peak measured at the recipe's own
  batch size, for fashion_mnist, cifar_resnet, image_folder (needs OpenCV)
  and prune_finetune; with the model and data held, too.
- tools/plan/plan.py plans from a real measurement (--json).
- data.batch_size past the training set is measured and planned at the
  training set's size, and says so.
- A host smaller than the measurement (plan.host_memory_gib): the probes shrink
  and extrapolate; a model, or training state, larger than it is a clear error.
- bs-find against a CPU memory budget: the size it reports fits and the
  next size it tried does not; lr-find writes a curve and prints optim.lr=.

Usage: plan_test.py --bin-dir DIR --data-root FASHION_MNIST --plan tools/plan/plan.py
                    --lr-plot tools/lr_plot.py --work DIR
"""
import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)


def run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise AssertionError(f"exit {p.returncode}: {' '.join(map(str, cmd))}")
    return p


def fashion_counts(w, hidden):
    """FashionNet's parameters and forward MACs per 28x28 sample, from its layers."""
    convs = [(1, w, 28), (w, w, 28), (w, 2 * w, 14), (2 * w, 2 * w, 14)]  # (in, out, output side)
    params = sum(i * o * 9 for i, o, _ in convs)            # 3x3, no bias
    params += sum(2 * o for _, o, _ in convs)               # batch-norm weight and bias
    params += (2 * w * 7 * 7) * hidden + hidden + hidden * 10 + 10
    macs = sum(s * s * o * i * 9 for i, o, s in convs) + (2 * w * 49) * hidden + hidden * 10
    return params, macs


def measure(binary, out, *overrides):
    run([binary, "--measure", out, "trainer.threads=1", "plan.precisions=fp32", "plan.timed_steps=3",
         *overrides])
    return json.loads(pathlib.Path(out).read_text())


def check_memory(m, name):
    v = m["verify"]
    predicted, measured, held = v["predicted_peak_bytes"], v["measured_peak_bytes"], v["resident_bytes"]
    err = abs(predicted - measured) / measured
    total_err = abs(predicted + held - (measured + held)) / (measured + held)
    print(f"{name}: batch {v['batch']}: predicted {predicted / 2**20:.2f} MiB, measured "
          f"{measured / 2**20:.2f} MiB ({100 * err:.1f}%); with model and data "
          f"{(measured + held) / 2**20:.1f} MiB ({100 * total_err:.1f}%)")
    check(measured > 0 and err <= 0.15, f"{name}: prediction off by {100 * err:.1f}% (> 15%): {v}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", type=pathlib.Path, required=True)
    ap.add_argument("--data-root", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--lr-plot", required=True)
    ap.add_argument("--work", type=pathlib.Path, required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    fashion = a.bin_dir / "fashion_mnist"
    subset = [f"data.root={a.data_root}", "data.train_subset=1024", "data.test_subset=256"]
    if not (pathlib.Path(a.data_root) / "train-images-idx3-ubyte.gz").exists() and \
            not (pathlib.Path(a.data_root) / "train-images-idx3-ubyte").exists():
        print(f"SKIP: no Fashion-MNIST in {a.data_root}")
        sys.exit(77)

    # FashionNet's counts, and memory at the default batch (128) from probes at 8 and 32.
    m = measure(fashion, a.work / "fashion.json", *subset, "plan.verify=true")
    params, macs = fashion_counts(16, 128)
    check(m["parameters"] == params, (m["parameters"], params))
    check(m["forward_macs_per_sample"] == macs, (m["forward_macs_per_sample"], macs))
    check(m["train_flops_per_sample"] == 6 * macs, (m["train_flops_per_sample"], 6 * macs))
    check(m["parameter_bytes"] == 4 * params and m["gradient_bytes"] == 4 * params, m)
    # SGD with momentum: one buffer per parameter.
    check(m["optimizer_state_bytes"] == 4 * params, (m["optimizer_state_bytes"], params))
    # 4 convolution weights, 4 x 2 batch-norm tensors, 2 x 2 linear ones; a forward graph of some dozens of nodes.
    check(m["parameter_tensors"] == 16 and 20 <= m["forward_graph_nodes"] <= 200,
          (m["parameter_tensors"], m["forward_graph_nodes"]))
    check(m["dataset"]["train_samples"] == 1024 and m["dataset"]["eval_samples"] == 256, m["dataset"])
    # 28x28 float images as the loader hands them (normalised on the CPU) and int64 labels.
    check(m["dataset"]["sample_bytes"] in (784 + 8, 784 * 4 + 8), m["dataset"])
    check(m["dataset"]["disk_bytes"] > 30e6, m["dataset"])  # the four gzip IDX files
    check(m["measured"]["samples_per_second"] > 0 and "measured" in m["measured"]["peak_source"], m["measured"])
    check_memory(m, "fashion_mnist")
    # What one step launches, counted (core::OpCounter): a few dozen operators forward and backward, one
    # fused SGD step; no graph.
    ops = m["step_ops"]
    check(m["cuda_graph"] is False and m["optimizer_fused"] is True and m["memory_includes_graph_pool"] is False, m)
    check(40 <= ops["eager"] <= 400 and ops["graph_outside"] is None and ops["graph_inside"] is None, ops)
    # The same config with trainer.cuda_graph=true, measured here through an emulated graph: the step and
    # its bookkeeping run inside the replays, two input copies (and a read every 8 steps) outside, and
    # the timed steps are replays only.
    m8 = measure(fashion, a.work / "fashion8.json", *subset, "model.width=8", "model.hidden=64",
                 "trainer.cuda_graph=true")
    params8, macs8 = fashion_counts(8, 64)
    check((m8["parameters"], m8["forward_macs_per_sample"]) == (params8, macs8),
          (m8["parameters"], m8["forward_macs_per_sample"], params8, macs8))
    g = m8["step_ops"]
    check(m8["cuda_graph"] is True and m8["memory_includes_graph_pool"] is False, m8)
    check(g["graph_outside"] is not None and g["graph_outside"] <= 3, g)
    check(g["graph_inside"] is not None and g["eager"] - 2 <= g["graph_inside"] <= g["eager"] + 40, g)
    check(m8["measured"]["graph_replays_only"] is True and m8["measured"]["timed_steps"] == 3, m8["measured"])

    # A batch larger than the training set: measured and planned at the batch the run uses (all 2000).
    small = [f"data.root={a.data_root}", "data.test_subset=256", "model.width=8", "model.hidden=64"]
    p = run([fashion, "--measure", a.work / "huge_batch.json", *small, "data.train_subset=2000",
             "data.batch_size=16777216", "trainer.threads=1", "plan.precisions=fp32", "plan.timed_steps=1"])
    sentence = "data.batch_size=16777216 is larger than the 2000 training samples: planned for batches of 2000"
    check(sentence in p.stderr, p.stderr)
    huge = json.loads((a.work / "huge_batch.json").read_text())
    check((huge["batch_size"], huge["config_batch_size"], huge["measured"]["batch"]) == (2000, 16777216, 2000),
          (huge["batch_size"], huge["config_batch_size"], huge["measured"]))
    text = run([sys.executable, a.plan, a.work / "huge_batch.json", "--gpu", "T4", "--precision", "fp32",
                "--runs-dir", ""]).stdout
    check(f"note: {sentence}" in text and re.search(r"^T4\s+16\s+fp32\s+yes\b", text, re.M)
          and "accumulate_grad_batches" not in text, text)

    # A host smaller than the measurement (plan.host_memory_gib): probes that do not fit are halved and the
    # line through the smaller ones extrapolated; the model alone, or its training state, not fitting is
    # a clear error (exit 1, no traceback, no file), never the allocator's raw one or the OOM killer.
    tight = measure(fashion, a.work / "tight.json", *subset, "plan.verify=true", "plan.host_memory_gib=0.0625")
    mem, full = tight["memory"]["fp32"], m["memory"]["fp32"]
    check(mem["probes_reduced_from"] == [8, 32] and max(p["batch"] for p in mem["probes"]) < 32, mem)
    check(abs(mem["per_sample_bytes"] - full["per_sample_bytes"]) <= 0.2 * full["per_sample_bytes"], (mem, full))
    check(tight["verify"].get("skipped") and 16 <= tight["measured"]["batch"] < 128,
          (tight["verify"], tight["measured"]))
    check(tight["host_memory_limit_bytes"] == 2**26, tight["host_memory_limit_bytes"])
    for name, overrides, words in (
            ("model", ["plan.host_memory_gib=0.001"], "model and data do not fit this host's memory"),
            ("state", ["model.hidden=4096", "plan.host_memory_gib=0.09"], "training state does not fit")):
        out = a.work / f"no_fit_{name}.json"
        p = subprocess.run([fashion, "--measure", out, *subset, "trainer.threads=1", "plan.precisions=fp32",
                            *overrides], capture_output=True, text=True)
        check(p.returncode == 1 and words in p.stderr and "plan.host_memory_gib" in p.stderr
              and "Exception raised from" not in p.stderr and not out.exists(),
              f"{name}: exit {p.returncode}: {p.stderr}")
        print(f"{name} too large for the host: {p.stderr.strip().splitlines()[-1][:160]}...")

    # The other image recipes at their own default batch sizes.
    cifar_data = a.work / "cifar"
    run([sys.executable, HERE / "make_cifar.py", cifar_data, 60, 60])
    check_memory(measure(a.bin_dir / "cifar_resnet", a.work / "cifar.json", f"data.root={cifar_data}",
                         "model.width=8", "plan.verify=true"), "cifar_resnet")
    check_memory(measure(a.bin_dir / "prune_finetune", a.work / "prune.json", *subset, "plan.verify=true"),
                 "prune_finetune")
    images = a.work / "images"
    run([sys.executable, HERE / "make_image_folder.py", images, 40, 10])
    p = subprocess.run([a.bin_dir / "image_folder", "--measure", a.work / "images.json", f"data.root={images}",
                        "data.size=[36,36]", "augment.size=[32,32]", "model.width=8", "data.batch_size=64",
                        "trainer.threads=1", "plan.precisions=fp32", "plan.timed_steps=3", "plan.verify=true"],
                       capture_output=True, text=True)
    if p.returncode != 0 and "built without OpenCV" in p.stderr:
        print("image_folder: skipped (Ember built without OpenCV)")
    else:
        check(p.returncode == 0, p.stderr)
        check_memory(json.loads((a.work / "images.json").read_text()), "image_folder")

    # The planner on the real measurement.
    plan = json.loads(run([sys.executable, a.plan, a.work / "fashion.json", "--json"]).stdout)
    check(isinstance(plan, dict) and plan, plan)
    text = run([sys.executable, a.plan, a.work / "fashion.json", "--price", "H100=2.5"]).stdout
    check("H100" in text and "T4" in text, text)
    print(text)

    # bs-find against 40 MiB of host memory.
    out = run([fashion, "--find-batch-size", a.work / "bs.json", *subset, "trainer.threads=1",
               "bs_find.budget_gib=0.0390625", "bs_find.steps=2"])
    bs = json.loads((a.work / "bs.json").read_text())
    largest = bs["largest"]
    check(re.search(rf"^data.batch_size={bs['recommended']}$", out.stdout, re.M), out.stdout)
    fit = {t["batch"]: t for t in bs["trials"]}
    check(fit[largest]["fits"] and fit[largest]["peak_bytes"] <= bs["budget_bytes"], bs)
    over = [t for t in bs["trials"] if t["batch"] > largest]
    check(largest == 1024 or (over and all(not t["fits"] for t in over)), bs)
    check(1 <= bs["recommended"] <= largest, bs)
    print(f"bs-find: largest {largest}, recommended {bs['recommended']} in {len(bs['trials'])} trials")

    # lr-find: a short sweep; the curve, the printed line, the plot.
    out = run([fashion, "--find-lr", a.work / "lr.json", *subset, "trainer.threads=1", "lr_find.steps=40",
               "lr_find.min_lr=1e-4", "lr_find.max_lr=10"])
    lr = json.loads((a.work / "lr.json").read_text())
    check(len(lr["lrs"]) == len(lr["losses"]) >= 10 and abs(lr["lrs"][0] - 1e-4) < 1e-12, lr)
    line = re.search(r"^optim.lr=(\S+)$", out.stdout, re.M)
    check(line and abs(float(line.group(1)) - lr["suggestion"]["lr"]) <= 5e-3 * lr["suggestion"]["lr"],  # 3 digits
          out.stdout)
    run([sys.executable, a.lr_plot, a.work / "lr.json", "--out", a.work / "lr.png"])
    check((a.work / "lr.png").stat().st_size > 10000, "no plot")
    # The rules are stated where users look (no build needed for --help).
    ember = HERE.parent.parent / "tools" / "ember"  # the driver, beside tools/plan/
    helps = {tool: run(["bash", ember, tool, "--help"]).stdout for tool in ("lr-find", "bs-find")}
    check("falls fastest against log10(lr)" in helps["lr-find"] and "valley" in helps["lr-find"], helps["lr-find"])
    check("bisection" in helps["bs-find"] and "bs_find.margin" in helps["bs-find"], helps["bs-find"])
    print("plan tools OK")


if __name__ == "__main__":
    main()
