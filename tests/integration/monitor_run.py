"""A real recipe run's monitoring output, read back by its consumers' own readers.

Runs fashion_mnist on a subset with step records every 5 steps, weight and
gradient histograms every 10 and a 3-step profiler trace, then checks:
  - TensorBoard's EventAccumulator reads every scalar of metrics.jsonl (same
    tag mapping as monitor::TensorBoardScalars, same steps, values equal to
    the 7 significant digits metrics.jsonl keeps) and the histograms (one per parameter per histogram step);
  - metrics_steps.csv holds the same rows as metrics.jsonl's step records;
  - the step-time parts add up to step_ms, and MFU = flops x samples/s / peak;
  - trace.json is a Chrome trace with Ember's phase ranges and ATen ops.
Exit 77 (skipped) without the data or without TensorBoard support in the build.
"""
import argparse
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerance import EPS32, EPS64, PRINTED7, bound  # noqa: E402


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)


def tag_of(kind, name):
    if kind == "train_epoch":
        return "epoch/train_" + name
    if kind == "val":
        return "epoch/val_" + name
    if name.startswith("gpu_"):
        return "gpu/" + name[4:]
    if name.endswith("_ms"):
        return "time/" + name
    if name in ("cpu_percent", "rss_mib"):
        return "host/" + name
    return "train/" + name


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--data-root", required=True)
    p.add_argument("--work", type=Path, required=True)
    a = p.parse_args()
    if not (Path(a.data_root) / "train-images-idx3-ubyte.gz").is_file():
        print(f"SKIP: no Fashion-MNIST at {a.data_root}")
        sys.exit(77)
    run = a.work / "run"
    subprocess.run(["rm", "-rf", str(a.work)], check=True)
    cmd = [a.binary, f"run.dir={run}", f"data.root={a.data_root}", "trainer.epochs=2", "data.train_subset=2500",
           "data.val_size=500", "data.test_subset=500", "trainer.log_every=5", "trainer.progress=false", "trainer.device=cpu",
           "trainer.threads=1", "monitor.histogram_every=10", "trainer.profile_steps=3", "trainer.profile_wait=2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    check(done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    if "without TensorBoard support" in done.stderr:
        print("SKIP: this build has no TensorBoard support")
        sys.exit(77)

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    check(len(steps) == 2 * (2000 // 128 + 1) // 5, len(steps))  # 16 steps per epoch, a record every 5 steps
    summary = json.loads((run / "summary.json").read_text())
    mon = summary["monitor"]
    check(mon["flops_per_sample"] > 0 and mon["peak_flops"] > 0 and 0 < mon["mfu"] < 1, mon)
    # Where the CPU peak came from: the best timing on record for this CPU, with its date.
    check(mon["peak_flops_source"].startswith("measured: best fp32 matmul") and "20" in mon["peak_flops_source"],
          mon)
    # metrics.jsonl keeps 7 significant digits (tests/tolerance.py PRINTED7); summary.json whole doubles.
    names = ("data_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms")
    for r in steps:
        # The 5 printed parts and the printed total: each within PRINTED7 of its own magnitude.
        parts = sum(r[k] for k in names)
        magnitude = sum(abs(r[k]) for k in names) + abs(r["step_ms"])
        check(abs(parts - r["step_ms"]) <= PRINTED7 * magnitude + bound(EPS64, n=len(names)) * magnitude, r)
        # mfu and samples_per_second printed (PRINTED7 each), the rest whole doubles (3 roundings here).
        mfu = mon["flops_per_sample"] * r["samples_per_second"] / mon["peak_flops"]
        check(math.isclose(r["mfu"], mfu, rel_tol=2 * PRINTED7 + bound(EPS64, n=4)), (r["mfu"], mfu))
    # Five float64 quotients part / total summed (5 + 4 roundings of values <= 1).
    check(math.isclose(sum(mon[k + "_share"] for k in ("data", "forward", "backward", "optimizer", "other")), 1.0,
                       rel_tol=bound(EPS64, n=9)), mon)

    # CSV: the same step rows.
    with open(run / "metrics_steps.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    check(len(rows) == len(steps), (len(rows), len(steps)))
    for row, r in zip(rows, steps):
        # Bitwise: both files print the same double with the same "{:.7g}".
        check(int(row["step"]) == r["step"] and float(row["loss"]) == r["loss"], (row, r))
        check(row["gpu_util"] == "" and r["gpu_util"] is None,
              f"a CPU run has no gpu_util: {row['gpu_util']!r}, {r['gpu_util']!r}")

    # TensorBoard's own reader.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    files = list((run / "tensorboard").glob("events.out.tfevents.*"))
    check(len(files) == 1, files)
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    checked = 0
    for r in records:
        for name, value in r.items():
            if name in ("kind", "epoch", "step", "time") or value is None:
                continue
            events = {e.step: e.value for e in acc.Scalars(tag_of(r["kind"], name))}
            check(r["step"] in events, (r["kind"], name, r["step"]))
            # metrics.jsonl keeps 7 significant digits (PRINTED7), TensorBoard a float32 (EPS32 / 2).
            check(math.isclose(events[r["step"]], value, rel_tol=PRINTED7 + EPS32, abs_tol=0.0),
                  (name, events[r["step"]], value))
            checked += 1
    expected_tags = {tag_of(r["kind"], k) for r in records for k, v in r.items()
                     if k not in ("kind", "epoch", "step", "time") and v is not None}
    check(set(tags["scalars"]) == expected_tags, set(tags["scalars"]) ^ expected_tags)
    hist = tags["histograms"]
    params = [t[len("weights/"):] for t in hist if t.startswith("weights/")]
    check(params and all("gradients/" + n in hist for n in params), hist)
    for t in hist:
        hs = acc.Histograms(t)
        check([h.step for h in hs] == [10, 20, 30], (t, [h.step for h in hs]))
        check(all(h.histogram_value.num > 0 for h in hs), (t, [h.histogram_value.num for h in hs]))

    # The profiler's trace.
    trace = json.loads((run / "trace.json").read_text())["traceEvents"]
    names = [e.get("name") for e in trace if e.get("ph") == "X"]
    for phase in ("ember::data", "ember::forward", "ember::backward", "ember::optimizer"):
        check(names.count(phase) == 3, (phase, names.count(phase)))
    check(any(n and n.startswith("aten::conv") for n in names), "no convolution in the trace")
    print(f"monitor_run: OK ({len(steps)} step records, {checked} TensorBoard scalars checked, "
          f"{len(hist)} histogram tags, {len(trace)} trace events)")


if __name__ == "__main__":
    main()
