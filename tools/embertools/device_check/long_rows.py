"""The long rows (call 3): the speedrun, the data rows (JPEG shards decoded on the CPU and with
nvJPEG), the benches at full size, the recipes' accuracies.
"""
import gzip
import json
import os
import re
import statistics
import time

from .benches import bench_row, speed_cmd, speed_detail, speed_numbers
from .cases import PRECISIONS
from .common import Check, ROOT, exit_text, first_failure, short
from .goals import (accuracy_detail, accuracy_over, amp_goals, augment_goals, decode_goals, goal, goal_numbers,
    goal_status, loader_goals, monitor_goals, recipe_row, speed_goals, speedrun_goals, step)
from .jpeg_set import CLASSES as JPEG_CLASSES, repeated_manifest, split_images


# ---- the long rows: benches, accuracies -----------------------------------------------

SPEEDRUN_ROW = "fashion_mnist speedrun_gpu.toml: 94% in under 5 s of training, 5 seeds (cuda)"


@step(SPEEDRUN_ROW)
def speedrun_gpu(c: Check):
    """Five seeds of about 10 s each when the goal is met: start-up, the resident dataset, 12 epochs
    of 469 replayed steps (< 5 s), the test pass."""
    if not c.data:
        c.report(SPEEDRUN_ROW, "skip", "no Fashion-MNIST")
        return
    with gzip.open(c.data / "train-images-idx3-ubyte.gz", "rb") as f:
        train_images = int.from_bytes(f.read(8)[4:], "big")
    t0 = time.monotonic()
    got = []
    for seed in range(5):
        rc, v, out = c.recipe("fashion_mnist", f"speedrun_gpu_{seed}.log",
                              ["--config", ROOT / "recipes" / "fashion_mnist" / "speedrun_gpu.toml",
                               f"data.root={c.data}", f"trainer.seed={seed}",
                               f"run.dir={c.runs_dir('speedrun-' + str(seed))}"])
        if rc != 0:
            c.report(SPEEDRUN_ROW, "FAIL", f"seed {seed}: exit {rc}: {first_failure(out)}",
                     seconds=time.monotonic() - t0)
            return
        got.append((v.get("test_accuracy", 0), v.get("train_seconds", 0)))
    accs, secs = [a for a, _ in got], [t for _, t in got]
    goals = speedrun_goals(accs, secs, train_images)
    text = (f"test accuracy mean {statistics.mean(accs):.4f}, training seconds mean {statistics.mean(secs):.2f}, "
            f"{train_images} training images")
    c.report(SPEEDRUN_ROW, goal_status(goals), "; ".join([g["text"] for g in goals] + [text]),
             numbers={"accuracy": accs, "train_seconds": secs, "train_images": train_images,
                      "goals": goal_numbers(goals)}, seconds=time.monotonic() - t0)


# ---- the data rows: the packed JPEG shards, decoded by CPU threads and by nvJPEG -----------

DECODE_ROW = "streamed JPEG decode into 224 batches: a CPU thread per core vs nvJPEG (cuda)"
LOADER_ROW = "loader feeding a ResNet step: image_folder from JPEG shards, CPU decode vs nvJPEG, bf16 (cuda)"
DATA_EPOCH = 1536  # samples an epoch of either row reads: the 48 packed training JPEGs 32 times over
# The loader row's run: imagenet.toml (RandomResizedCrop 224 from 0.08, flip, label smoothing, SGD, cosine)
# at 3 epochs of 12 steps. The model: models::CifarResNet width 32, one block a stage: ~2.4 G multiply-adds a
# forward per 224 image (stem 0.04, stages 0.93, 0.72, 0.70), 0.6x ResNet-50's 4.1 G; it keeps 224 x 224 through
# its first stage (ResNet-50's stem divides the side by 4), so it moves more memory per image. A step of the
# same order as ResNet-50's: the pace a real ImageNet run asks the loader for.
LOADER_ARGS = ("augment.size=[224,224]", "model.width=32", "model.blocks=1", "data.batch_size=128",
               "trainer.epochs=3", "sched.warmup_epochs=0.5", "trainer.precision=bf16-mixed",
               "trainer.channels_last=true")
DATA_SIDES = (("CPU decode", "cpu"), ("nvJPEG", "nvjpeg"))  # (label, key of the row's numbers)


def cores():
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def error_line(out, prefixes):
    """The program's own error message: its first line starting with one of `prefixes` ('error: ' for a
    recipe, 'ember_bench_data: ' for the bench), else first_failure()."""
    return next((short(l, 300) for l in out.splitlines() if l.startswith(prefixes)), None) or first_failure(out)


def data_bench_line(out):
    """The JSON line ember_bench_data prints: {"side", "images", "threads", "readers", "images_per_second":
    [one per epoch after the first], "dct_diff_mean", "dct_diff_max", "samples_skipped"}."""
    for line in reversed(out.splitlines()):
        if line.startswith("{") and '"side"' in line:
            return json.loads(line)
    raise ValueError("no JSON line in ember_bench_data's output")


def data_epoch_manifest(c: Check, per_epoch):
    """The packed training shards repeated into an epoch of >= per_epoch samples, in the work folder:
    (manifest, samples an epoch, JPEGs, times over)."""
    n = split_images(c.jpeg, "train")
    times = max(1, -(-per_epoch // n))
    manifest = c.work / "jpeg" / f"train_x{times}.json"
    return manifest, repeated_manifest(c.jpeg / "train.json", manifest, times), n, times


def nvjpeg_hint(c: Check):
    """Why nvJPEG may be missing here, when the pack says so."""
    if c.manifest and c.manifest.get("nvjpeg") is False:
        return (" (the pack carries no libnvjpeg.so.13: the venv had no nvidia-nvjpeg wheel when it was packed; "
                "tools/ember setup installs it)")
    return ""


def data_failures(c: Check, errors, skipped):
    """The detail of a data row that failed: each side's error, samples skipped (the JPEGs are valid)."""
    parts = [f"{label}: {errors[key]}" for label, key in DATA_SIDES if key in errors]
    parts += [f"{label}: {skipped[key]} samples skipped (every packed JPEG is valid)" for label, key in DATA_SIDES
              if skipped.get(key)]
    return "; ".join(parts) + (nvjpeg_hint(c) if "nvjpeg" in errors else "")


def data_row_start(c: Check, name, threads, per_epoch):
    """(start time, decoder threads, data_epoch_manifest(...)) of a data row, or None (reported as a skip)
    when the pack holds no JPEG shards."""
    if not c.jpeg:
        c.report(name, "skip", "no JPEG shards (tools/ember device-pack packs them)")
        return None
    return time.monotonic(), threads or cores(), data_epoch_manifest(c, per_epoch)


def decode_row(c: Check, name, device="cuda", threads=None, per_epoch=DATA_EPOCH, batch=128, size=224, epochs=3):
    """ember_bench_data on the packed JPEG shards, twice: `threads` decoder threads (default one per
    core) decoding on the CPU, then the same threads driving nvJPEG (--nvjpeg); each epoch is the
    shards repeated to >= per_epoch samples, decoded into RandomResizedCrop `size` + flip, batches of
    `batch` normalised on `device`; the median images/s of the epochs after the first. FAIL when a side
    fails (nvJPEG's first error line in the detail) or skips a sample; else decode_goals() decide."""
    start = data_row_start(c, name, threads, per_epoch)
    if start is None:
        return
    t0, threads, (manifest, images, n, times) = start
    got, errors, skipped = {}, {}, {}
    for label, key in DATA_SIDES:
        rc, out = c.run([c.exe("ember_bench_data"), "--shards", manifest, "--device", device, "--threads", threads,
                         "--batch", batch, "--size", size, "--epochs", epochs] + (["--nvjpeg"] if key == "nvjpeg"
                                                                                  else []), f"data_decode_{key}.log")
        if rc != 0:
            errors[key] = f"{exit_text(rc)}: {error_line(out, ('ember_bench_data: ',))}"
            continue
        try:
            j = data_bench_line(out)
            got[key] = {"images_per_second": statistics.median(j["images_per_second"]),
                        "epochs": j["images_per_second"], "threads": j["threads"], "images": j["images"]}
            skipped[key] = j["samples_skipped"]
        except (ValueError, KeyError, TypeError, statistics.StatisticsError) as e:
            errors[key] = f"output not read ({type(e).__name__}: {short(e, 100)})"
    text = "; ".join(f"{label} {got[key]['images_per_second']:.0f} images/s" for label, key in DATA_SIDES
                     if key in got)
    text = (f"{images} images an epoch ({n} JPEGs x {times}), batch {batch}, {threads} decoder thread"
            f"{'s' if threads != 1 else ''}, {device}"
            + (f": {text}" if text else ""))
    if errors or any(skipped.values()):
        c.report(name, "FAIL", data_failures(c, errors, skipped) + f"; {text}", numbers=got,
                 seconds=time.monotonic() - t0)
        return
    goals = decode_goals(got["cpu"]["images_per_second"], got["nvjpeg"]["images_per_second"])
    c.report(name, goal_status(goals), "; ".join([g["text"] for g in goals] + [text]),
             numbers=dict(got, goals=goal_numbers(goals)), seconds=time.monotonic() - t0)


def loader_row(c: Check, name, device="cuda", threads=None, per_epoch=DATA_EPOCH, args=LOADER_ARGS):
    """image_folder (recipes/image_folder/imagenet.toml, `args` over it) trained from the packed JPEG
    shards on `device` twice: decoded by `threads` CPU threads (default one per core), then with
    data.stream.nvjpeg=true; each epoch the shards repeated to >= per_epoch samples, the test on the
    packed val shards. Reports each run's samples/s, the monitor's data_share (the share of the step
    time spent waiting for the batch: does the GPU starve?) and test accuracy. FAIL when a run fails
    (its first error line) or skips a sample; else loader_goals() decide."""
    start = data_row_start(c, name, threads, per_epoch)
    if start is None:
        return
    t0, threads, (manifest, images, n, times) = start
    runs, errors, skipped = {}, {}, {}
    for label, key in DATA_SIDES:
        run = c.runs_dir(f"loader-{key}")
        rc, v, out = c.recipe("image_folder", f"data_loader_{key}.log",
                              ["--config", ROOT / "recipes" / "image_folder" / "imagenet.toml",
                               f"data.shards={manifest}", f"data.test_shards={c.jpeg / 'val.json'}",
                               f"data.num_classes={JPEG_CLASSES}", f"trainer.device={device}",
                               f"data.stream.decode_threads={threads}", *args,
                               *(["data.stream.nvjpeg=true"] if key == "nvjpeg" else []), f"run.dir={run}"])
        if rc != 0:
            errors[key] = f"{exit_text(rc)}: {error_line(out, ('error: ',))}"
            continue
        try:
            s = json.loads((run / "summary.json").read_text())
            monitor = s.get("monitor") or {}
            runs[key] = {"samples_per_second": s["samples_per_second"], "data_share": monitor.get("data_share"),
                           "step_ms": monitor.get("step_ms"), "test_accuracy": s["test_accuracy"],
                           "steps": s["steps"], "train_seconds": s["train_seconds"]}
            skipped[key] = s.get("shard_samples_skipped", 0)
        except (OSError, ValueError, KeyError, TypeError) as e:
            errors[key] = f"summary.json not read ({type(e).__name__}: {short(e, 100)})"

    def said(r):
        f = lambda k, fmt, scale=1: "?" if r[k] is None else fmt.format(scale * r[k])
        return (f"{f('samples_per_second', '{:.0f}')} samples/s, data wait {f('data_share', '{:.0f}%', 100)} of "
                f"the step time (step {f('step_ms', '{:.1f}')} ms), test accuracy {f('test_accuracy', '{:.3f}')}")

    text = (f"{images} samples an epoch ({n} JPEGs x {times}), {threads} decoder thread{'s' if threads != 1 else ''}, "
            f"{device}: "
            + "; ".join(f"{label}: {said(runs[key])}" for label, key in DATA_SIDES if key in runs))
    if errors or any(skipped.values()):
        c.report(name, "FAIL", data_failures(c, errors, skipped) + f"; {text}", numbers=runs,
                 seconds=time.monotonic() - t0)
        return
    goals = loader_goals({label: runs[key] for label, key in DATA_SIDES})
    c.report(name, goal_status(goals), "; ".join([g["text"] for g in goals] + [text]),
             numbers=dict(runs, goals=goal_numbers(goals)), seconds=time.monotonic() - t0)


@step(DECODE_ROW)
def decode_gpu(c: Check):
    """nvJPEG's first run on a GPU (docs/data.md: "On the GPU: nvJPEG"), against the CPU's decoder threads
    feeding the same GPU batches. Two processes of ~3 s start each; 3 epochs of 1536 images."""
    decode_row(c, DECODE_ROW)


@step(LOADER_ROW)
def loader_gpu(c: Check):
    """The streamed loader feeding a training step on the GPU, from CPU threads and from nvJPEG: two
    image_folder runs of 36 steps at batch 128 and a test pass."""
    loader_row(c, LOADER_ROW)


@step("augment bench: kernel vs copy bandwidth (cuda)")
def augment_bench(c: Check):
    js = c.work / "augment_gpu.json"
    bench_row(c, "augment bench: kernel vs copy bandwidth (cuda)",
              [c.exe("ember_bench_augment"), "--device", "cuda", "--json", js], "augment_bench.log",
              numbers=lambda _: json.loads(js.read_text()),
              detail=lambda n, _: f"copy {n['copy_gbs']:.0f} GB/s; " + "; ".join(
                  f"{r['pipeline']} {r['output']}: {r['achieved_gbs']:.0f} GB/s, "
                  f"{r['ember_img_s'] / r['libtorch_img_s']:.2f}x LibTorch ops" for r in n["rows"]),
              goals=lambda n, _: augment_goals(n))


@step("monitor overhead bench (cuda)")
def monitor_bench(c: Check):
    bench_row(c, "monitor overhead bench (cuda)",
              [c.exe("ember_bench_monitor"), "--device", "cuda", "--batch-size", "256", "--steps", "100", "--rounds",
               "5", "--precision", "bf16-mixed"], "monitor_bench.log",
              numbers=monitor_numbers,
              detail=lambda n, out: "; ".join(f"{k}: throughput cost {v['overhead']}, own time {v['own_time']}"
                                              for k, v in n.items()),
              goals=lambda n, _: monitor_goals(n))


def monitor_numbers(out):
    """{setting: {overhead, own_time}} of the 'default' and 'full' rows of the monitor bench's table."""
    rows = {}
    for line in out.splitlines():
        t = line.split()
        if t and t[0] in ("default", "full") and len(t) >= 6 and t[-1].endswith("%"):
            rows[t[0]] = {"overhead": t[-3], "own_time": t[-1]}
    return rows


@step("amp bench: GPT 12x768, block 1024, batch 16 (cuda)")
def amp_bench(c: Check):
    """Five modes (fp16-mixed with and without the scaler), 20 steps each side; fp32 without TF32 is
    the slow one (~0.25 s a step)."""
    js = c.work / "amp_gpu.json"

    def numbers(_):
        rows = json.loads(js.read_text())
        return {f"{r['precision']}{'' if r['scaler'] else ' no-scaler'}": {k: r.get(k) for k in (
            "ember_ms", "python_ms", "speedup_vs_fp32", "mfu", "tokens_per_second")} for r in rows}

    def detail(n, _):
        b = n.get("bf16-mixed", {})
        return (f"bf16-mixed {b.get('speedup_vs_fp32', 0):.2f}x fp32, MFU {100 * (b.get('mfu') or 0):.1f}%, "
                f"ember/python {b.get('ember_ms', 0) / max(b.get('python_ms') or 1, 1e-9):.3f}")

    bench_row(c, "amp bench: GPT 12x768, block 1024, batch 16 (cuda)",
              [c.python, ROOT / "tools" / "bench" / "amp_step.py", "--binary", c.exe("ember_bench_amp_step"),
               "--device", "cuda", "--models", "gpt", "--precisions", *PRECISIONS, "--gpt-layers", "12",
               "--gpt-embd", "768", "--gpt-heads", "12", "--gpt-block", "1024", "--batch", "16", "--reps", "1",
               "--steps", "15", "--warmup", "5", "--peak-tflops", os.environ.get("EMBER_PEAK_TFLOPS", "989"),
               "--json", js], "amp_bench.log", numbers=numbers, detail=detail, goals=lambda n, _: amp_goals(n))


def fashion_full(c: Check, precision, accs):
    v = recipe_row(c, f"fashion_mnist {precision}, default config (cuda)", "fashion_mnist",
                   [f"data.root={c.data}", "trainer.device=cuda", f"trainer.precision={precision}",
                    f"run.dir={c.runs_dir('full-' + precision)}"], f"fashion_full_{precision}.log",
                   want=accuracy_over(0.85, "after the default 8 epochs"), detail=accuracy_detail)
    if v is not None:
        accs[precision] = v["test_accuracy"]
    if len(accs) == len(PRECISIONS):
        spread = max(accs.values()) - min(accs.values())
        c.report("fashion_mnist accuracies agree across precisions (cuda)", "ok" if spread <= 0.005 else "FAIL",
                 f"spread {100 * spread:.2f} points (want <= 0.5): "
                 + ", ".join(f"{p} {a:.4f}" for p, a in accs.items()))


# 8 epochs of 469 eager steps (~1-2 ms each) and 8 test passes: ~15 s with the start-up.
_accs = {}
for _p in PRECISIONS:
    step(f"fashion_mnist {_p}, default config (cuda)",
         rows=[f"fashion_mnist {_p}, default config (cuda)"] +
         (["fashion_mnist accuracies agree across precisions (cuda)"] if _p == PRECISIONS[-1] else []))(
        lambda c, p=_p: fashion_full(c, p, _accs))


@step("prune bench: ResNet-20 30/50/70% bf16 (cuda)")
def prune_bench(c: Check):
    bench_row(c, "prune bench: ResNet-20 30/50/70% bf16 (cuda)",
              [c.exe("ember_bench_prune"), "--device", "cuda", "--channels", "3", "--size", "32", "--blocks", "3",
               "--batch", "256", "--precision", "bf16-mixed", "--round-to", "8", "--rounds", "5", "--steps", "20"],
              "prune_bench.log", numbers=prune_numbers,
              detail=lambda n, out: ", ".join(f"{r}: MACs {v['macs_x']}, train step {v['train_x']}, inference "
                                              f"{v['infer_x']}" for r, v in n.items() if r != "0.00"))



PRUNE_ROW_RE = re.compile(r"^(?P<label>\S.*?)\s+(?P<macs>[\d.]+)M\s+(?P<macs_x>[\d.]+x)\s+\d+\s+[\d.]+x\s+"
                          r"(?P<train_ms>[\d.]+)\s+(?P<train_x>[\d.]+x) \((?P<train_spread>[^)]*)\)\s+"
                          r"(?P<infer_ms>[\d.]+)\s+(?P<infer_x>[\d.]+x) \((?P<infer_spread>[^)]*)\)\s*$")


def prune_numbers(out):
    """{entry: {macs_x, train_x, infer_x, ...}} from the prune bench's table (speed-ups over unpruned, median
    over rounds with their spread). Entries: "0.00" (dense), "0.30" (ratio 0.30), "0.30 r8" (rounded to 8),
    "latency" (the latency target; "when_pruned": its speed-up as measured while pruning), "same MACs r8"."""
    rows = {}
    for line in out.splitlines():
        m = PRUNE_ROW_RE.match(line)
        if not m:
            continue
        label = m["label"]
        if label == "dense":
            key = "0.00"
        elif label.startswith("ratio "):
            key = label[len("ratio "):]
        elif label.startswith("latency"):
            key = "latency"
        else:
            key = label
        row = {k: m[k] for k in ("macs_x", "train_x", "infer_x", "train_spread", "infer_spread")}
        if key == "latency":
            w = re.search(r"latency ([\d.]+)x(?: r(\d+))? \(([\d.]+)x when pruned\)", label)
            if w:
                row.update(goal=w[1], round_to=w[2], when_pruned=w[3])
        rows[key] = row
    return rows


@step("prune latency target 1.5x and tensor-core rounding: ResNet-20 bf16 b256 (cuda)")
def prune_latency(c: Check):
    """Issue 33's GPU rows: the latency table built on the H200 (bf16, batch 256) and the 1.5x target met or not,
    measured side by side with the dense model and with the model pruned by ratio to the same MACs; and what
    channel counts at multiples of 8 (tensor cores) buy: ratios 0.3/0.5 at round_to 1 against 8. Three rounds
    (the speed-ups are medians over rounds with their [min, max]): call 2 has ~60 s for it."""
    name = "prune latency target 1.5x and tensor-core rounding: ResNet-20 bf16 b256 (cuda)"
    bench_row(c, name,
              [c.exe("ember_bench_prune"), "--device", "cuda", "--channels", "3", "--size", "32", "--blocks", "3",
               "--batch", "256", "--precision", "bf16-mixed", "--ratios", "0.3,0.5", "--round-to", "1",
               "--also-round-to", "8", "--latency", "1.5", "--latency-table", c.work / "latency.json",
               "--rounds", "3", "--steps", "20"],
              "prune_latency.log", numbers=prune_numbers,
              detail=lambda n, out: "; ".join(f"{k}: MACs {v['macs_x']}, inference {v['infer_x']} ({v['infer_spread']})"
                                              for k, v in n.items() if k != "0.00"),
              goals=lambda n, _: [goal("latency target 1.5x, inference measured side by side",
                                       float(n["latency"]["infer_x"].rstrip("x")), ">=", 1.5)])


@step("head-pruned CharGpt 12x768, a quarter of the heads, tokens/s (cuda)")
def heads_bench(c: Check):
    name = "head-pruned CharGpt 12x768, a quarter of the heads, tokens/s (cuda)"
    bench_row(c, name,
              [c.exe("ember_bench_heads"), "--device", "cuda", "--layers", "12", "--embd", "768", "--heads", "12",
               "--block", "256", "--batch", "32", "--eval-batch", "64", "--rounds", "3", "--steps", "10"],
              "heads_bench.log", detail=lambda n, out: short(" | ".join(
                  l.strip() for l in out.splitlines() if "speed-up" in l or "tokens/s" in l), 300))


@step("char_gpt gpu.toml, 150 steps (cuda)")
def char_gpt(c: Check):
    """150 steps of 65,536 tokens on an 85M-weight GPT in bf16 (~0.1 s each), an evaluation, a checkpoint
    and 500 sampled tokens."""
    recipe_row(c, "char_gpt gpu.toml, 150 steps (cuda)", "char_gpt",
               ["--config", ROOT / "recipes" / "char_gpt" / "gpu.toml", f"data.path={c.text}", "trainer.max_steps=150",
                f"run.dir={c.runs_dir('char_gpt')}"], "char_gpt.log",
               want=lambda v: ("tokens_per_second" in v, "no tokens_per_second in its result line"),
               detail=lambda v: f"{v.get('tokens_per_second', 0):.0f} tokens/s, MFU {v.get('mfu', 0):.3f}, "
                                f"val_bpb {v.get('val_bpb', 0):.3f}", needs="text")


SPEED_TABLE_ROW = ("speed bench: MLP/CNN/GPT steps, Ember eager + graphs vs Python eager, fused, compile, "
                   "Lightning (cuda)")


@step(SPEED_TABLE_ROW)
def speed_table(c: Check):
    """The GPU speed table (docs/training.md, "Measured"): 6 cases x 6 sides x 2 reps. Each ember side
    is a process (~3 s to start), each torch.compile a fresh compile (~20 s cold per case, ~5 s from
    the cache): more than a 200 s second call has, so it runs last, or in a call of its own."""
    js = c.work / "speed_gpu.json"
    bench_row(c, SPEED_TABLE_ROW, speed_cmd(c, js, "--reps", "2", "--steps", "100", "--warmup", "20"),
              "speed_bench.log", numbers=lambda _: speed_numbers(js), detail=speed_detail,
              goals=lambda n, _: speed_goals(n))


@step("cifar_resnet, generated data, bf16, 5 epochs (cuda)")
def cifar(c: Check):
    name = "cifar_resnet, generated data, bf16, 5 epochs (cuda)"
    data = c.work / "cifar"
    rc, out = c.run([c.python, ROOT / "tests" / "integration" / "make_cifar.py", data, "2000", "2000"], "cifar.log")
    if rc != 0:
        c.report(name, "FAIL", f"make_cifar.py: {first_failure(out)}")
        return
    recipe_row(c, name, "cifar_resnet", ["trainer.device=cuda", "trainer.precision=bf16-mixed", f"data.root={data}",
                                         "trainer.epochs=5", "augment.brightness=0.2", "augment.erase=0.25",
                                         f"run.dir={c.runs_dir('cifar')}"], "cifar.log",
               want=lambda v: ("test_accuracy" in v, "no test_accuracy in its result line"), detail=accuracy_detail,
               needs=None)


@step("prune_finetune 3 + 2 epochs (cuda)")
def prune_finetune(c: Check):
    keys = ("dense_test_accuracy", "test_accuracy", "train_step_speedup", "inference_speedup")
    recipe_row(c, "prune_finetune 3 + 2 epochs (cuda)", "prune_finetune",
               [f"data.root={c.data}", "trainer.device=cuda", "trainer.epochs=3", "finetune.epochs=2",
                "prune.round_to=8", f"run.dir={c.runs_dir('prune_finetune')}"], "prune_finetune.log",
               detail=lambda v: ", ".join(f"{k} {v[k]:.4g}" for k in keys if k in v))


@step("fashion_mnist augment.toml, with and without augmentation (cuda)",
      rows=["fashion_mnist augment.toml aug (cuda)", "fashion_mnist augment.toml noaug (cuda)"])
def fashion_augment(c: Check):
    for variant, extra in (("aug", []), ("noaug", ["augment.crop=none", "augment.hflip=0"])):
        recipe_row(c, f"fashion_mnist augment.toml {variant} (cuda)", "fashion_mnist",
                   ["--config", ROOT / "recipes" / "fashion_mnist" / "augment.toml", "trainer.device=cuda",
                    f"data.root={c.data}", *extra, f"run.dir={c.runs_dir('fashion-' + variant)}"],
                   f"fashion_{variant}.log", detail=accuracy_detail)


@step("DDP overlap bench, 2 ranks, Gloo (CPU cores)", gpu=False)
def ddp_bench(c: Check):
    bench_row(c, "DDP overlap bench, 2 ranks, Gloo (CPU cores)",
              [c.python, ROOT / "tools" / "bench" / "ddp.py", "--binary", c.exe("ember_bench_ddp"), "--rounds", "20"],
              "ddp_bench.log",
              detail=lambda n, out: short(" ".join(re.findall(
                  r'"(?:overlap_bucketed|overlap_per_param|local_backward_ms)": [-0-9.]+', out))))


# llm.c's GPT-2 124M reproduction (discussion #481): 10B tokens in 90 minutes on 8 A100s, about 231K
# tokens/s per GPU; 6 x 124M FLOPs a token (attention aside) makes that about 0.55 of an A100's 312 TFLOP/s.
LLMC_124M_TOKENS_PER_S_A100 = 10e9 / (90 * 60) / 8
GPT2_ROW = "gpt2 gpu.toml (llm.c's 124M), 10 steps of 524,288 tokens (cuda)"


@step(GPT2_ROW)
def gpt2_llmc(c: Check):
    """The gpt2 recipe's GPU config, llm.c's 124M reproduction (bf16, micro-batch 64 x 1024 tokens, 8
    accumulated): 10 optimizer steps on llm.c token files of random tokens written here (6M tokens), its
    tokens/s and MFU beside llm.c's published figure (an A100's; an H100 should go well past it)."""
    tokens = c.work / "gpt2_tokens"
    rc, out = c.run([c.python, "-c", (
        "import numpy as np, sys, pathlib\n"
        "d = pathlib.Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)\n"
        "for i in range(2):\n"
        "    t = np.random.default_rng(i).integers(0, 50257, 3 << 20, dtype=np.uint16)\n"
        "    h = np.zeros(256, np.int32); h[:3] = (20240520, 1, len(t))\n"
        "    (d / f'train-{i:06d}.bin').write_bytes(h.tobytes() + t.tobytes())\n"), tokens], "gpt2_tokens.log")
    if rc != 0:
        c.report(GPT2_ROW, "FAIL", f"writing the token files: {first_failure(out)}")
        return
    ref = LLMC_124M_TOKENS_PER_S_A100
    recipe_row(c, GPT2_ROW, "gpt2",
               ["--config", ROOT / "recipes" / "gpt2" / "gpu.toml",
                f"data.tokens={tokens}/train-{{000000..000001}}.bin", "data.val_tokens=", "trainer.max_steps=10",
                f"run.dir={c.runs_dir('gpt2')}"], "gpt2.log",
               want=lambda v: ("tokens_per_second" in v, "no tokens_per_second in its result line"),
               detail=lambda v: f"{v.get('tokens_per_second', 0):.0f} tokens/s, MFU {v.get('mfu', 0):.3f}; llm.c "
                                f"(discussion #481) about {ref:.0f} tokens/s per A100, MFU about 0.55",
               needs=None)


REAL_SPEED_ROW = "speed bench: ResNet-50 and GPT-2 124M steps, bf16, Ember vs Python eager (cuda)"


@step(REAL_SPEED_ROW)
def real_model_speed(c: Check):
    """The real models' training step at bf16 (docs/training.md, "Measured"): torchvision's ResNet-50 at
    batch 64 (224 px) and transformers' GPT-2 124M at 8 x 128 tokens against Ember's, eager, 1 rep."""
    js = c.work / "speed_real.json"
    bench_row(c, REAL_SPEED_ROW,
              speed_cmd(c, js, "--models", "resnet50", "gpt2", "--batches", "64", "--precision", "bf16-mixed",
                        "--sides", "ember", "python", "python-fused", "--reps", "1", "--steps", "20", "--warmup",
                        "5"),
              "speed_real.log", numbers=lambda _: speed_numbers(js), detail=speed_detail)
