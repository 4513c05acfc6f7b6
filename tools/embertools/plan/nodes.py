"""Several nodes (docs/planning.md, "nodes"): the recommended configuration on 1, 2, 4, ... nodes,
its communication and whether a second node pays; make_plan, which assembles the whole plan.
"""
import math
from dataclasses import asdict

from embertools.errors import UsageError
from .arithmetic import exposed_seconds, memory_budget, ring_latency_seconds, step_floor, step_launches
from .configs import (block_parameters, bucket_cap_bytes, config_fixed_parts, config_rows, hop_links,
    micro_batch_seconds, recommend_config, ring_link, sharding_parts, stage_communication,
    trainable_parameter_bytes, zero3_unplannable)
from .constants import (BACKWARD_SHARE, DEFAULT_MFU, GATHERED_BLOCKS, GIB, LIGHT_RECOMPUTED_SHARE,
    LOADER_HOST_BATCHES, NCCL_BASE_US, NET_HOP_US, NVLINK_HOP_US, PAYS_EFFICIENCY, PCIE_HOP_US, PEAK_KEYS,
    PRECISIONS, PlanError)
from .formats import fmt_bytes, fmt_seconds
from .inputs import choose_mfu, describe_mfu, find_run_calibrations
from .rows import (add_cpu_cores, best_row_per_gpu, data_parallel, feeding, graph_pool_doubles, memory_model, plan_rows,
    recommend)


# ---------------------------------------------------------------------------------------------------
# Several nodes (docs/planning.md, "nodes"): the recommended configuration on 1, 2, 4, ... nodes

def collective_calls(m, sharding, of):
    """How many collectives (launches, each paying the latency) move one buffer `of` a stage: DDP
    all-reduces the gradients bucket by bucket (dist.bucket_cap_mb, 25 MiB; DDP's first bucket of 1 MiB
    left out); ZeRO-1/2 reduce-scatter and all-gather unit by unit (sharding.unit_elements when
    measured, else buckets of the cap); ZeRO-3 one unit a block, + one for the parameters outside them,
    all-gathered a block at a time, those outside in one."""
    units = (m.get("sharding") or {}).get("unit_elements")
    if of == "block parameters":
        return int(m["blocks"]["count"])
    if of == "other parameters":
        return 1
    if sharding != "none" and units:
        return len(units)
    if sharding == "parameters":
        outside = trainable_parameter_bytes(m) - block_parameters(m)[0]
        return int(m["blocks"]["count"]) + (1 if outside > 0 else 0)
    nbytes = m["gradient_bytes"] if of == "gradients" else trainable_parameter_bytes(m)
    return max(1, math.ceil(nbytes / bucket_cap_bytes(m)))


def step_communication(m, sharding, n, nodes, bus_bytes_per_s, hop_seconds, accumulate, backward_seconds):
    """{"seconds", "exposed_seconds"} per optimizer step of `accumulate` micro-batches of a stage's
    collectives (stage_communication) at n GPUs on `nodes` nodes: each collective_seconds (its bytes at
    the ring's busbw + its launches' latency; `hop_seconds`: (intra, network) hop latency). A reduction
    of the gradients (DDP's all-reduce, the stages' reduce-scatter) overlaps the backward of its
    micro-batch (exposed_seconds over its units); an all-gather does not: Ember prefetches none (ZeRO-3
    gathers a block just before it runs; the stages gather the updated parameters after the optimizer
    step, before the next forward)."""
    comm = stage_communication(m, sharding, n)
    total = exposed = 0.0
    if n <= 1 or comm is None:
        return {"seconds": 0.0, "exposed_seconds": 0.0}
    for c in comm["collectives"]:
        calls = collective_calls(m, sharding, c["of"])
        seconds = c["bytes"] / bus_bytes_per_s + calls * ring_latency_seconds(c["op"], n, nodes, *hop_seconds)
        hidden = exposed_seconds(seconds, calls, backward_seconds) if c["of"] == "gradients" else seconds
        times = accumulate if c["per"] == "micro-batch" else 1
        total += times * seconds
        exposed += times * hidden
    return {"seconds": total, "exposed_seconds": exposed}


def node_counts(nodes):
    """The node counts of the table: 1, 2, 4, ... below `nodes`, then `nodes`."""
    out, k = [], 1
    while k < nodes:
        out.append(k)
        k *= 2
    return out + [nodes]


def strong_split(batch, accumulate, ratio):
    """(micro-batch, accumulation) per GPU that keep the global batch on `ratio` times the GPUs: fewer
    micro-batches when the accumulation divides (the same micro-batch, as efficient), else a smaller
    micro-batch when the batch divides; None when neither does."""
    if ratio != int(ratio):
        return None
    ratio = int(ratio)
    if accumulate % ratio == 0:
        return batch, accumulate // ratio
    if batch % ratio == 0:
        return batch // ratio, accumulate
    return None


def node_scaling(m, topology, gpu, row, act, mfu, floor_seconds, context_bytes, margin):
    """The configuration `row` (a ConfigRow of the plan's world size) on 1, 2, 4, ... of the topology's
    nodes: per count the ring's link and busbw, memory, communication and what of it is exposed after
    overlap, the step, samples/s at the same per-GPU batch (weak scaling) and at the global batch of the
    fewest nodes that hold it (strong scaling); speed-up and efficiency against that fewest."""
    per_node, world = topology["gpus_per_node"], topology["world_size"]
    batch, accumulate = m["batch_size"], m["accumulate_grad_batches"]
    peak, hbm = float(gpu[PEAK_KEYS[row.precision]]) * 1e12, gpu["hbm_gb_s"] * 1e9
    flops = m["train_flops_per_sample"]
    hops = hop_links(gpu, topology)
    hop_seconds = (hops["intra"][2], hops["network"][2])
    budget = memory_budget(gpu["memory_gib"], margin)

    def step(nodes, n, micro_batch, micro_batches):
        micro, base, _ = micro_batch_seconds(micro_batch, flops, peak, mfu, floor_seconds, act,
                                             row.activation_checkpoint, hbm)
        backward = micro - (1.0 - BACKWARD_SHARE) * base
        link, gb_s = ring_link(gpu, topology, nodes) if n > 1 else (None, None)
        comm = step_communication(m, row.sharding, n, nodes, (gb_s or 1.0) * 1e9, hop_seconds, micro_batches,
                                  backward)
        compute = micro_batches * micro
        return {"link": link, "bus_gb_s": gb_s, "compute_seconds": compute, "backward_seconds": backward,
                "communication_seconds": comm["seconds"], "exposed_seconds": comm["exposed_seconds"],
                "step_seconds": compute + comm["exposed_seconds"]}

    counts = []
    for k in node_counts(topology["nodes"]):
        n = min(k * per_node, world)
        needed = fixed_needed(m, row, n, act, context_bytes) + batch * act["per_sample_bytes"]
        c = {"nodes": k, "gpus": n, "memory_needed_bytes": needed, "fits": needed <= budget}
        c.update(step(k, n, batch, accumulate))
        c["samples_per_second"] = n * batch * accumulate / c["step_seconds"]
        counts.append(c)
    first = next((c for c in counts if c["fits"]), None)
    for c in counts:
        c.update(speedup=None, efficiency=None, pays=None, strong=None)
        if first is None or c["nodes"] < first["nodes"]:
            continue
        c["speedup"] = c["samples_per_second"] / first["samples_per_second"]
        c["efficiency"] = c["speedup"] * first["gpus"] / c["gpus"]
        c["pays"] = c["efficiency"] >= PAYS_EFFICIENCY
        split = strong_split(batch, accumulate, c["gpus"] / first["gpus"])
        if split is not None:
            strong = dict(step(c["nodes"], c["gpus"], *split), batch=split[0], accumulate_grad_batches=split[1])
            strong["fits"] = (fixed_needed(m, row, c["gpus"], act, context_bytes) + split[0] * act["per_sample_bytes"]
                              <= budget)
            strong["speedup"] = first["step_seconds"] / strong["step_seconds"]
            strong["efficiency"] = strong["speedup"] * first["gpus"] / c["gpus"]
            c["strong"] = strong
    hop = {"intra": dict(zip(("link", "gb_s"), hops["intra"][:2])),
           "network": dict(zip(("link", "gb_s"), hops["network"][:2]))}
    out = {"available": True, "gpu": row.gpu, "precision": row.precision, "sharding": row.sharding,
           "activation_checkpoint": row.activation_checkpoint, "batch": batch, "accumulate_grad_batches": accumulate,
           "global_batch": None if first is None else first["gpus"] * batch * accumulate,
           "memory_budget_bytes": budget, "links": hop, "counts": counts}
    out["verdict"] = node_verdict(out, per_node)
    return out


def fixed_needed(m, row, n, act, context_bytes):
    """Per-GPU bytes of a configuration that do not grow with the batch, at n GPUs."""
    return sum(config_fixed_parts(m, row.sharding, n, act, context_bytes).values())


def _nodes_word(k):
    return {1: "one node", 2: "two nodes"}.get(k, f"{k} nodes")


def node_verdict(scaling, per_node):
    """{"second_node": "pays" | "does not pay" | "costs more than it saves" | None, "most_paying_nodes",
    "text", "strong_text"}: what one more node (two against one; from the fewest nodes that hold the configuration when
    one does not) does to the samples/s at the same per-GPU batch, when it pays (efficiency >=
    PAYS_EFFICIENCY, the data-parallel table's bar: at efficiency e a sample costs 1/e the GPU-hours), and
    the same at a fixed global batch."""
    counts = scaling["counts"]
    first = next((c for c in counts if c["fits"]), None)
    out = {"second_node": None, "most_paying_nodes": None, "text": "", "strong_text": ""}
    if first is None:
        last = counts[-1]
        out["text"] = (f"no node count up to {last['nodes']} holds this configuration "
                       f"({fmt_bytes(last['memory_needed_bytes'])} a GPU on {last['nodes']} nodes, "
                       f"{fmt_bytes(scaling['memory_budget_bytes'])} usable)")
        return out
    later = [c for c in counts if c["nodes"] > first["nodes"]]
    texts = []
    if first["nodes"] > 1:
        one = counts[0]
        texts.append(f"one node of {per_node} GPUs cannot hold this configuration "
                     f"({fmt_bytes(one['memory_needed_bytes'])} a GPU, {fmt_bytes(scaling['memory_budget_bytes'])} "
                     f"usable): {first['nodes']} nodes are the fewest that can")
    if not later:
        out["text"] = "; ".join(texts)
        return out
    second = later[0]
    word = "all-reduce" if scaling["sharding"] == "none" else "communication"
    what = "a second node" if first["nodes"] == 1 else f"going from {first['nodes']} to {second['nodes']} nodes"
    added = second["communication_seconds"] - first["communication_seconds"]
    more = second["exposed_seconds"] - first["exposed_seconds"]
    text = (f"{what} adds {fmt_seconds(added)} of {word} per optimizer step "
            f"({fmt_seconds(first['communication_seconds'])} on {_nodes_word(first['nodes'])}, "
            f"{fmt_seconds(second['communication_seconds'])} on {_nodes_word(second['nodes'])}), {fmt_seconds(more)} "
            f"more of it exposed after overlap with backward, and gives {second['speedup']:.2f}x the samples/s of "
            f"{_nodes_word(first['nodes'])} (efficiency {second['efficiency']:.2f})")
    if second["speedup"] < 1.0:
        out["second_node"] = "costs more than it saves"
        text += (f": it costs more than it saves, {_nodes_word(second['nodes'])} train slower than "
                 f"{_nodes_word(first['nodes'])}")
    elif not second["pays"]:
        out["second_node"] = "does not pay"
        text += (f": faster, but it does not pay: a sample costs {1 / second['efficiency'] - 1:.0%} more GPU-hours "
                 f"(the bar is efficiency {PAYS_EFFICIENCY})")
    else:
        out["second_node"] = "pays"
        text += ": it pays"
    paying = [c for c in later if c["pays"]]
    out["most_paying_nodes"] = paying[-1]["nodes"] if paying else first["nodes"]
    if len(later) > 1:
        text += (f"; of up to {later[-1]['nodes']} nodes, {paying[-1]['nodes']} pay (efficiency "
                 f"{paying[-1]['efficiency']:.2f}, {paying[-1]['speedup']:.2f}x)" if paying
                 else f"; no count up to {later[-1]['nodes']} nodes pays")
    strong = second["strong"]
    if strong is not None:
        out["strong_text"] = (f"at the global batch of {_nodes_word(first['nodes'])} ({scaling['global_batch']:,} "
                              f"samples a step), {_nodes_word(second['nodes'])} take "
                              f"{fmt_seconds(strong['step_seconds'])} a step against "
                              f"{fmt_seconds(first['step_seconds'])}: "
                              f"{strong['speedup']:.2f}x (efficiency {strong['efficiency']:.2f})")
    else:
        out["strong_text"] = (f"the global batch of {_nodes_word(first['nodes'])} ({scaling['global_batch']:,} samples "
                              f"a step) does not split evenly over {second['gpus']} GPUs: no strong scaling planned")
    out["text"] = "; ".join(texts + [text])
    return out


def plan_nodes(m, topology, gpus, crows, recommendation, acts, mfus, floor_seconds, context_bytes, margin):
    """The "nodes" section: node_scaling of the recommended configuration, shown when the topology has
    more than one node; {"shown": False} otherwise, {"available": False, "why"} when there is nothing to
    scale."""
    out = {"shown": topology["nodes"] > 1, "nodes": topology["nodes"], "gpus_per_node": topology["gpus_per_node"],
           "world_size": topology["world_size"], "nics_per_node": topology["nics_per_node"]}
    if not out["shown"]:
        return out
    rec = recommendation
    row = next((r for r in crows if (r.gpu, r.precision, r.sharding, r.activation_checkpoint)
                == (rec.get("gpu"), rec.get("precision"), rec.get("sharding"), rec.get("activation_checkpoint"))), None)
    if row is None or not row.fits:
        out.update(available=False, why=(f"no configuration holds batch {m['batch_size']} at "
                                         f"{topology['world_size']} GPUs: nothing to scale (see the recommendation)"))
        return out
    gpu = next(g for g in gpus if g["name"] == row.gpu)
    act = acts[row.precision][row.activation_checkpoint]
    out.update(node_scaling(m, topology, gpu, row, act, mfus[row.precision].value, floor_seconds, context_bytes,
                            margin))
    return out


def select_gpus(gpus, names):
    """The rows named by --gpu (all without); UsageError for a name not in the table."""
    if not names:
        return gpus
    wanted = {g.lower() for g in names}
    unknown = sorted(wanted - {g["name"].lower() for g in gpus})
    if unknown:
        raise UsageError(f"--gpu {', '.join(unknown)}: not in the table; known: "
                         f"{', '.join(g['name'] for g in gpus)}")
    return [g for g in gpus if g["name"].lower() in wanted]


def real_batch(m):
    """The batch the run really uses: data.batch_size, at most the training set (one batch of it
    all, the loader's last batch being short). A measurement of a larger batch (older files; new
    ones write the real one as batch_size and the config's as config_batch_size) is planned at the
    real one: m["batch_size"] becomes it. Returns the note saying so, or None."""
    train_samples = m["dataset"]["train_samples"]
    config_batch = m.get("config_batch_size", m["batch_size"])
    if isinstance(config_batch, bool) or not isinstance(config_batch, int) or config_batch < m["batch_size"]:
        config_batch = m["batch_size"]
    m["batch_size"] = min(m["batch_size"], train_samples)
    if config_batch <= m["batch_size"]:
        return None
    return (f"data.batch_size={config_batch} is larger than the {train_samples} training samples: planned "
            f"for batches of {m['batch_size']}")


def make_plan(m, gpus, prices, args, measurement_path):
    batch_note = real_batch(m)
    runs = find_run_calibrations(args.runs_dir, m["recipe"]) if args.runs_dir else []
    precisions = args.precision or list(PRECISIONS)
    mfus = {p: choose_mfu(p, args.mfu, runs, m) for p in PRECISIONS}
    context_bytes = args.context_gib * GIB
    floor_seconds, floor_text = step_floor(m, args.step_floor_ms, args.launch_us, args.graph_launch_us,
                                           args.kernel_us)
    gpus = select_gpus(gpus, args.gpu)
    rows = plan_rows(m, gpus, prices, mfus, args.margin, context_bytes, floor_seconds, precisions)
    if not rows:
        raise PlanError(f"no GPU of the selection has the math of {', '.join(precisions)}")
    dp = data_parallel(m, gpus, best_row_per_gpu(rows, m["precision"]))
    topology = args.topology
    crows, acts, comm = config_rows(m, gpus, rows, prices, mfus, args.margin, context_bytes, floor_seconds,
                                    topology, args.sharding, args.activation_checkpoint, args.precision)
    if args.world_size > 1 and "parameters" in args.sharding_asked and zero3_unplannable(m) is not None:
        raise PlanError(f"--sharding parameters: {m['recipe']}'s measurement cannot plan it: {zero3_unplannable(m)}")
    for mode in args.checkpoint_asked:
        if not any(a[mode]["available"] for a in acts.values()):
            why = "; ".join(sorted({a[mode]["why"] for a in acts.values()}))
            raise PlanError(f"--activation-checkpoint {mode}: {m['recipe']}'s measurement cannot plan it: {why}")
    extra_modes = {mode for a in acts.values() for mode, x in a.items() if x["available"] and mode != "none"}
    shown = args.world_size > 1 or bool(extra_modes & set(args.activation_checkpoint))
    recommendation = recommend(m, rows, dp, m["precision"])
    plain_fits = any(r.fits for r in rows)
    if shown and crows and (args.world_size > 1 or not plain_fits):
        recommendation = recommend_config(m, crows, gpus, (context_bytes, args.margin, acts))
    nodes = plan_nodes(m, topology, gpus, crows, recommendation, acts, mfus, floor_seconds, context_bytes,
                       args.margin)
    verdict = nodes.get("verdict")
    if verdict and verdict["text"]:
        most = verdict["most_paying_nodes"]
        recommendation["reasons"].append(
            f"on {nodes['nodes']} nodes of {nodes['gpus_per_node']}: " + verdict["text"]
            + (f"; plan --nodes {most}, the most nodes that pay" if most and most < nodes["nodes"] else ""))
    from .layouts import layout_recommendation, plan_layouts  # layouts uses this module's step_communication
    layouts = plan_layouts(m, gpus, rows, recommendation, mfus, floor_seconds, context_bytes, args)
    recommendation = layout_recommendation(m, layouts, recommendation)
    notes = [batch_note] if batch_note else []
    if (m.get("memory_method") or "").lower().startswith("cpu"):
        notes.append("memory measured with CPU allocator statistics: a GPU adds cuDNN workspaces and "
                     "caching-allocator rounding, so keep the margin")
    if graph_pool_doubles(m):
        notes.append("trainer.cuda_graph with memory measured without a graph (memory_includes_graph_pool "
                      "false): per-sample bytes A count twice, as a graph run holds one step's activations "
                      "in its private pool while the epoch's short last batch and evaluation allocate "
                      "beside it; a measurement on a GPU counts the pool itself")
    if any(r.launch_bound for r in rows):
        notes.append(f"rows marked * are launch-bound: the math of a batch takes less than the "
                     f"{floor_seconds * 1e3:.3g} ms step floor, so their real MFU is far below the one assumed")
    data = m["dataset"]
    measured = m.get("measured") or {}
    plan = {
        "schema": 1,
        "measurement": {
            "path": str(measurement_path), "recipe": m["recipe"], "device": m["device"],
            "device_name": m.get("device_name"), "threads": m.get("threads"),
            "batch_size": m["batch_size"], "accumulate_grad_batches": m["accumulate_grad_batches"],
            "epochs": m["epochs"], "precision": m["precision"], "optimizer": m.get("optimizer"),
            "optimizer_fused": m.get("optimizer_fused"), "cuda_graph": m.get("cuda_graph"),
            "memory_includes_graph_pool": m.get("memory_includes_graph_pool"),
            "parameters": m["parameters"], "parameter_bytes": m["parameter_bytes"],
            "gradient_bytes": m["gradient_bytes"], "optimizer_state_bytes": m["optimizer_state_bytes"],
            "forward_macs_per_sample": m.get("forward_macs_per_sample"),
            "train_flops_per_sample": m["train_flops_per_sample"],
            "train_samples": data["train_samples"], "steps_per_epoch":
                math.ceil(data["train_samples"] / (m["batch_size"] * m["accumulate_grad_batches"])),
            "samples_per_second": measured.get("samples_per_second"),
            "memory_method": m.get("memory_method"),
            "verify": m.get("verify") if isinstance(m.get("verify"), dict) else None,
        },
        "assumptions": {
            "margin": args.margin, "context_bytes": context_bytes, "step_floor_seconds": floor_seconds,
            "step_floor": floor_text, "step_launches": step_launches(m), "launch_us": args.launch_us,
            "graph_launch_us": args.graph_launch_us, "kernel_us": args.kernel_us,
            "graph_pool_doubles_per_sample_bytes": graph_pool_doubles(m),
            "default_mfu": DEFAULT_MFU, "pays_efficiency": PAYS_EFFICIENCY, "host_ram_gib": args.host_ram_gib,
            "loader_host_batches": LOADER_HOST_BATCHES, "gpu_table": str(args.gpus),
            "world_size": args.world_size, "link": args.link, "nodes": topology["nodes"],
            "gpus_per_node": topology["gpus_per_node"], "intra_link": topology["intra"],
            "inter_link": topology["inter"], "nics_per_node": topology["nics_per_node"],
            "nccl_latency_us": {"base": NCCL_BASE_US, "nvlink_hop": NVLINK_HOP_US, "pcie_hop": PCIE_HOP_US,
                                "network_hop": NET_HOP_US},
            "backward_share": BACKWARD_SHARE,
            "gathered_blocks": GATHERED_BLOCKS, "light_recomputed_share": LIGHT_RECOMPUTED_SHARE,
            "bucket_cap_bytes": bucket_cap_bytes(m),
        },
        "mfu": {p: {"value": mfus[p].value, "source": mfus[p].source, "run": mfus[p].run,
                    "precision_measured": mfus[p].precision, "text": describe_mfu(mfus[p])}
                for p in precisions},
        "memory_models": {p: dict(zip(("fixed_bytes", "per_sample_bytes", "source"), memory_model(m, p)))
                          for p in precisions},
        "rows": [asdict(r) for r in rows],
        "feeding": feeding(m, rows, args.host_ram_gib, args.margin, gpus),
        **({"data_rate": dict(m["data_rate"])} if m.get("data_rate") is not None else {}),
        "data_parallel": {
            "rule": f"ring all-reduce 2(n-1)/n x gradient_bytes / link bandwidth, no overlap; pays when "
                    f"t_step / (t_step + t_allreduce) >= {PAYS_EFFICIENCY}",
            "gradient_bytes": m["gradient_bytes"], "gpus": dp},
        "configurations": {
            "shown": shown, "world_size": args.world_size, "link": args.link, "shardings": args.sharding,
            "activation_checkpoints": args.activation_checkpoint,
            "state": {s: dict(sharding_parts(m, s, args.world_size), **({"communication": comm[s]} if comm[s] else {}))
                      for s in args.sharding},
            "activations": acts, "rows": [asdict(r) for r in crows]},
        "nodes": nodes,
        "layouts": layouts,
        "recommendation": recommendation,
        "notes": notes,
    }
    add_cpu_cores(plan)
    return plan
