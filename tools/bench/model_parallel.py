#!/usr/bin/env python3
"""Model parallelism: bytes per rank and pipeline idle share, side by side with one process.

Starts ember_bench_model_parallel once per setting, with as many ranks as the
setting needs (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them:
ddp.py's launch_ranks), reads rank 0's last line of JSON and prints the settings
side by side:

  one process              the whole GPT-2, the whole batch, one rank
  pipeline P gpipe|1f1b    dist::PipelineRunner over P stages (P ranks), M microbatches
  tensor T [+SP]           dist::Gpt2TensorParallel at degree T (T ranks), +SP: sequence parallelism

Per setting, the largest over its ranks of: the parameters each rank steps, the
optimizer state, what it holds between steps (resident) and the step's peak above
that (activations and transients), counted by LibTorch's CPU allocator, and the
step time (the median over the steps after the first), each as a ratio to one
process, and the last step's loss (equal up to rounding in every setting: they
train the same model). Per pipeline stage: the
bytes above resident (1F1B's as a ratio to GPipe's at the same P), the most live
microbatches against the plan's (M under GPipe, min(P - s, M) under 1F1B) and
the measured idle share against the plan's (P - 1)/(M + P - 1), which assumes
equal stages, and against 1 - M c_s / (sum c + (M - 1) max c) with c_s the
stage's FLOPs as the split made it (whole pieces: a light embedding, a heavy
head). What is measured and how: tools/bench/model_parallel.cpp.

Times: each rank runs --threads threads, so N ranks use N times the cores of one
process until the machine runs out; on a 2-core machine 2 ranks get twice one
process's cores and 4 ranks the same 2 cores, so a rank's compute slows while
another computes, and the idle share includes the messages' cost (Gloo over
loopback). Read the times and the idle shares as directions; the bytes are exact
(the same in every run).

    tools/ember bench model-parallel                               # 2, 4 stages; tensor 2, 4; Gloo, CPU
    tools/ember bench model-parallel --stages 2 --tensor 2 --layers 4 --embd 128
    python3 tools/bench/model_parallel.py --binary build/bin/ember_bench_model_parallel --microbatches 16

Arguments other than the ones below go to every rank (--layers, --embd, --heads,
--context, --vocab, --batch, --steps).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp import launch_ranks  # noqa: E402

LABEL = "model-parallel"


def parse_counts(text):
    """'2,4' -> [2, 4]; '' or 'none' -> [] (no such settings)."""
    if text.strip().lower() in ("", "none"):
        return []
    counts = [int(x) for x in text.split(",") if x.strip()]
    if any(n < 2 for n in counts) or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"'{text}': expected distinct counts >= 2, e.g. 2,4 (or none)")
    return counts


def parse_schedules(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in ("gpipe", "1f1b") for n in names):
        raise argparse.ArgumentTypeError(f"'{text}': expected gpipe, 1f1b or gpipe,1f1b")
    return names


def settings_of(a):
    """(ranks, the binary's setting arguments) per setting, one process first."""
    out = [(1, ["--mode", "single"])]
    for p in a.stages:
        for s in a.schedules:
            out.append((p, ["--mode", "pipeline", "--schedule", s, "--microbatches", str(a.microbatches)]))
    for t in a.tensor:
        out.append((t, ["--mode", "tensor", "--sequence-parallel", "0"]))
        if a.sequence_parallel:
            out.append((t, ["--mode", "tensor", "--sequence-parallel", "1"]))
    return out


def run_setting(a, ranks, args, rest):
    """One setting's ranks; returns rank 0's JSON (and its table, for --show-runs)."""
    t0 = time.monotonic()
    outs = launch_ranks([a.binary, "--threads", str(a.threads), *args, *rest], ranks, a.threads, a.timeout, LABEL)
    text = outs[0][0]
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError) as e:
        sys.exit(f"[bench {LABEL}] rank 0 of {' '.join(args)} printed no JSON last line ({e}):\n{text}")
    sys.stderr.write(f"[bench {LABEL}] {result['setting']}: {ranks} ranks, {time.monotonic() - t0:.1f} s\n")
    if a.show_runs:
        sys.stdout.write(text)
    return result


def mib(b):
    return f"{b / (1 << 20):.2f} MiB"


def largest(result, key):
    return max(row[key] for row in result["rows"])


def ratio(x, base):
    return x / base if base else float("nan")


def print_side_by_side(results):
    one = results[0]
    base = {k: largest(one, k) for k in ("parameters", "optimizer", "resident", "above", "step_s")}
    print(f"GPT-2 n_layer {one['layers']}, n_embd {one['embd']}, n_head {one['heads']}, context {one['context']}, "
          f"vocab {one['vocab']}, batch {one['batch']} (the same on every rank), AdamW, fp32, "
          f"{one['steps']} steps (bytes: the last; times: the median after the first); "
          f"Gloo, CPU, {one['threads']} thread(s) per rank, "
          f"{os.cpu_count()} cores in all")
    print("Per rank (the largest over the setting's ranks); above = the step's peak minus resident "
          "(activations and transients)")
    print(f"{'setting':<18} {'ranks':>5} {'parameters':>12} {'gradients':>12} {'optimizer':>12} {'resident':>12} "
          f"{'above':>12} {'step':>10} {'loss':>9} | ratios to one process: params optim resident above step")
    for r in results:
        v = {k: largest(r, k) for k in ("parameters", "gradients", "optimizer", "resident", "above", "step_s")}
        print(f"{r['setting']:<18} {r['ranks']:>5} {mib(v['parameters']):>12} {mib(v['gradients']):>12} "
              f"{mib(v['optimizer']):>12} {mib(v['resident']):>12} {mib(v['above']):>12} "
              f"{v['step_s'] * 1e3:>7.1f} ms {r['loss']:>9.5f} | "
              f"{ratio(v['parameters'], base['parameters']):.3f} {ratio(v['optimizer'], base['optimizer']):.3f} "
              f"{ratio(v['resident'], base['resident']):.3f} {ratio(v['above'], base['above']):.3f} "
              f"{ratio(v['step_s'], base['step_s']):.2f}")
    for r in results:
        for row in r["rows"]:
            if row["model_bytes"] > row["parameters"]:
                print(f"note: {r['setting']} rank {row['rank']}: the model still holds {mib(row['model_bytes'])} "
                      f"of parameters beyond its own {mib(row['parameters'])}")

    pipes = [r for r in results if r["mode"] == "pipeline"]
    if not pipes:
        return
    gpipe = {r["ranks"]: r for r in pipes if r["schedule"] == "gpipe"}
    print()
    print("Pipeline stages (one per rank): live = the most microbatches whose activations the stage kept; "
          "idle = 1 - compute / step of PipelineRunner::step;")
    print("(plan) = simulate_pipeline_plan: equal stages, free messages; [costs] = 1 - m c_s / (sum c + (m - 1) max c) "
          "with c_s the stage's share of the FLOPs as split")
    print(f"{'setting':<18} {'stage':>5} {'pieces':<16} {'FLOPs':>6} {'parameters':>12} {'above':>12} "
          f"{'vs GPipe':>8} {'live (plan)':>11} {'idle (plan) [costs]':>22} {'sent':>12}")
    for r in pipes:
        p, m = r["ranks"], r["microbatches"]
        plan = r["plan"]
        by_stage = {int(row["stage"]): row for row in r["rows"]}
        g = gpipe.get(p) if r["schedule"] != "gpipe" else None
        g_stage = {int(row["stage"]): row for row in g["rows"]} if g else {}
        for s in range(p):
            row = by_stage[s]
            vs = f"{ratio(row['above'], g_stage[s]['above']):.3f}" if s in g_stage else "-"
            print(f"{r['setting']:<18} {s:>5} {plan['stage_pieces'][s]:<16} {plan['cost_share'][s]:>6.3f} "
                  f"{mib(row['parameters']):>12} {mib(row['above']):>12} {vs:>8} "
                  f"{int(row['live']):>4} ({int(plan['live'][s]):>4}) "
                  f"{row['idle']:>6.3f} ({plan['idle'][s]:.3f}) [{plan['idle_costs'][s]:.3f}] "
                  f"{mib(row['bytes_sent']):>12}")
        print(f"{'':<18} (p - 1)/(m + p - 1) = {p - 1}/{m + p - 1} = {plan['idle_formula']:.3f}; "
              f"1F1B's plan keeps min(p - s, m)/m of GPipe's live microbatches on stage s")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", required=True, help="build/bin/ember_bench_model_parallel")
    p.add_argument("--stages", type=parse_counts, default=[2, 4],
                   help="pipeline stages (= ranks) to run, e.g. 2,4 (default), or none")
    p.add_argument("--schedules", type=parse_schedules, default=["gpipe", "1f1b"],
                   help="pipeline schedules: gpipe,1f1b (default)")
    p.add_argument("--microbatches", type=int, default=8, help="microbatches per pipeline step (default 8)")
    p.add_argument("--tensor", type=parse_counts, default=[2, 4],
                   help="tensor-parallel degrees (= ranks) to run, e.g. 2,4 (default), or none")
    p.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_false",
                   help="skip the tensor-parallel settings with sequence parallelism")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (OMP_NUM_THREADS; default 1)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds to wait for one setting's ranks (default 1800)")
    p.add_argument("--show-runs", action="store_true", help="also print each setting's own per-rank table")
    a, rest = p.parse_known_args()
    results = [run_setting(a, ranks, args, rest) for ranks, args in settings_of(a)]
    print_side_by_side(results)
    print(json.dumps({"bench": "model_parallel", "cores": os.cpu_count(), "settings": results}))


if __name__ == "__main__":
    main()
