#!/usr/bin/env python3
"""tools/report.py end to end: plots and index.html of run folders.

1. A real short fashion_mnist run (2 epochs on 2000 images): the plots its
   metrics.jsonl has data for exist, are valid 800x450 PNGs, the others are
   skipped; index.html shows every plot, the run name and the test accuracy.
2. Two synthetic runs with the full step schema (GPU memory, NVML, step-time
   parts, tokens, MFU), a resume that repeats steps, nulls, an unknown kind and
   key, a truncated last line, one run unfinished: every plot, both runs in the
   table, repeated steps deduplicated (last record wins).
3. Bad input: a missing folder, no metrics.jsonl, a corrupt middle line, no step
   records, several runs without --out -> non-zero exit, a message naming the
   file (and line); --smooth out of range (0, negative, 1e30) -> exit 2.
Without the binary or the data for 1, 2 and 3 still run, then the test exits
77 (skipped): a partial run is not reported as a pass.

    python3 tests/integration/report_test.py --binary build/bin/fashion_mnist --report tools/report.py
"""
import argparse
import importlib.util
import json
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)


WIDTH, HEIGHT = 800, 450  # the documented size of every plot
ALL_PLOTS = ["loss.png", "accuracy.png", "lr.png", "throughput.png", "tokens.png", "memory.png",
             "step_time.png", "gpu.png"]


def check_png(path, width, height):
    """Signature, IHDR (size, CRC), every chunk's CRC, IEND last; then a real decode."""
    data = path.read_bytes()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG signature")
    pos, chunks = 8, []
    while pos < len(data):
        check(pos + 12 <= len(data), f"{path}: truncated chunk at byte {pos}")
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        ctype, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        check(zlib.crc32(ctype + body) == crc, f"{path}: bad CRC in chunk {ctype!r}")
        chunks.append((ctype, body))
        pos += 12 + length
    check(chunks[0][0] == b"IHDR" and len(chunks[0][1]) == 13, f"{path}: first chunk is not IHDR")
    w, h = struct.unpack(">II", chunks[0][1][:8])
    check((w, h) == (width, height), f"{path}: {w}x{h}, expected {width}x{height}")
    check(chunks[-1] == (b"IEND", b""), f"{path}: does not end with IEND")
    check(any(t == b"IDAT" for t, _ in chunks), f"{path}: no image data")
    pixels = matplotlib.image.imread(path)
    check(pixels.shape[:2] == (height, width), f"{path}: decoded shape {pixels.shape}")
    check(pixels[..., :3].std() > 0.01, f"{path}: a blank image")


def report(script, *args):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def expected_plots(metrics_path):
    """The plots a report must write given the keys with values in metrics.jsonl."""
    steps, epochs = {}, []
    for line in metrics_path.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "step":
            steps.update({k: v for k, v in r.items() if v is not None})
        elif r.get("kind") in ("train_epoch", "val"):
            epochs.append(r)
    has = steps.keys()
    want = {"loss.png"}
    if any(r.get("accuracy") is not None for r in epochs):
        want.add("accuracy.png")
    for key, plot in [("lr", "lr.png"), ("samples_per_second", "throughput.png"),
                      ("tokens_per_second", "tokens.png")]:
        if key in has:
            want.add(plot)
    if has & {"gpu_mem_allocated_mib", "gpu_mem_reserved_mib", "gpu_mem_peak_mib", "rss_mib"}:
        want.add("memory.png")
    if has & {"data_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms"}:
        want.add("step_time.png")
    if has & {"gpu_util", "gpu_power_w", "gpu_temp_c"}:
        want.add("gpu.png")
    return want


def check_index(out, plots, must_contain):
    page = (out / "index.html").read_text()
    check(page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>"), "index.html incomplete")
    check("<script" not in page and "http://" not in page and "https://" not in page, "not self-contained")
    for name in plots:
        check(f'src="{name}"' in page, f"index.html does not show {name}")
    for text in must_contain:
        check(text in page, f"index.html lacks {text!r}")
    return page


def test_real_run(script, binary, data_root, work):
    run = work / "fmnist"
    cmd = [binary, f"run.dir={run}", f"data.root={data_root}", "trainer.epochs=2", "data.train_subset=2000",
           "data.val_size=500", "data.test_subset=1000", "trainer.log_every=5", "trainer.progress=false",
           "trainer.threads=1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    check(done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}\n{done.stderr}")
    result = report(script, run)
    check(result.returncode == 0, f"report failed:\n{result.stdout}\n{result.stderr}")
    out = run / "report"
    want = expected_plots(run / "metrics.jsonl")
    # fashion_mnist always logs loss, lr, samples/s and, with validation, accuracy.
    check({"loss.png", "accuracy.png", "lr.png", "throughput.png"} <= want, want)
    written = {p.name for p in out.glob("*.png")}
    check(written == want, f"plots {sorted(written)}, expected {sorted(want)}")
    for name in sorted(want):
        check_png(out / name, WIDTH, HEIGHT)
        check(f"wrote {out / name}" in result.stdout, result.stdout)
    skipped = sorted(set(ALL_PLOTS) - want)
    if skipped:
        check("skipped" in result.stdout and all(s in result.stdout for s in skipped), result.stdout)
    summary = json.loads((run / "summary.json").read_text())
    check_index(out, want, ["fmnist", f"{summary['test_accuracy']:.4f}", "fashion_mnist"])
    print(f"real run OK: {sorted(want)}; skipped {skipped}")


def step_record(step, epoch, shift=0.0, **extra):
    r = {"kind": "step", "epoch": epoch, "step": step, "time": 0.5 * step, "loss": 2.0 / (1 + 0.05 * step) + shift,
         "lr": 0.1 * (1 - step / 200), "samples_per_second": 5000 + 10 * step, "tokens_per_second": 6.4e5 + step,
         "loss_scale": 65536.0, "skipped_steps": 0, "step_ms": 25.0, "data_ms": 2.0, "forward_ms": 8.0,
         "backward_ms": 11.0, "optimizer_ms": 3.0, "other_ms": 1.0, "mfu": 0.4,
         "gpu_mem_allocated_mib": 1000.0 + step, "gpu_mem_reserved_mib": 1500.0, "gpu_mem_peak_mib": 1200.0 + step,
         "gpu_util": 90.0, "gpu_mem_used_mib": 2000.0, "gpu_temp_c": 60.0 + step / 10, "gpu_power_w": 300.0,
         "cpu_percent": 100.0, "rss_mib": 900.0, "new_key_from_later_version": [1, 2]}
    r.update(extra)
    return r


def write_run(folder, records, summary=None, tail=""):
    folder.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in records) + tail
    (folder / "metrics.jsonl").write_text(text)
    (folder / "config.toml").write_text("[trainer]\nepochs = 2\nname = '<b>&</b>'\n")
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))


def test_synthetic(script, work):
    base, resumed = work / "synthetic" / "baseline", work / "synthetic" / "resumed"
    records = [step_record(s, 1 if s <= 50 else 2) for s in range(10, 101, 10)]
    records.insert(5, {"kind": "train_epoch", "epoch": 1, "loss": 1.1, "accuracy": 0.6, "seconds": 10.0,
                       "samples": 3200, "skipped_steps": 0})  # no "step": placed at step 50
    records.append({"kind": "train_epoch", "epoch": 2, "step": 100, "loss": 0.7, "accuracy": 0.75})
    records.insert(6, {"kind": "val", "epoch": 1, "loss": 1.0, "accuracy": 0.65, "step": 50})
    records.append({"kind": "val", "epoch": 2, "loss": 0.8, "accuracy": 0.72})
    summary = {"recipe": "char_gpt", "test_accuracy": 0.7123, "test_loss": 0.81, "epochs": 2, "steps": 100,
               "train_seconds": 50.0, "samples_per_second": 5400.0, "device": "cuda:0", "precision": "bf16-mixed",
               "parameters": 1234567, "stop_reason": "", "extra_number": 3.5, "note": "<script>x</script>"}
    write_run(base, records, summary)

    # Resumed: ran to step 60, resumed from the step-30 checkpoint; steps 40..60 repeat with new values.
    first = [step_record(s, 1, shift=1.0) for s in range(10, 61, 10)]
    first[2]["mfu"] = None  # not measured
    first[3]["gpu_util"] = None
    again = [step_record(s, 1 if s <= 50 else 2, shift=0.5) for s in range(40, 91, 10)]
    again[0]["loss"] = 0.123  # the value step 40 must keep
    records = first + [{"kind": "prune", "step": 40, "ratio": 0.5}] + again
    records.insert(5, {"kind": "val", "epoch": 1, "loss": 9.9, "accuracy": 0.1})  # replaced after the resume
    records.append({"kind": "val", "epoch": 1, "loss": 1.2, "accuracy": 0.55, "step": 50})
    write_run(resumed, records, None, tail='{"kind":"step","epoch":2,"step":100,"lo')

    spec = importlib.util.spec_from_file_location("ember_report", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    check((module.WIDTH_PX, module.HEIGHT_PX) == (WIDTH, HEIGHT), (module.WIDTH_PX, module.HEIGHT_PX))
    run = module.load_run(resumed)
    check([r["step"] for r in run.steps] == list(range(10, 91, 10)), [r["step"] for r in run.steps])
    by_step = {r["step"]: r for r in run.steps}
    check(by_step[40]["loss"] == 0.123, by_step[40])
    check(by_step[30]["loss"] == step_record(30, 1, shift=1.0)["loss"], by_step[30])
    check(by_step[60]["epoch"] == 2 and by_step[60]["loss"] == step_record(60, 2, shift=0.5)["loss"], by_step[60])
    check(by_step[30]["mfu"] is None and by_step[20]["mfu"] == 0.4, (by_step[30]["mfu"], by_step[20]["mfu"]))
    check([(r["epoch"], r["accuracy"]) for r in run.vals] == [(1, 0.55)], run.vals)
    check(run.replaced == 4 and run.summary is None, (run.replaced, run.summary))
    check(any("incomplete last line" in w and "metrics.jsonl:16" in w for w in run.warnings), run.warnings)
    base_run = module.load_run(base)
    at = module.epoch_step(base_run, base_run.train_epochs[0])
    check(at == 50.0, f"an epoch record without a step goes at step 50, not {at}")

    out = work / "synthetic" / "report"
    result = report(script, base, resumed, "--out", out, "--smooth", "3")
    check(result.returncode == 0, f"report failed:\n{result.stdout}\n{result.stderr}")
    check("incomplete last line" in result.stderr, result.stderr)
    check("skipped" not in result.stdout, result.stdout)
    for name in ALL_PLOTS:
        check_png(out / name, WIDTH, HEIGHT)
    page = check_index(out, ALL_PLOTS, [
        "<th>baseline</th>", "<th>resumed</th>", "0.7123", "bf16-mixed", "1,234,567", "extra_number",
        "unfinished (no summary.json)",
        "1,300",  # peak GPU memory of baseline: gpu_mem_peak_mib at step 100
        "40.0%",  # mean MFU, nulls ignored
        "44.0%",  # backward share: 11 of 25 ms
        "&lt;script&gt;x&lt;/script&gt;", "&lt;b&gt;&amp;&lt;/b&gt;",  # escaped summary and config text
    ])
    check("<script>" not in page, "index.html has an unescaped <script>")

    # Same folder name twice: told apart by parent folder, then by number.
    twins = [module.load_run(base), module.load_run(base)]
    module.unique_names(twins)
    check([r.name for r in twins] == ["synthetic/baseline #1", "synthetic/baseline #2"], [r.name for r in twins])

    # CPU run with host memory only: memory.png falls back to RSS; no GPU plots.
    cpu = work / "synthetic" / "cpu"
    write_run(cpu, [{"kind": "step", "epoch": 1, "step": s, "loss": 1.0 / s, "rss_mib": 500.0 + s,
                     "gpu_mem_peak_mib": None, "gpu_util": None} for s in (1, 2, 3)])
    result = report(script, cpu)
    check(result.returncode == 0, result.stderr)
    written = {p.name for p in (cpu / "report").glob("*.png")}
    check(written == {"loss.png", "memory.png"}, f"plots {sorted(written)}, expected loss.png and memory.png")
    check_png(cpu / "report" / "memory.png", WIDTH, HEIGHT)
    check_index(cpu / "report", ["loss.png", "memory.png"], ["host memory (RSS, MiB)", "503"])
    print("synthetic runs OK: all plots, both runs, dedup, escaping, RSS fallback")


def test_errors(script, work):
    folder = work / "errors"
    missing = folder / "does-not-exist"
    result = report(script, missing)
    check(result.returncode != 0 and str(missing) in result.stderr and "no such folder" in result.stderr,
          result.stderr)

    empty = folder / "empty"
    empty.mkdir(parents=True)
    result = report(script, empty)
    check(result.returncode != 0 and str(empty / "metrics.jsonl") in result.stderr, result.stderr)

    corrupt = folder / "corrupt"
    write_run(corrupt, [step_record(10, 1), step_record(20, 1), step_record(30, 1)])
    lines = (corrupt / "metrics.jsonl").read_text().splitlines()
    lines[1] = lines[1][:40] + lines[2]  # a crash mid-line, then the resumed run appended
    (corrupt / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    result = report(script, corrupt)
    check(result.returncode != 0, result.stdout)
    check(f"{corrupt / 'metrics.jsonl'}:2" in result.stderr, result.stderr)
    check(not (corrupt / "report").exists(), f"{corrupt / 'report'} written despite the error")
    result = report(script, corrupt, "--skip-bad-lines")
    check(result.returncode == 0 and "metrics.jsonl:2: corrupt line skipped" in result.stderr, result.stderr)

    no_steps = folder / "no_steps"
    write_run(no_steps, [{"kind": "val", "epoch": 1, "loss": 1.0}])
    result = report(script, no_steps)
    check(result.returncode != 0 and "no step records" in result.stderr, result.stderr)

    result = report(script, corrupt, no_steps)
    check(result.returncode != 0 and "--out" in result.stderr, result.stderr)

    # --smooth out of range: a usage error (exit 2) naming it, no report, no traceback.
    for n in ("0", "-3", str(10**30), "2.5", "nan"):
        result = report(script, corrupt, "--skip-bad-lines", "--smooth", n, "--out", folder / f"smooth{n}")
        check(result.returncode == 2 and "--smooth" in result.stderr and "Traceback" not in result.stderr,
              f"--smooth {n}: exit {result.returncode}: {result.stderr}")
        check(not (folder / f"smooth{n}").exists(), f"--smooth {n}: a report was written")
    print("error cases OK")


def main():
    here = Path(__file__).resolve()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", help="the fashion_mnist recipe executable (without it: exit 77, skipped)")
    parser.add_argument("--report", type=Path, default=here.parents[2] / "tools" / "report.py")
    parser.add_argument("--data-root", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--work", type=Path, help="scratch folder, emptied first (default: a temporary one)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="ember-report-test-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    skipped = None
    if not args.binary:
        skipped = "no --binary for the real run"
    elif not (Path(args.data_root) / "train-images-idx3-ubyte.gz").is_file():
        skipped = f"no Fashion-MNIST at {args.data_root} for the real run"
    else:
        test_real_run(args.report, args.binary, args.data_root, work)
    test_synthetic(args.report, work)
    test_errors(args.report, work)
    if args.work is None:
        shutil.rmtree(work)
    if skipped:
        print(f"SKIP: {skipped} (the synthetic and error cases passed)")
        sys.exit(77)
    print("report_test: OK")


if __name__ == "__main__":
    main()
