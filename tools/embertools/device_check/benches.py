"""The benches' rows, and the GPU findings' tools: memory eager vs graph, lr-find, the sharding plan
on the GPU, activation checkpointing, weak scaling, the speed goal.
"""
import json
import re
import time
from pathlib import Path

from .common import Check, ROOT, first_failure, short
from .goals import NOT_JUDGED, goal, goal_numbers, goal_status, speed_goals, step


# ---- benches -----------------------------------------------------------------------
# Rows of every call alike: PLAN gives their order.

def bench_row(c: Check, name, cmd, log, limit=None, numbers=lambda out: {}, detail=lambda n, out: "", goals=None):
    """Runs a bench as one row. Without `goals` it is ok when the bench exits 0; with them
    (goals(numbers, output) -> [goal(...)]) the goals decide (goal_status), each one in the detail
    with its number, and a bench whose numbers cannot be read is `not judged`."""
    t0 = time.monotonic()
    rc, out = c.run(cmd, log, limit)
    if rc != 0:
        c.report(name, "FAIL", f"exit {rc}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return None
    table = "\n".join(l for l in out.splitlines() if not l.startswith(("[bench", "rep ", "$ ")))
    status, judged = "ok", []
    try:  # the bench ran: a number it printed differently must not lose its table
        n = numbers(out)
        text = detail(n, out)
        if goals:
            judged = goals(n, out)
            status = goal_status(judged)
    except Exception as e:
        n, text = {}, f"(numbers not read: {type(e).__name__}: {short(e, 100)}; see the table)"
        if goals:
            status, text = NOT_JUDGED, "goals not judged " + text
    if judged:
        text = "; ".join([g["text"] for g in judged] + ([text] if text else []))
        n = dict(n, goals=goal_numbers(judged))
    c.report(name, status, text, numbers=n, seconds=time.monotonic() - t0, block=table[-3000:])
    return n


def speed_numbers(js):
    """{"cnn b128": {"ember": ms, "ember-graph": ms, "python": ms, ..., "errors": {side: why}}} from
    speed.py's --json; a side that did not run has None (and its reason under "errors")."""
    data = json.loads(js.read_text())
    rows = {}
    for r in data["rows"]:
        case = {side: v.get("median_ms") for side, v in r["sides"].items()}
        errors = {side: v["error"] for side, v in r["sides"].items() if "error" in v}
        rows[f"{r['model']} b{r['batch']}"] = dict(case, errors=errors) if errors else case
    return rows


def speed_detail(n, _=None):
    """Per case: Ember with CUDA graphs and eager against Python eager, and graphs against Python
    eager at its best (the faster of its default optimizer and fused=True: speed.py's like for like)."""
    parts = []
    for case, s in n.items():
        py, graph, eager = s.get("python"), s.get("ember-graph"), s.get("ember")
        best = min((v for v in (py, s.get("python-fused")) if v), default=None)
        x = [f"graphs {py / graph:.2f}x" if py and graph else "", f"eager {py / eager:.2f}x" if py and eager else ""]
        text = ", ".join(t for t in x if t)
        if text:
            text += " Python eager"
        if best and graph:
            text += f"{'; ' if text else ''}graphs {best / graph:.2f}x Python at its best (fused or not)"
        parts.append(f"{case}: {text or 'no ratio (see the table)'}")
    return "; ".join(parts)


def speed_cmd(c: Check, js, *args):
    return [c.python, ROOT / "tools" / "bench" / "speed.py", "--binary", c.exe("ember_bench_speed"), "--device",
            "cuda", "--json", js, *args]


# ---- the GPU findings' tools and the speed goal ------------------------------------

MEMORY_ROW = "memory eager vs graph (plan --measure, cuda)"


def find_field(j, key):
    """j[key], else the first j[x][key] one object down (where a writer nests it); None when absent."""
    if key in j:
        return j[key]
    return next((v[key] for v in j.values() if isinstance(v, dict) and key in v), None)


def measure_memory(j):
    """What the memory row reads from a --measure JSON made with plan.verify=true: the training loop's
    measured peak at the config's batch, whether the probe ran a real CUDA graph
    (memory_includes_graph_pool) and the ATen ops launched per step (step_ops)."""
    return {"batch": j["verify"]["batch"], "peak_bytes": j["verify"]["measured_peak_bytes"],
            "graph_pool": find_field(j, "memory_includes_graph_pool"), "step_ops": find_field(j, "step_ops")}


def memory_verdict(eager, graph):
    """(status, detail) of the memory row from measure_memory() of the eager and the graph run: ok when
    the graph run's peak is at least the eager one's (a graph run holds its private pool beside eager
    allocations); not judged when the graph run's probe ran no CUDA graph."""
    mib = 1 << 20
    e, g = eager["peak_bytes"], graph["peak_bytes"]
    ops = graph["step_ops"] or eager["step_ops"]
    pool = lambda m: "absent" if m["graph_pool"] is None else json.dumps(m["graph_pool"])
    text = (f"batch {graph['batch']} bf16-mixed: measured peak eager {e / mib:.1f} MiB, graph {g / mib:.1f} MiB "
            f"({g / max(e, 1):.2f}x; want graph >= eager); memory_includes_graph_pool eager {pool(eager)}, "
            f"graph {pool(graph)}; step_ops "
            + (", ".join(f"{k} {'n/a' if ops.get(k) is None else format(ops[k], 'g')}"
                         for k in ("eager", "graph_inside", "graph_outside", "data_loading") if k in ops)
               if isinstance(ops, dict) else "absent"))
    if graph["graph_pool"] is not True:
        return NOT_JUDGED, ("the graph run's JSON does not say memory_includes_graph_pool=true (its probe ran no "
                            "CUDA graph, or the binary predates the field): nothing to compare; " + text)
    return ("ok" if g >= e else "FAIL"), text


@step(MEMORY_ROW)
def memory_eager_vs_graph(c: Check):
    """Issue 28, finding 3: a graph run holds the graph's pool beside eager allocations, so its
    measured peak at the speed run's batch must not be below the eager run's (plan --measure and
    bs-find advise from these probes). Two --measure runs of ~10 s: the start-up, five task builds
    on the resident dataset (probes at 8 and 32, the check at 128, the timed steps)."""
    if not c.data:
        c.report(MEMORY_ROW, "skip", "no Fashion-MNIST (tools/ember device-pack packs it)")
        return
    t0 = time.monotonic()
    work = c.runs_dir("memory_graph")
    got = {}
    for graph in ("false", "true"):
        rc, _, out = c.recipe("fashion_mnist", f"memory_graph_{graph}.log",
                              ["--measure", work / f"graph_{graph}.json", "--config",
                               ROOT / "recipes" / "fashion_mnist" / "speedrun_gpu.toml", f"data.root={c.data}",
                               f"trainer.cuda_graph={graph}", "plan.precisions=bf16-mixed", "plan.verify=true"])
        if rc != 0:
            c.report(MEMORY_ROW, "FAIL", f"--measure with trainer.cuda_graph={graph}: exit {rc}: {first_failure(out)}",
                     seconds=time.monotonic() - t0)
            return
        try:
            got[graph] = measure_memory(json.loads((work / f"graph_{graph}.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            c.report(MEMORY_ROW, "FAIL", f"graph_{graph}.json (trainer.cuda_graph={graph}): {e!r}",
                     seconds=time.monotonic() - t0)
            return
    status, text = memory_verdict(got["false"], got["true"])
    c.report(MEMORY_ROW, status, text, numbers={"eager": got["false"], "graph": got["true"]},
             seconds=time.monotonic() - t0)


LR_FIND_ROW = "lr-find on speedrun_gpu.toml (cuda graphs config)"


def lr_suggestion(out):
    """The learning rate of lr-find's last `optim.lr=...` line, or None."""
    found = re.findall(r"^optim\.lr=(\S+)\s*$", out, re.M)
    return float(found[-1]) if found else None


SHARD_PLAN_ROW = "wave 3: plan vs bs-find, one rank of 8: DDP, ZeRO-3, ZeRO-3 + checkpointing, char_gpt bf16 (cuda)"
# (dist.sharding, activation checkpointing) pairs the row measures: DDP, ZeRO-3, ZeRO-3 + full; ZeRO-1
# and ZeRO-2 lie between DDP and ZeRO-3 in the planner's arithmetic (tests/tools check it there),
# each costs another bs-find process on the GPU (~4 s).
SHARD_PLAN_CASES = (("none", "none"), ("parameters", "none"), ("parameters", "full"))


def shard_plan_errors(plan, held_bytes, peaks, gpu_name=""):
    """The planner's per-GPU memory against one rank's measured peak, per SHARD_PLAN_CASES pair in
    `peaks` ({(sharding, checkpointing): bs-find's trial peak in bytes, on top of what the task holds}).
    planned = the configuration row's memory parts less the CUDA context; measured = the peak +
    `held_bytes` (parameters, buffers, resident data: what the task holds before training). The plan's
    row for the GPU named in `gpu_name` when it has one, else its first. Returns
    [{"case", "planned", "measured", "error"}]."""
    rows = plan["configurations"]["rows"]
    named = [r for r in rows if r["gpu"].split("-")[0].lower() in gpu_name.lower()] if gpu_name else []
    gpu = (named or rows)[0]["gpu"]
    out = []
    for (sharding, ac), peak in peaks.items():
        row = next(r for r in rows if r["gpu"] == gpu and r["sharding"] == sharding
                   and r["activation_checkpoint"] == ac)
        parts = row["memory_parts"]
        planned = sum(parts.values()) - parts.get("context", 0)
        measured = peak + held_bytes
        out.append({"case": f"{sharding}/{ac}", "planned": planned, "measured": measured,
                    "error": (planned - measured) / measured})
    return out


@step(SHARD_PLAN_ROW)
def shard_plan_gpu(c: Check):
    """The planner's memory per GPU for a run on 8 ranks (DDP, ZeRO-3, and ZeRO-3 with full activation
    checkpointing: SHARD_PLAN_CASES), planned from a CPU measurement as a user would, against bs-find's measured
    peak of one rank of 8 on this GPU (bs_find.world_size=8: one process, collectives that send nothing).
    Goal: each within 25%. The CPU measurement probes with plan.steps=2, not 3: the same peaks (compared
    on the development machine, 2026-12-06), a quarter less of its CPU time (69 CPU-seconds there)."""
    if not c.text:
        c.report(SHARD_PLAN_ROW, "skip", "no text corpus for char_gpt (tools/ember device-pack packs one)")
        return
    t0 = time.monotonic()
    work = c.runs_dir("shard_plan")
    common = [f"data.path={c.text}", "model.n_layer=6", "model.n_embd=256", "model.n_head=8", "data.block_size=128",
              "trainer.precision=bf16-mixed"]
    batch = 16
    rc, _, out = c.recipe("char_gpt", "shard_plan_measure.log",
                          ["--measure", work / "cpu.json", "trainer.device=cpu", f"data.batch_size={batch}",
                           "plan.precisions=bf16-mixed", "plan.timed_steps=1", "plan.steps=2", *common])
    if rc != 0:
        c.report(SHARD_PLAN_ROW, "FAIL", f"--measure exit {rc}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return
    rc, out = c.run([c.python, ROOT / "tools" / "plan" / "plan.py", work / "cpu.json", "--json", "--world-size", "8",
                     "--sharding", "all", "--activation-checkpoint", "all"], "shard_plan_json.log")
    peaks = {}
    for sharding, ac in SHARD_PLAN_CASES:
        rc_bs, _, out_bs = c.recipe("char_gpt", f"shard_plan_{sharding}_{ac}.log",
                                    ["--find-batch-size", work / f"{sharding}_{ac}.json", "trainer.device=cuda",
                                     "bs_find.world_size=8", f"dist.sharding={sharding}",
                                     f"model.activation_checkpoint_every={1 if ac == 'full' else 0}",
                                     f"bs_find.start={batch}", f"bs_find.max_batch={batch}", *common])
        if rc_bs != 0:
            c.report(SHARD_PLAN_ROW, "FAIL", f"bs-find {sharding}/{ac} exit {rc_bs}: {first_failure(out_bs)}",
                     seconds=time.monotonic() - t0)
            return
        peaks[(sharding, ac)] = json.loads((work / f"{sharding}_{ac}.json").read_text())["trials"][0]["peak_bytes"]
    try:
        m = json.loads((work / "cpu.json").read_text())
        held = m["parameter_bytes"] + m["buffer_bytes"] + m["dataset"]["resident_bytes"]
        errors = shard_plan_errors(json.loads(out[out.index("{"):]), held, peaks, str(c.info.get("gpu_name", "")))
    except (ValueError, KeyError, StopIteration, TypeError) as e:
        c.report(SHARD_PLAN_ROW, "FAIL", f"plan.py: {e!r}: {first_failure(out)}", seconds=time.monotonic() - t0)
        return
    goals = [goal(e["case"], 100 * abs(e["error"]), "<=", 25, "% off", "%", fmt="{:.0f}") for e in errors]
    c.report(SHARD_PLAN_ROW, goal_status(goals),
             "; ".join(f"{e['case']} planned {e['planned'] / 2**20:.0f} MiB, measured {e['measured'] / 2**20:.0f} MiB "
                       f"({100 * e['error']:+.0f}%)" for e in errors),
             numbers={"cases": errors, "goals": goal_numbers(goals)}, seconds=time.monotonic() - t0)


AC_ROW = "wave 3: activation checkpointing bench, memory and step time, CharGpt and ResNet-20 (cuda)"


@step(AC_ROW)
def activation_checkpoint_gpu(c: Check):
    """tools/bench/activation_checkpoint.cpp on the GPU: the caching allocator's peak and the step time of
    none / full / full/2 / light, as ratios to none (the goal: full >= 40% less activation memory for
    <= 25% more time; light >= 20% for <= 8%). The row reports the bench's table lines; it fails only when
    the bench fails (the goal is judged from the numbers, in the note)."""
    t0 = time.monotonic()
    rc, out = c.run([c.exe("ember_bench_activation_checkpoint"), "--device", "cuda", "--reps", "5"],
                    "activation_checkpoint_gpu.log")
    rows = [l.strip() for l in out.splitlines() if re.match(r"\s*(none|full|full/2|light)\b", l)]
    ok = rc == 0 and bool(rows)
    c.report(AC_ROW, "ok" if ok else "FAIL", short(" | ".join(rows), 600) if ok else f"exit {rc}: {first_failure(out)}",
             seconds=time.monotonic() - t0)


SCALING_ROW = "weak scaling bench: fashion_mnist samples/s per rank, NCCL (cuda)"


def scaling_numbers(js):
    """{ranks (a string): {"per_rank", "min", "max", "ratio", "total"}} from tools/bench/scaling.py's --json:
    the median samples/s per rank over the repeats, their spread, its ratio to the smallest rank count's
    median (1 rank's when it ran) and the total (median x ranks)."""
    data = json.loads(Path(js).read_text())
    return {str(r["ranks"]): {"per_rank": r["median"], "min": r["min"], "max": r["max"], "ratio": r["ratio"],
                              "total": r["total"]} for r in data["rows"]}


def scaling_detail(n, _=None):
    """'1 rank: 41234 samples/s per rank [40100..41800] (1.00x, total 41234); 2 ranks: ... (0.97x, total
    80012)', the ratio to the smallest rank count; with one rank count only, no ratio, and that it measured
    no scaling."""
    parts = []
    for ranks, v in sorted(n.items(), key=lambda kv: int(kv[0])):
        text = f"{ranks} rank{'s' if ranks != '1' else ''}: {v['per_rank']:.0f} samples/s per rank " \
               f"[{v['min']:.0f}..{v['max']:.0f}]"
        if len(n) > 1:
            text += f" ({v['ratio']:.2f}x, total {v['total']:.0f})"
        parts.append(text)
    if list(n) == ["1"]:
        parts.append("one GPU: 1 rank only, which builds no process group (NCCL unused); scaling needs several GPUs")
    return "; ".join(parts)


@step(SCALING_ROW)
def scaling_gpu(c: Check):
    """tools/bench/scaling.py on the GPU: fashion_mnist at batch 512 per rank, 80 steps timed after 20, 3
    repeats, at 1 rank and at 2, 4, 8 ranks as far as the machine has GPUs (one per rank, NCCL). With one
    GPU the row is the 1-rank baseline (~5 s per run: CUDA's start and the data dominate; 8 GPUs would
    take about 4x its estimate). No goal: it reports the numbers; it fails only when the bench does."""
    if not c.data:
        c.report(SCALING_ROW, "skip", "no Fashion-MNIST (tools/ember device-pack packs it)")
        return
    gpus = int(c.info.get("gpus") or 1)
    counts = ",".join(str(n) for n in (1, 2, 4, 8) if n <= gpus)
    js = c.work / "scaling_gpu.json"
    bench_row(c, SCALING_ROW,
              [c.python, ROOT / "tools" / "bench" / "scaling.py", "--bin-dir", c.exe("fashion_mnist").parent,
               "--device", "cuda", "--backend", "nccl", "--nproc", counts, "--batch", "512", "--steps", "80",
               "--warmup", "20", "--repeats", "3", "--data", c.data, "--work", c.work / "scaling", "--json", js],
              "scaling_gpu.log", numbers=lambda _: scaling_numbers(js), detail=scaling_detail)


@step(LR_FIND_ROW)
def lr_find(c: Check):
    """Issue 28, finding 2: lr-find on a config with trainer.cuda_graph=true, as `tools/ember lr-find
    fashion_mnist --config recipes/fashion_mnist/speedrun_gpu.toml` runs it. ~8 s: the start-up, the
    resident dataset, 40 small steps (eager warm-up, a capture, replays)."""
    if not c.data:
        c.report(LR_FIND_ROW, "skip", "no Fashion-MNIST (tools/ember device-pack packs it)")
        return
    t0 = time.monotonic()
    js = c.runs_dir("lr_find") / "lr_find.json"
    rc, _, out = c.recipe("fashion_mnist", "lr_find.log",
                          ["--find-lr", js, "--config", ROOT / "recipes" / "fashion_mnist" / "speedrun_gpu.toml",
                           f"data.root={c.data}", "lr_find.steps=40"])
    lr = lr_suggestion(out)
    if rc != 0 or lr is None:
        c.report(LR_FIND_ROW, "FAIL", f"exit {rc}" + ("" if rc else ", no optim.lr= line") + f": {first_failure(out)}",
                 seconds=time.monotonic() - t0)
        return
    try:
        j = json.loads(js.read_text())
        curve = f"; {len(j['lrs'])} steps recorded ({j['stop_reason']})"
    except (OSError, ValueError, KeyError) as e:
        curve = f"; lr_find.json not read: {e!r}"
    c.report(LR_FIND_ROW, "ok", f"optim.lr={lr:.3g}{curve}", numbers={"lr": lr}, seconds=time.monotonic() - t0)


SPEED_GOAL_ROW = "speed goal: CNN b128, CUDA graphs vs Python eager and compile (cuda)"


@step(SPEED_GOAL_ROW)
def speed_goal(c: Check):
    """The GPU speed goal (tools/README.md), on the one case it names: FashionNet at batch 128, Ember with
    CUDA graphs against Python eager (fused=True beside it) and torch.compile reduce-overhead; 3
    interleaved reps, each ember-graph process started anew (~3 s), torch.compile cold once (~20-40 s)
    then from Inductor's cache. Ember eager, which the goal does not name, is in the speed table (call 3)."""
    js = c.work / "speed_goal.json"
    bench_row(c, SPEED_GOAL_ROW,
              speed_cmd(c, js, "--models", "cnn", "--batches", "128", "--sides", "ember-graph", "python",
                        "python-fused", "compile", "--reps", "3", "--steps", "100", "--warmup", "20"),
              "speed_goal.log", numbers=lambda _: speed_numbers(js), detail=speed_detail,
              goals=lambda n, _: speed_goals(n))
