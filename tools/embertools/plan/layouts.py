"""Pipeline, tensor and data parallelism at --world-size GPUs: the layouts P x T x D = world, the memory of
each one's busiest rank, its step with the pipeline's bubble and its communication, and which layout to
run (docs/distributed.md, "Pipeline, tensor and data degrees in the plan"). Estimates from arithmetic,
not measurements; Ember's pipeline and tensor parallelism are library APIs, not yet a recipe's keys.
"""
import math
from dataclasses import asdict, dataclass

from .arithmetic import (divisors, live_microbatches, memory_budget, parallel_layouts, pipeline_bubble,
    ring_bus_bandwidth, stage_blocks, tensor_parallel_seconds, tensor_share)
from .configs import (activation_models, block_parameters, config_fixed_parts, config_precisions, hop_links,
    micro_batch_seconds, ring_link, zero3_unplannable)
from .constants import (ACTIVATION_ELEMENT_BYTES, BACKWARD_SHARE, CHECKPOINT_MODES, LAYOUT_SHARDING,
    NCCL_BASE_US, NEAR_TIE, PEAK_KEYS, SHARDING, SHARDING_KEY, ZERO_NAMES, PlanError)
from .formats import fmt_bytes, fmt_count, fmt_seconds
from .nodes import step_communication
from .rows import memory_entry_key

NOT_BUILT = ("Ember's pipeline and tensor parallelism are library APIs (dist/pipeline.h, dist/tensor_parallel.h, "
             "dist/parallel_layout.h), not yet a recipe's keys, and not yet every combination a layout needs "
             "(docs/distributed.md says which): plain data parallelism is what a recipe runs today")


@dataclass
class LayoutRow:
    pipeline: int  # P: stages
    tensor: int  # T: ranks of one node splitting each block
    data: int  # D: pipelines (data-parallel replicas)
    sharding: str  # dist.sharding over the data group: none or optimizer (any stage at P = T = 1)
    activation_checkpoint: str  # none at P x T > 1 (not built inside a stage)
    microbatches: int  # m per pipeline per optimizer step (the accumulation at P = T = 1)
    micro_batch: int  # samples a microbatch
    memory_needed_bytes: float  # the busiest rank's
    busiest_stage: int
    memory_parts: dict  # of the busiest rank: config_fixed_parts' and "activations"
    fits: bool
    bubble: float  # (P - 1) / (m + P - 1)
    compute_seconds: float  # per optimizer step, the bubble's idle slots included
    tensor_seconds: float  # per step: the tensor all-reduces, on the critical path
    pipeline_seconds: float  # per step: the sends between stages, on the critical path
    data_seconds: float  # per step: the data group's collectives in all
    exposed_seconds: float  # of them, what backward does not hide
    step_seconds: float
    samples_per_second: float
    launch_bound: bool
    tensor_link: str | None
    pipeline_link: str | None
    data_link: str | None
    data_gb_s: float | None  # the data ring's bus bandwidth


def model_shape(m, precision, heads, width, seq_len):
    """What a layout needs of the model, each with how it is known: {"blocks", "pieces", "block_bytes",
    "outside_bytes", "heads", "width", "seq_len", "element_bytes", "boundary_bytes_per_sample",
    "block_activation_share", "sources": {...}}; None without blocks and their parameter bytes."""
    inside = block_parameters(m)
    if inside is None:
        return None
    count = int(m["blocks"]["count"])
    outside = max(float(m["parameter_bytes"]) - inside[0], 0.0)
    bytes_per_parameter = m["parameter_bytes"] / m["parameters"] if m["parameters"] > 0 else 4.0
    sources = {}
    if width is None:
        # A GPT-2 block holds 12 C^2 + 13 C parameters (q, k, v, the projection, the 4C MLP; biases, norms).
        per_block = inside[0] / count / bytes_per_parameter
        width = max(1, round((-13 + math.sqrt(169 + 48 * per_block)) / 24))
        sources["width"] = "estimated from a block's parameters as a GPT-2 block's 12 C^2 + 13 C (--width)"
    else:
        sources["width"] = "--width"
    if seq_len is None:
        seq_len = max(1, round(m["train_flops_per_sample"] / (6.0 * max(m["parameters"], 1))))
        sources["seq_len"] = ("estimated as train FLOPs / (6 x parameters), high by attention's share "
                              "(--seq-len)")
    else:
        sources["seq_len"] = "--seq-len"
    sources["heads"] = "--heads" if heads is not None else "not given (--heads): no tensor parallelism planned"
    element = ACTIVATION_ELEMENT_BYTES[precision]
    key, _ = memory_entry_key(m, precision)
    entry = m["memory"][key]
    a = entry["per_sample_bytes"]
    s = entry.get("block_activation_bytes_per_sample")
    if s is not None and a > 0:
        share = min(max(float(s) / a, 0.0), 1.0)
        sources["activations"] = (f"the blocks save {share:.0%} of A (block_activation_bytes_per_sample), "
                                  f"the rest (logits, loss) on the last stage")
    else:
        share = 1.0
        sources["activations"] = "all of A taken as the blocks' (no block_activation_bytes_per_sample)"
    return {"blocks": count, "pieces": count + (2 if outside > 0 else 0), "block_bytes": inside[0] / count,
            "outside_bytes": outside, "heads": heads, "width": width, "seq_len": seq_len, "element_bytes": element,
            "boundary_bytes_per_sample": float(seq_len) * width * element, "block_activation_share": share,
            "sources": sources}


def stage_parameter_share(m, shape, stages, tensor, stage):
    """The share of the model's parameter bytes one rank of stage `stage` holds: its blocks (the busiest
    tensor rank's share of each: tensor_share), + everything outside the blocks on a stage at either end
    (the embedding on the first, the head on the last: with tied embeddings both hold the whole token
    embedding, as Ember's PipelineRunner does; untied, this over-counts each end by the other's) / T (the
    vocabulary cut T ways)."""
    end = stage == 0 or stage == stages - 1
    held = stage_blocks(shape["blocks"], stages, stage) * shape["block_bytes"] * tensor_share(shape["heads"], tensor)
    held += shape["outside_bytes"] / tensor if end else 0.0
    return held / float(m["parameter_bytes"])


def stage_measurement(m, share):
    """The measurement as one rank of a stage holding `share` of the parameter bytes: the state, buffers and
    the fixed bytes F scaled; no blocks (no ZeRO-3 inside a pipeline) and no measured units (their padding
    and sizes are the whole model's)."""
    out = dict(m)
    for key in ("parameters", "trainable_parameters", "parameter_bytes", "buffer_bytes", "gradient_bytes",
                "optimizer_state_bytes"):
        value = m.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = value * share
    out.pop("blocks", None)
    out["sharding"] = {k: v for k, v in (m.get("sharding") or {}).items() if k == "bucket_cap_mb"}
    return out


def data_ring(stages, tensor, data, gpus_per_node, hops):
    """(name of the bounding hop, bus GB/s, nodes) of the data group's ring, the slowest over the stages:
    its D ranks are T apart; NCCL's rings over a node's NICs are shared by every data group with a rank
    in the node (one a GPU: gpus_per_node / members of it), the nodes' NICs carrying each ring once."""
    (intra_name, intra, _), (net_name, net, _) = hops["intra"], hops["network"]
    worst = None
    for s in range(stages):
        ranks = [s * tensor * data + d * tensor for d in range(data)]
        nodes = {}
        for r in ranks:
            nodes[r // gpus_per_node] = nodes.get(r // gpus_per_node, 0) + 1
        members = max(nodes.values())
        groups = max(gpus_per_node // members, 1)
        gb_s = ring_bus_bandwidth(len(nodes), members, intra, net / groups)
        name = intra_name if len(nodes) <= 1 or (members > 1 and intra <= net / groups) else net_name
        if worst is None or gb_s < worst[1]:
            worst = (name, gb_s, len(nodes))
    return worst


def pipeline_hop(stages, tensor, data, gpus_per_node, hops):
    """(name, GB/s per rank, hop seconds) of the slowest boundary between stages: a rank sends to the same
    (data, tensor) rank of the next stage, T x D ranks further; across nodes the ranks of a node that send
    at once share its NICs; inside one, the intra link. None for one stage."""
    if stages <= 1:
        return None
    span = tensor * data
    worst = None
    for s in range(stages - 1):
        across = sum(1 for j in range(span) if (s * span + j) // gpus_per_node != ((s + 1) * span + j) // gpus_per_node)
        if across:
            senders = min(gpus_per_node, across)
            hop = (hops["network"][0], hops["network"][1] / senders, hops["network"][2])
        else:
            hop = hops["intra"]
        if worst is None or hop[1] < worst[1]:
            worst = hop
    return worst


def data_parallel_row(m, gpu, topology, precision, mfu, floor_seconds, context_bytes, budget, sharding, mode,
                      act, microbatches=None):
    """P = T = 1: section 4's configuration at the world size (its batch x accumulation in `microbatches`
    micro-batches: default the config's accumulation), timed as the nodes section times it (micro-batches,
    and the collectives' exposed part after overlap with backward)."""
    n = topology["world_size"]
    samples = m["batch_size"] * m["accumulate_grad_batches"]
    accumulate = m["accumulate_grad_batches"] if microbatches is None else microbatches
    batch = samples // accumulate
    peak, hbm = float(gpu[PEAK_KEYS[precision]]) * 1e12, gpu["hbm_gb_s"] * 1e9
    hops = hop_links(gpu, topology)
    parts = config_fixed_parts(m, sharding, n, act, context_bytes)
    parts["activations"] = batch * act["per_sample_bytes"]
    needed = sum(parts.values())
    micro, base, launch_bound = micro_batch_seconds(batch, m["train_flops_per_sample"], peak, mfu, floor_seconds,
                                                    act, mode, hbm)
    backward = micro - (1.0 - BACKWARD_SHARE) * base
    link, gb_s = ring_link(gpu, topology)
    comm = step_communication(m, sharding, n, topology["nodes"], gb_s * 1e9, (hops["intra"][2], hops["network"][2]),
                              accumulate, backward)
    step = accumulate * micro + comm["exposed_seconds"]
    return LayoutRow(pipeline=1, tensor=1, data=n, sharding=sharding, activation_checkpoint=mode,
                     microbatches=accumulate, micro_batch=batch, memory_needed_bytes=needed, busiest_stage=0,
                     memory_parts=parts, fits=needed <= budget, bubble=0.0, compute_seconds=accumulate * micro,
                     tensor_seconds=0.0, pipeline_seconds=0.0, data_seconds=comm["seconds"],
                     exposed_seconds=comm["exposed_seconds"], step_seconds=step,
                     samples_per_second=n * samples / step, launch_bound=launch_bound, tensor_link=None,
                     pipeline_link=None, data_link=link, data_gb_s=gb_s)


def data_parallel_rows(m, gpu, topology, precision, mfu, floor_seconds, context_bytes, budget, shardings, modes,
                       acts):
    """The plain data-parallel variants: each stage and mode at the config's accumulation; where none of them
    fits, also every other split of the batch x accumulation into equal micro-batches (section 4's accumulation
    advice)."""
    def rows(counts):
        return [data_parallel_row(m, gpu, topology, precision, mfu, floor_seconds, context_bytes, budget, s, mode,
                                  acts[mode], c)
                for s in shardings for mode in modes if acts[mode]["available"] for c in counts]
    samples = m["batch_size"] * m["accumulate_grad_batches"]
    own = rows([None])
    if any(r.fits for r in own):
        return own
    return own + rows([c for c in divisors(samples) if c != m["accumulate_grad_batches"]])


def layout_row(m, shape, gpu, topology, precision, mfu, floor_seconds, context_bytes, budget, layout, sharding,
               microbatches, schedule, act):
    """One layout (P, T, D) with `microbatches` per pipeline and ZeRO-`sharding` over its data group: the
    busiest rank's memory and the step (docs: "Pipeline, tensor and data degrees in the plan")."""
    p, t, d = layout
    per_pipeline = p * t * m["batch_size"] * m["accumulate_grad_batches"]  # G / D, G = world x batch x accumulate
    micro = per_pipeline // microbatches
    hops = hop_links(gpu, topology)
    a, share = act["per_sample_bytes"], shape["block_activation_share"]
    cut = tensor_share(shape["heads"], t)  # the busiest tensor rank's share of a block (1/T when T divides the heads)
    worst = None
    for s in range(p):
        stage_share = stage_parameter_share(m, shape, p, t, s)
        parts = config_fixed_parts(stage_measurement(m, stage_share), sharding, d,
                                   {"fixed_bytes": act["fixed_bytes"] * stage_share}, context_bytes)
        blocks_here = stage_blocks(shape["blocks"], p, s) / shape["blocks"]
        live = live_microbatches(p, microbatches, s, schedule)
        parts["activations"] = live * micro * a * share * blocks_here * cut
        if s == p - 1:  # the logits and the loss: the head's, on the last stage
            parts["activations"] += live * micro * a * (1.0 - share) / t
        needed = sum(parts.values())
        if worst is None or needed > worst[0]:
            worst = (needed, s, parts)
    needed, busiest, parts = worst
    peak = float(gpu[PEAK_KEYS[precision]]) * 1e12
    # The pipeline runs at its busiest stage's pace: the most blocks a stage holds, as a share of all blocks, of
    # the model's math (all of it taken as the blocks': 1/P when P divides them) and of its kernels, split T ways.
    most_blocks = stage_blocks(shape["blocks"], p, 0)
    pace = most_blocks / shape["blocks"]
    math_seconds = micro * m["train_flops_per_sample"] * pace * cut / (peak * mfu)
    stage_floor = floor_seconds * pace
    slot = max(math_seconds, stage_floor)
    tensor = tensor_parallel_seconds(most_blocks, micro, shape["boundary_bytes_per_sample"], t,
                                     hops["intra"][1] * 1e9, hops["intra"][2])
    hop = pipeline_hop(p, t, d, topology["gpus_per_node"], hops)
    send = 0.0
    if hop is not None:  # the activation forward and its gradient back, each rank its 1/T (sequence-parallel)
        send = 2.0 * (micro * shape["boundary_bytes_per_sample"] / t / (hop[1] * 1e9) + NCCL_BASE_US * 1e-6 + hop[2])
    slots = microbatches + p - 1
    data = {"seconds": 0.0, "exposed_seconds": 0.0}
    ring = None
    if d > 1:
        ring = data_ring(p, t, d, topology["gpus_per_node"], hops)
        held = stage_measurement(m, stage_parameter_share(m, shape, p, t, busiest))  # its gradients, reduced over D
        data = step_communication(held, sharding, d, ring[2], ring[1] * 1e9, (hops["intra"][2], hops["network"][2]),
                                  microbatches, BACKWARD_SHARE * slot)
    step = slots * (slot + tensor + send) + data["exposed_seconds"]
    return LayoutRow(pipeline=p, tensor=t, data=d, sharding=sharding, activation_checkpoint="none",
                     microbatches=microbatches, micro_batch=micro, memory_needed_bytes=needed, busiest_stage=busiest,
                     memory_parts=parts, fits=needed <= budget, bubble=pipeline_bubble(p, microbatches),
                     compute_seconds=slots * slot, tensor_seconds=slots * tensor, pipeline_seconds=slots * send,
                     data_seconds=data["seconds"], exposed_seconds=data["exposed_seconds"], step_seconds=step,
                     samples_per_second=d * per_pipeline / step, launch_bound=math_seconds < stage_floor,
                     tensor_link=hops["intra"][0] if t > 1 else None, pipeline_link=hop[0] if hop else None,
                     data_link=ring[0] if ring else None, data_gb_s=ring[1] if ring else None)


def _simplicity(r):
    """Among equal steps: plain data parallelism first, then fewer stages and tensor ranks, less sharding, less
    recomputation, fewer microbatches."""
    return (r.pipeline * r.tensor, r.tensor, SHARDING.index(r.sharding),
            CHECKPOINT_MODES.index(r.activation_checkpoint), r.microbatches)


def _best(rows):
    """The fastest row that fits (ties: _simplicity), else the one needing the least memory."""
    fitting = [r for r in rows if r.fits]
    if fitting:
        return min(fitting, key=lambda r: (r.step_seconds, _simplicity(r)))
    return min(rows, key=lambda r: (r.memory_needed_bytes, _simplicity(r))) if rows else None


def layout_gpu(m, gpus, rows, recommendation, precisions_asked):
    """(gpu, precision) the layouts are planned on: the recommendation's, else the selection's largest GPU
    (then the fastest) at its planned precision (config_precisions)."""
    by_name = {g["name"]: g for g in gpus}
    if recommendation.get("gpu") in by_name and recommendation.get("precision"):
        return by_name[recommendation["gpu"]], recommendation["precision"]
    for gpu in sorted(gpus, key=lambda g: (-g["memory_gib"], -max(float(g[k]) for k in PEAK_KEYS.values()))):
        precisions = config_precisions(gpu, rows, precisions_asked, m["precision"])
        if precisions:
            return gpu, precisions[0]
    return None, None


def plan_layouts(m, gpus, rows, recommendation, mfus, floor_seconds, context_bytes, args):
    """The "layouts" section at the topology's world size: {"shown", ...}; see docs/distributed.md."""
    topology, n = args.topology, args.world_size
    forced = args.pipeline is not None or args.tensor is not None
    out = {"shown": False, "world_size": n}
    if n <= 1:
        return out
    shape_why = None if block_parameters(m) is not None else (
        "the measurement names no blocks with their parameter bytes: a model is cut into stages, and its "
        "blocks split over tensor ranks, at its core::BlockModel blocks")
    if shape_why is not None:
        if forced:
            flag = "--pipeline" if args.pipeline is not None else "--tensor"
            raise PlanError(f"{flag}: {m['recipe']}'s measurement cannot plan it: {shape_why}")
        out["why"] = shape_why
        return out
    gpu, precision = layout_gpu(m, gpus, rows, recommendation, args.precision)
    if gpu is None:
        out["why"] = "no GPU of the selection has the precisions asked for"
        return out
    shape = model_shape(m, precision, args.heads, args.width, args.seq_len)
    if args.pipeline is not None and args.pipeline > shape["pieces"]:
        raise PlanError(f"--pipeline {args.pipeline}: {m['recipe']} has {shape['pieces']} pieces to put in stages "
                        f"({shape['blocks']} blocks" + (", the embedding and the head)" if shape["pieces"] >
                                                          shape["blocks"] else ")"))
    acts = activation_models(m, precision)
    mfu = mfus[precision].value
    budget = memory_budget(gpu["memory_gib"], args.margin)
    schedule = args.schedule
    batch, accumulate = m["batch_size"], m["accumulate_grad_batches"]
    candidates = parallel_layouts(n, topology["gpus_per_node"], args.heads, shape["pieces"], args.pipeline,
                                  args.tensor)
    dp_shardings = [s for s in args.sharding if s != "parameters" or zero3_unplannable(m) is None]
    layout_shardings = [s for s in args.sharding if s in LAYOUT_SHARDING] or list(LAYOUT_SHARDING)
    table, excluded = [], []
    for layout in candidates:
        p, t, d = layout
        if (p, t) == (1, 1):
            variants = data_parallel_rows(m, gpu, topology, precision, mfu, floor_seconds, context_bytes, budget,
                                          dp_shardings, args.activation_checkpoint, acts)
        else:
            if not acts["none"]["available"]:
                excluded.append({"pipeline": p, "tensor": t, "data": d,
                                 "why": f"no activations without checkpointing: {acts['none']['why']}"})
                continue
            per_pipeline = p * t * batch * accumulate
            counts = [args.microbatches] if args.microbatches is not None else divisors(per_pipeline)
            counts = [c for c in counts if per_pipeline % c == 0 and (schedule == "gpipe" or c >= p)]
            if not counts:
                excluded.append({"pipeline": p, "tensor": t, "data": d,
                                 "why": (f"--microbatches {args.microbatches} does not split its {per_pipeline} "
                                         f"samples a step into equal microbatches of at least {p} (1F1B)"
                                         if args.microbatches is not None
                                         else f"fewer than {p} samples a step for {p} stages (1F1B)")})
                continue
            shardings = [s for s in layout_shardings if d > 1 or s == "none"] or ["none"]
            variants = [layout_row(m, shape, gpu, topology, precision, mfu, floor_seconds, context_bytes, budget,
                                   layout, s, c, schedule, acts["none"]) for s in shardings for c in counts]
        pick = _dp_pick(variants, recommendation, precision, gpu) if (p, t) == (1, 1) else _best(variants)
        if pick is not None:
            table.append(pick)
    if forced and not any((r.pipeline, r.tensor) != (1, 1) for r in table):
        raise PlanError("--pipeline/--tensor: no layout of them can be planned: "
                        + "; ".join(f"P {x['pipeline']} x T {x['tensor']}: {x['why']}" for x in excluded))
    if not table:
        out["why"] = ("no layout can be planned with the stages and modes asked for (--sharding, "
                      "--activation-checkpoint): " + "; ".join(x["why"] for x in excluded[:1]))
        return out
    out.update(shown=True, gpu=gpu["name"], precision=precision, schedule=schedule,
               microbatches_asked=args.microbatches, forced={"pipeline": args.pipeline, "tensor": args.tensor},
               global_batch=n * batch * accumulate, memory_budget_bytes=budget,
               gpus_per_node=topology["gpus_per_node"], nodes=topology["nodes"],
               model={k: v for k, v in shape.items()}, rows=[asdict(r) for r in table], excluded=excluded)
    out["verdict"] = layout_verdict(table, n, forced)
    if any(acts[mode]["available"] for mode in ("full", "light")) and any((r.pipeline, r.tensor) != (1, 1)
                                                                         for r in table):
        out["notes"] = ["layouts with P x T > 1 are planned without activation checkpointing (not built inside "
                        "a stage)"]
    return out


def _dp_pick(variants, recommendation, precision, gpu):
    """The plain data-parallel row shown: the recommended configuration's when it is one of them and fits
    (the plan's own choice, by cost), else the fastest that fits."""
    rec = next((r for r in variants if r.fits and recommendation.get("gpu") == gpu["name"]
                and recommendation.get("precision") == precision
                and (r.sharding, r.activation_checkpoint) == (recommendation.get("sharding"),
                                                              recommendation.get("activation_checkpoint"))), None)
    return rec or _best(variants)


def _pct(x):
    return "under 0.1%" if 0 < x < 0.001 else f"{x:.1%}"


def describe_layout(r):
    return f"pipeline {r.pipeline} x tensor {r.tensor} x data {r.data}"


def _dp_words(r):
    mode = "" if r.activation_checkpoint == "none" else f" and activation checkpointing {r.activation_checkpoint}"
    return f"dist.sharding={r.sharding} ({ZERO_NAMES[r.sharding]}){mode}"


def _overheads(r):
    """What a layout's step spends besides its share of the math, in words."""
    parts = []
    if r.pipeline > 1:
        idle = r.pipeline - 1
        parts.append(f"a bubble of {_pct(r.bubble)} ({idle} idle slot{'s' if idle > 1 else ''} of "
                     f"{r.microbatches + idle})")
    if r.tensor > 1:
        parts.append(f"{fmt_seconds(r.tensor_seconds)} of tensor all-reduces over {r.tensor_link}")
    if r.pipeline > 1:
        parts.append(f"{fmt_seconds(r.pipeline_seconds)} of sends between stages over {r.pipeline_link}")
    if r.data > 1:
        parts.append(f"{fmt_seconds(r.exposed_seconds)} of the data group's "
                     f"{fmt_seconds(r.data_seconds)} exposed")
    return ", ".join(parts) or "no communication"


def layout_verdict(table, n, forced=False):
    """{"plain_data_parallel": True/False/None, "recommended": index into table or None, "text"}: the fastest
    layout that fits; plain data parallelism when its row fits within NEAR_TIE of it. `forced`: the table holds
    only the layouts of --pipeline/--tensor beside plain data parallelism."""
    fitting = [r for r in table if r.fits]
    out = {"plain_data_parallel": None, "recommended": None, "text": ""}
    if not fitting:
        least = min(table, key=lambda r: r.memory_needed_bytes)
        out["text"] = (f"no layout fits at {n} GPUs: the least, {describe_layout(least)}, needs "
                       f"{fmt_bytes(least.memory_needed_bytes)} on its busiest rank (stage {least.busiest_stage}); "
                       f"more GPUs (--world-size), a larger GPU or a smaller batch")
        return out
    best = min(fitting, key=lambda r: (r.step_seconds, _simplicity(r)))
    dp = next((r for r in fitting if (r.pipeline, r.tensor) == (1, 1)), None)
    others = [r for r in fitting if (r.pipeline, r.tensor) != (1, 1)]
    rival = min(others, key=lambda r: (r.step_seconds, _simplicity(r))) if others else None
    if dp is not None and dp.step_seconds <= best.step_seconds * (1 + NEAR_TIE):
        out["plain_data_parallel"], out["recommended"] = True, table.index(dp)
        better = dp.step_seconds <= (rival.step_seconds if rival else math.inf)
        text = (f"plain data parallelism with {_dp_words(dp)} is {'better' if better else 'as good'} here "
                f"{'because' if better else f'(within {NEAR_TIE:.0%}) and simpler because'} the model's state and "
                f"batch fit each GPU with it ({fmt_bytes(dp.memory_needed_bytes)}) and "
                + (f"its {fmt_seconds(dp.data_seconds)} of collectives leave {fmt_seconds(dp.exposed_seconds)} exposed "
                   f"after overlap with backward ({_pct(dp.exposed_seconds / dp.step_seconds)} of its "
                   f"{fmt_seconds(dp.step_seconds)} step)" if dp.data_seconds > 0 else "it communicates nothing"))
        if rival is not None:
            text += (f"; the best layout that splits the model, {describe_layout(rival)}, is estimated at "
                     f"{fmt_seconds(rival.step_seconds)} a step: {_overheads(rival)}")
        else:
            text += "; no layout that splits the model fits"
        out["text"] = text
        return out
    out["plain_data_parallel"], out["recommended"] = False, table.index(best)
    fastest = "of the layouts asked for (--pipeline, --tensor)" if forced else ""
    text = (f"{describe_layout(best)} is estimated fastest{fastest and ' ' + fastest}: "
            f"{fmt_seconds(best.step_seconds)} a step "
            f"({_overheads(best)}), {fmt_bytes(best.memory_needed_bytes)} on its busiest rank (stage "
            f"{best.busiest_stage})")
    if dp is not None:
        text += (f"; plain data parallelism with {_dp_words(dp)} fits but takes {fmt_seconds(dp.step_seconds)} "
                 f"({dp.step_seconds / best.step_seconds - 1:.0%} longer: {fmt_seconds(dp.exposed_seconds)} of its "
                 f"collectives exposed)")
    else:
        least = next((r for r in table if (r.pipeline, r.tensor) == (1, 1)), None)
        if least is not None:
            text += (f"; plain data parallelism does not fit: with {_dp_words(least)}, its least, it needs "
                     f"{fmt_bytes(least.memory_needed_bytes)} a GPU")
    out["text"] = text
    return out


def layout_recommendation(m, layouts, recommendation):
    """The plan's recommendation after the layouts: unchanged (a sentence added) when plain data parallelism
    is as good; the layout's when one with P x T > 1 is faster or alone fits."""
    recommendation.setdefault("layout", None)
    if not layouts.get("shown"):
        return recommendation
    verdict = layouts["verdict"]
    if verdict["plain_data_parallel"] is not False:
        if verdict["text"]:
            recommendation["reasons"].append(verdict["text"])
        return recommendation
    r = layouts["rows"][verdict["recommended"]]
    n = layouts["world_size"]
    layout = {"pipeline": r["pipeline"], "tensor": r["tensor"], "data": r["data"], "schedule": layouts["schedule"],
              "microbatches": r["microbatches"], "micro_batch": r["micro_batch"]}
    keys = [SHARDING_KEY.format(r["sharding"])] if r["data"] > 1 else []
    if layouts["precision"] != m["precision"]:
        keys.append(f"trainer.precision={layouts['precision']}")
    text = (f"{layouts['gpu']}, {layouts['precision']}, {n} GPUs as pipeline {r['pipeline']} x tensor {r['tensor']} x "
            f"data {r['data']} ({layouts['schedule'].upper() if layouts['schedule'] == 'gpipe' else '1F1B'}, "
            f"{r['microbatches']} microbatches of {r['micro_batch']})"
            + (f", sharding {r['sharding']} ({ZERO_NAMES[r['sharding']]}) over the data group" if r["data"] > 1 else "")
            + f", {fmt_count(layouts['global_batch'])} samples a step")
    reasons = [verdict["text"],
               "estimates from arithmetic, not measurements (docs/distributed.md, \"Pipeline, tensor and data "
               "degrees in the plan\")",
               NOT_BUILT]
    if keys:
        reasons.append("set " + " ".join(keys))
    before = recommendation["text"] + (": " + "; ".join(recommendation["reasons"]) if recommendation["reasons"] else "")
    reasons.append(f"with data parallelism alone (what Ember runs today), the plan was: {before}")
    return {"gpu": layouts["gpu"], "precision": layouts["precision"], "world_size": n, "sharding": r["sharding"],
            "activation_checkpoint": r["activation_checkpoint"], "text": text, "reasons": reasons, "layout": layout}
