"""Sharding and activation checkpointing at --world-size GPUs (docs/planning.md, "configurations"):
the state each stage keeps per GPU, the activation models, links, the configuration rows and
their recommendation.
"""
import math
from dataclasses import dataclass

from .arithmetic import (checkpointed_blocks, communication, full_checkpoint_per_sample_bytes, largest_batch,
    light_checkpoint_per_sample_bytes, light_recompute_seconds, memory_budget, model_state_bytes, recompute_factor,
    ring_bus_bandwidth, shard_bytes)
from .constants import (BUCKET_CAP_MB, CHECKPOINT_KEYS, CHECKPOINT_MODES, GATHERED_BLOCKS, INTER_LINKS,
    LIGHT_RECOMPUTED_SHARE, MAX_WORLD_SIZE, MIB, NEAR_TIE, NET_HOP_US, NVLINK_HOP_US, PCIE_GB_S, PCIE_HOP_US,
    PEAK_KEYS, SHARDING, SHARDING_KEY, ZERO_NAMES)
from .formats import fmt_bytes, fmt_seconds, fmt_si, fmt_usd
from .rows import _precision_rank, board_has, device_resident_bytes, graph_pool_doubles, memory_entry_key


# ---------------------------------------------------------------------------------------------------
# Sharding and activation checkpointing at --world-size GPUs (docs/planning.md, "configurations")

def trainable_parameter_bytes(m):
    """Bytes of the trainable parameters (what sharding updates and all-gathers): parameter_bytes
    times the trainable share of the parameters."""
    params = m["parameters"]
    trainable = m.get("trainable_parameters", params)
    if not isinstance(trainable, (int, float)) or isinstance(trainable, bool) or params <= 0:
        return float(m["parameter_bytes"])
    return m["parameter_bytes"] * min(max(trainable, 0), params) / params


def block_parameters(m):
    """(bytes of the parameters inside the model's blocks, the largest block's) from the measurement's
    blocks: parameter_bytes (else the largest block's times the count, at most the model's) and
    largest_parameter_bytes (else an equal share); None without blocks or without either size."""
    blocks = m.get("blocks") or {}
    inside, largest = blocks.get("parameter_bytes"), blocks.get("largest_parameter_bytes")
    if not blocks.get("count") or (inside is None and largest is None):
        return None
    if inside is None:
        inside = min(largest * blocks["count"], m["parameter_bytes"])
    if largest is None:
        largest = inside / blocks["count"]
    return float(inside), float(largest)


def zero3_unplannable(m):
    """Why dist.sharding=parameters cannot be planned for this measurement, or None when it can. The
    C++ shards the parameters of core::BlockModel blocks only, and refuses the stage for any other
    model; the plan needs to know which parameters are in blocks."""
    if not (m.get("blocks") or {}).get("count"):
        return ("the measurement names no blocks: dist.sharding=parameters gathers each core::BlockModel "
                "block's parameters around it, and Ember refuses it for a model that is not a BlockModel "
                "(use gradients)")
    if block_parameters(m) is None:
        return ("blocks has neither parameter_bytes nor largest_parameter_bytes: which parameters ZeRO-3 "
                "shards is unknown (remeasure)")
    return None


def bucket_cap_bytes(m):
    """Bytes of the parameters in one unit of ZeRO-1/2 (and of ZeRO-3's outside the blocks):
    dist.bucket_cap_mb as the measurement states it (sharding.bucket_cap_mb; absent or 0: 25 MiB)."""
    cap = (m.get("sharding") or {}).get("bucket_cap_mb")
    return (cap if cap else BUCKET_CAP_MB) * MIB


def gathered_parameter_bytes(m):
    """(bytes, how) ZeRO-3 holds gathered besides its shard: the measurement's sharding.
    gathered_parameter_bytes; else GATHERED_BLOCKS of the largest block (at most the count)."""
    measured = (m.get("sharding") or {}).get("gathered_parameter_bytes")
    if measured is not None:
        return float(measured), "measured"
    _, largest = block_parameters(m)
    count = min(GATHERED_BLOCKS, m["blocks"]["count"])
    return count * largest, (f"estimated: {count} x the largest block's parameters (no prefetch: one block "
                             f"gathered at a time in forward, at most {GATHERED_BLOCKS} in backward)")


def transient_gradient_bytes(m, sharding):
    """(bytes, how) of the gradients ZeRO-1/2/3 hold copied flat while one unit is reduce-scattered
    (a unit's gradients have its parameters' dtype: its bytes): the measurement's sharding.
    transient_gradient_bytes; else the largest unit. ZeRO-1/2: one bucket of dist.bucket_cap_mb, or
    what lies outside the blocks when that is more (an embedding is one tensor, a bucket of its own);
    ZeRO-3: the largest block, or what lies outside the blocks when that is more."""
    measured = (m.get("sharding") or {}).get("transient_gradient_bytes")
    if measured is not None:
        return float(measured), "measured"
    cap = bucket_cap_bytes(m)
    trainable = trainable_parameter_bytes(m)
    blocks = block_parameters(m)
    outside = max(trainable - blocks[0], 0.0) if blocks else 0.0
    rest = ("the parameters outside the blocks as one unit (an embedding is one tensor: a bucket of its own "
            "however large)")
    if sharding != "parameters":
        bucket = min(cap, trainable)
        if outside > bucket:
            return outside, f"estimated: {rest}, more than one bucket of dist.bucket_cap_mb ({cap / MIB:g} MiB)"
        return bucket, (f"estimated: one bucket of dist.bucket_cap_mb ({cap / MIB:g} MiB) of gradients; a parameter "
                        f"larger than that is a unit of its own, which only a measurement sees")
    _, largest = blocks
    if largest >= outside:
        return largest, "estimated: the largest block's gradients"
    return outside, f"estimated: {rest}, more than the largest block"


def sharding_parts(m, sharding, n):
    """Per-GPU bytes of the model's state at a stage over n GPUs, as dist::ShardedDataParallel keeps it:
    {"available", "parameters", "gradients", "optimizer_state", "gathered_parameters",
    "communication_buffers", "how": {...}}, or {"available": False, "why"} (ZeRO-3 without blocks).
      parameters             ZeRO-3: the blocks' 1/N, the rest whole (model_state_bytes)
      gradients              ZeRO-1 at n > 1: whole (.grad, accumulated over the micro-batches) + this
                             rank's 1/N of the reduced gradient, kept between steps
      gathered_parameters    ZeRO-3 at n > 1: gathered_parameter_bytes
      communication_buffers  n > 1: DDP all-reduces through its buckets, a copy of the gradients (0 with
                             gradient_as_bucket_view); ZeRO-1/2/3 copy one unit's gradients flat while
                             it is reduce-scattered (transient_gradient_bytes)"""
    if sharding == "parameters" and n > 1:
        why = zero3_unplannable(m)
        if why is not None:
            return {"available": False, "why": why}
    units = (m.get("sharding") or {}).get("unit_elements")
    whole = 0.0
    if sharding == "parameters" and n > 1:
        whole = max(m["parameter_bytes"] - block_parameters(m)[0], 0.0)
    state = model_state_bytes(m["parameter_bytes"], m["gradient_bytes"], m["optimizer_state_bytes"], sharding, n,
                              units, whole)
    how = {"padding": "measured pieces" if units else "one piece (padding left out)"}
    gradients, gathered, buffers = state["gradients"], 0.0, 0.0
    if n > 1:
        if sharding == "optimizer":
            gradients += shard_bytes(m["gradient_bytes"], n, units)
            how["gradients"] = ("whole in .grad over the micro-batches (as DDP's no_sync), + this rank's 1/N of "
                                "the reduced gradient, kept between steps")
        if sharding == "parameters":
            how["parameters"] = (f"the blocks' 1/N; the {fmt_bytes(whole)} outside them (embeddings, final norm, a "
                                 f"tied head) whole on every rank")
            gathered, how["gathered_parameters"] = gathered_parameter_bytes(m)
        if sharding == "none":
            view = m.get("gradient_as_bucket_view") is True
            buffers = 0.0 if view else float(m["gradient_bytes"])
            how["communication_buffers"] = ("gradient_as_bucket_view: the buckets are the gradients" if view
                                            else "DDP's buckets: a copy of the gradients")
        else:
            buffers, how["communication_buffers"] = transient_gradient_bytes(m, sharding)
    return {"available": True, "parameters": state["parameters"], "gradients": gradients,
            "optimizer_state": state["optimizer_state"], "gathered_parameters": gathered,
            "communication_buffers": buffers, "how": how}


def activation_models(m, precision):
    """{mode: model} for CHECKPOINT_MODES at `precision`: {"available", "fixed_bytes",
    "per_sample_bytes", "estimated", "source", "every", "recompute_factor",
    "recomputed_bytes_per_sample"}, or {"available": False, "why"}. Measured modes come from
    memory.PRECISION.activation_checkpoint (and the measured config's own mode, the entry's F and A);
    full and light are otherwise estimated from "none" and the blocks (docs/planning.md). A x 2 under
    graph_pool_doubles, as memory_model."""
    key, how = memory_entry_key(m, precision)
    entry = m["memory"][key]
    own = m.get("activation_checkpoint", "none")
    measured = dict(entry.get("activation_checkpoint") or {})
    measured.setdefault(own, {"fixed_bytes": entry["fixed_bytes"], "per_sample_bytes": entry["per_sample_bytes"],
                              "every": m.get("activation_checkpoint_every") or 1})
    blocks = m.get("blocks") or {}
    count = blocks.get("count")
    flops = m["train_flops_per_sample"]
    block_macs, macs_how = blocks.get("forward_macs_per_sample"), "the blocks' forward"
    if block_macs is None:
        block_macs, macs_how = m.get("forward_macs_per_sample"), "the whole forward: an upper bound"
        if not isinstance(block_macs, (int, float)) or block_macs <= 0:
            block_macs, macs_how = flops / 6.0, "a third of the training FLOPs: an upper bound"
    suffix = "" if how == "measured" else f"; {how}"
    doubles = graph_pool_doubles(m)
    base = measured.get("none")
    block_bytes = entry.get("block_activation_bytes_per_sample")
    largest = entry.get("largest_block_activation_bytes_per_sample")
    out = {}
    for mode in CHECKPOINT_MODES:
        if mode in measured:
            e = measured[mode]
            fixed = e.get("fixed_bytes")
            if fixed is None:  # F barely moves with checkpointing: the unchecked run's
                unchecked = base.get("fixed_bytes") if base else None
                fixed = unchecked if unchecked is not None else entry["fixed_bytes"]
            every = (e.get("every") or 1) if mode == "full" else None
            model = {"available": True, "fixed_bytes": float(fixed), "per_sample_bytes": float(e["per_sample_bytes"]),
                     "estimated": False, "every": every,
                     "source": "measured" + (f" (every {every})" if every and every > 1 else "")}
        elif base is None:
            out[mode] = {"available": False,
                         "why": f"the measured config trains with {own} checkpointing and {mode} was not measured"}
            continue
        elif not count:
            out[mode] = {"available": False,
                         "why": "the measurement names no blocks (a model checkpoints its core::BlockModel blocks) "
                                f"and did not measure {mode}"}
            continue
        else:
            a0 = float(base["per_sample_bytes"])
            inside = float(block_bytes) if block_bytes is not None else a0
            assumed = "" if block_bytes is not None else "; assumes the blocks save all of A"
            if mode == "full":
                inputs = entry.get("block_input_bytes_per_sample")
                if inputs is None:
                    out[mode] = {"available": False,
                                 "why": "not measured, and no block_input_bytes_per_sample to estimate it from"}
                    continue
                per_sample = full_checkpoint_per_sample_bytes(a0, count, 1, inside, inputs, largest)
                source = (f"estimated: {count} blocks keep their inputs ({fmt_bytes(inputs / count)}/sample each) "
                          f"instead of what they save ({fmt_bytes(inside / count)}), + the largest block's "
                          f"while it is recomputed{assumed}")
            else:
                per_sample = light_checkpoint_per_sample_bytes(a0, count, inside, None, largest)
                source = (f"estimated: the blocks drop {LIGHT_RECOMPUTED_SHARE:.0%} of what they save (norm and "
                          f"activation outputs, LIGHT_RECOMPUTED_SHARE){assumed}")
            if per_sample <= 0:
                out[mode] = {"available": False,
                             "why": f"the estimate gives {per_sample:g} bytes per sample: the block fields "
                                    f"contradict per_sample_bytes (remeasure)"}
                continue
            model = {"available": True, "fixed_bytes": float(base.get("fixed_bytes", entry["fixed_bytes"])),
                     "per_sample_bytes": per_sample, "estimated": True, "every": 1 if mode == "full" else None,
                     "source": source}
        model["source"] += suffix
        model["recompute_factor"], model["recomputed_bytes_per_sample"] = 1.0, 0.0
        if mode == "full":
            model["recompute_factor"] = recompute_factor("full", flops, block_macs, count or model["every"],
                                                         model["every"])
            model["recompute"] = (f"one more forward of the checkpointed blocks: 2 x {fmt_si(block_macs)} MACs "
                                  f"({macs_how}) x {checkpointed_blocks(count or model['every'], model['every'])}"
                                  f"/{count or model['every']} of the blocks per sample")
        elif mode == "light":
            # What it drops: measured, the difference from no checkpointing; estimated, the share.
            if not model["estimated"] and base is not None:
                model["recomputed_bytes_per_sample"] = max(float(base["per_sample_bytes"]) - model["per_sample_bytes"],
                                                           0.0)
            elif count:
                inside = float(block_bytes) if block_bytes is not None else float(base["per_sample_bytes"])
                model["recomputed_bytes_per_sample"] = LIGHT_RECOMPUTED_SHARE * inside
            model["recompute"] = ("the dropped bytes read and written once more at the board's memory bandwidth "
                                  "(hbm_gb_s)")
        if doubles:
            model["per_sample_bytes"] *= 2
            model["source"] += "; A x 2: the CUDA graph's pool"
        out[mode] = model
    return out


def hop_links(gpu, topology):
    """The two hops of a ring on this board under `topology` (resolve_topology): {"intra": (name, GB/s per
    GPU per direction, hop seconds), "network": (name, GB/s per node per direction: NICs x NIC, hop
    seconds)}. --intra-link auto: the board's NVLink (gpus.toml's nvlink_gb_s), else its PCIe x16; nvlink
    or nvswitch on a board without NVLink: its PCIe, named so."""
    gen = int(gpu["pcie_gen"])
    pcie = (f"PCIe Gen{gen}", PCIE_GB_S[gen], PCIE_HOP_US * 1e-6)
    nvlink = ("NVLink", float(gpu["nvlink_gb_s"]), NVLINK_HOP_US * 1e-6) if gpu["nvlink_gb_s"] > 0 else None
    intra = topology["intra"]
    if isinstance(intra, float):
        hop = (f"{intra:g} GB/s link", intra, PCIE_HOP_US * 1e-6)
    elif intra == "pcie":
        hop = pcie
    elif intra == "auto":
        hop = nvlink or pcie
    else:
        hop = nvlink or (pcie[0] + " (no NVLink)", pcie[1], pcie[2])
    inter, nics = topology["inter"], topology["nics_per_node"]
    name, gbit = INTER_LINKS[inter] if isinstance(inter, str) else (f"{inter:g} Gb/s", inter)
    network = ((f"{nics} x " if nics > 1 else "") + name, nics * gbit / 8.0, NET_HOP_US * 1e-6)
    return {"intra": hop, "network": network}


def ring_link(gpu, topology, nodes=None):
    """(name of the hop that bounds the ring, its bus bandwidth in GB/s) at `nodes` nodes of the topology
    (default all of them): the intra link on one node, the NICs with one GPU a node, else the slower."""
    nodes = topology["nodes"] if nodes is None else nodes
    hops = hop_links(gpu, topology)
    (intra_name, intra, _), (net_name, net, _) = hops["intra"], hops["network"]
    gb_s = ring_bus_bandwidth(nodes, topology["gpus_per_node"], intra, net)
    bound = intra_name if nodes <= 1 or (topology["gpus_per_node"] > 1 and intra <= net) else net_name
    return bound, gb_s


def choose_link(gpu, topology):
    """(name, GB/s) of the link a world of the topology's GPUs communicates over: its ring's bus bandwidth
    (ring_link). --link auto without the topology flags: nodes of GPUS_PER_NODE on NVLink (else PCIe), one
    400G InfiniBand NIC a node between them (the ring's 50 GB/s, as before the flags); --link nvlink/pcie:
    one node of them all; --link 25gbe/100gbe/400g-ib: each GPU a node of its own with one such NIC."""
    return ring_link(gpu, topology)


def micro_batch_seconds(batch, flops_per_sample, peak_flops, mfu, floor_seconds, act, mode, hbm_bytes_per_s):
    """(time of one micro-batch with recomputation, the same without it, launch-bound?) on one GPU: the
    larger of the math at the MFU and the step floor, times the recomputation factor of full checkpointing,
    + light's recomputed bytes at the board's memory bandwidth."""
    math_seconds = batch * flops_per_sample / (peak_flops * mfu)
    base = max(math_seconds, floor_seconds)
    micro = base * act["recompute_factor"]
    if mode == "light":
        micro += light_recompute_seconds(batch, act["recomputed_bytes_per_sample"], hbm_bytes_per_s)
    return micro, base, math_seconds < floor_seconds


@dataclass
class ConfigRow:
    gpu: str
    precision: str
    sharding: str  # dist.sharding
    activation_checkpoint: str  # none, full, light
    world_size: int
    memory_gib: float
    memory_budget_bytes: float
    memory_needed_bytes: float  # per GPU at the config's batch: the sum of memory_parts
    memory_parts: dict  # context, buffers_and_data, parameters, gradients, optimizer_state,
    #                     gathered_parameters, communication_buffers, other_fixed, activations
    fits: bool
    largest_batch: int
    link: str | None  # None on one GPU
    link_gb_s: float | None
    communication_bytes: float  # sent per GPU per optimizer step
    communication_seconds: float  # per optimizer step, on the link
    compute_seconds: float  # per optimizer step, recomputation included
    recompute_seconds: float  # of compute_seconds, what checkpointing adds
    step_seconds: float  # compute + communication (no overlap)
    launch_bound: bool
    epoch_seconds: float
    usd_per_hour: float | None  # one GPU
    usd_per_run: float | None  # all world_size GPUs
    activation_source: str


def config_precisions(gpu, rows, precisions_asked, config_precision):
    """The precisions a GPU's configurations are planned in: those asked (--precision) that the board
    has; else the one of its single-GPU rows with the fastest epoch (ties: the config's own, then
    bf16, tf32, fp32, fp16)."""
    if precisions_asked:
        return [p for p in precisions_asked if board_has(gpu, p)]
    mine = [r for r in rows if r.gpu == gpu["name"]]
    if not mine:
        return []
    return [min(mine, key=lambda r: (r.epoch_seconds, _precision_rank(r.precision, config_precision))).precision]


def config_fixed_parts(m, sharding, n, act, context_bytes):
    """Per-GPU bytes that do not grow with the batch, by part (ConfigRow.memory_parts but activations)."""
    parts = sharding_parts(m, sharding, n)
    state = m["gradient_bytes"] + m["optimizer_state_bytes"]  # what the measured F holds of the state
    return {"context": context_bytes,
            "buffers_and_data": device_resident_bytes(m) - m["parameter_bytes"],
            "parameters": parts["parameters"], "gradients": parts["gradients"],
            "optimizer_state": parts["optimizer_state"], "gathered_parameters": parts["gathered_parameters"],
            "communication_buffers": parts["communication_buffers"],
            "other_fixed": max(act["fixed_bytes"] - state, 0.0)}


def stage_communication(m, sharding, n):
    """communication() of a stage for this measurement at n GPUs (ZeRO-3's all-gathers per micro-batch
    cover the blocks' parameters); None for a stage sharding_parts cannot plan."""
    block_bytes = None
    if sharding == "parameters" and n > 1:
        if zero3_unplannable(m) is not None:
            return None
        block_bytes = block_parameters(m)[0]
    return communication(sharding, n, trainable_parameter_bytes(m), m["gradient_bytes"],
                         m["accumulate_grad_batches"], block_bytes)


def config_rows(m, gpus, rows, prices, mfus, margin, context_bytes, floor_seconds, topology, shardings, modes,
                precisions_asked):
    """ConfigRow per GPU, planned precision, sharding stage and checkpointing mode available, at the
    topology's world size over its ring (choose_link)."""
    batch, accumulate, n = m["batch_size"], m["accumulate_grad_batches"], topology["world_size"]
    flops, train_samples = m["train_flops_per_sample"], m["dataset"]["train_samples"]
    comm = {s: stage_communication(m, s, n) for s in shardings}
    acts = {}
    out = []
    for gpu in gpus:
        link_name, gb_s = choose_link(gpu, topology) if n > 1 else (None, None)
        budget = memory_budget(gpu["memory_gib"], margin)
        for precision in config_precisions(gpu, rows, precisions_asked, m["precision"]):
            acts.setdefault(precision, activation_models(m, precision))
            peak = float(gpu[PEAK_KEYS[precision]]) * 1e12
            mfu = mfus[precision].value
            price = prices.get(gpu["name"], gpu.get("usd_per_hour"))
            for sharding in shardings:
                c = comm[sharding]
                if c is None:  # ZeRO-3 without blocks: not planned (sharding_parts says why)
                    continue
                micro_comm = c["micro_batch_bytes"] / (gb_s * 1e9) if n > 1 else 0.0
                step_comm = c["step_bytes"] / (gb_s * 1e9) if n > 1 else 0.0
                for mode in modes:
                    act = acts[precision][mode]
                    if not act["available"]:
                        continue
                    parts = config_fixed_parts(m, sharding, n, act, context_bytes)
                    fixed = sum(parts.values())
                    parts["activations"] = batch * act["per_sample_bytes"]
                    needed = fixed + parts["activations"]
                    micro, base, launch_bound = micro_batch_seconds(batch, flops, peak, mfu, floor_seconds, act,
                                                                    mode, gpu["hbm_gb_s"] * 1e9)
                    micro_batches = math.ceil(train_samples / (n * batch))
                    epoch = (micro_batches * (micro + micro_comm)
                             + math.ceil(micro_batches / accumulate) * step_comm)
                    out.append(ConfigRow(
                        gpu=gpu["name"], precision=precision, sharding=sharding, activation_checkpoint=mode,
                        world_size=n, memory_gib=float(gpu["memory_gib"]), memory_budget_bytes=budget,
                        memory_needed_bytes=needed, memory_parts=parts, fits=needed <= budget,
                        largest_batch=largest_batch(budget, fixed, act["per_sample_bytes"], 0, 0),
                        link=link_name, link_gb_s=gb_s, communication_bytes=c["bytes_per_step"],
                        communication_seconds=accumulate * micro_comm + step_comm,
                        compute_seconds=accumulate * micro, recompute_seconds=accumulate * (micro - base),
                        step_seconds=accumulate * (micro + micro_comm) + step_comm,
                        launch_bound=launch_bound, epoch_seconds=epoch, usd_per_hour=price,
                        usd_per_run=None if price is None else epoch * m["epochs"] / 3600.0 * price * n,
                        activation_source=act["source"]))
    return out, acts, comm


def least_memory_stage(m):
    """The stage that holds the least: ZeRO-3, or ZeRO-2 for a measurement ZeRO-3 cannot plan (no blocks)."""
    return "parameters" if zero3_unplannable(m) is None else "gradients"


def least_memory_world_size(m, gpu, act, context_bytes, margin, batch, start):
    """The smallest power-of-two world size >= start (up to MAX_WORLD_SIZE) at which the least-memory
    stage (least_memory_stage) with activation model `act` fits `batch` on `gpu`; None when none does
    (what is not sharded, activations, the parameters kept whole, gathered blocks, context, is already too
    much)."""
    budget = memory_budget(gpu["memory_gib"], margin)
    stage = least_memory_stage(m)
    n = 1
    while n < start:
        n *= 2
    while n <= MAX_WORLD_SIZE:
        parts = config_fixed_parts(m, stage, n, act, context_bytes)
        if sum(parts.values()) + batch * act["per_sample_bytes"] <= budget:
            return n
        n *= 2
    return None


def _simplicity(r):
    """Tie-break among equally cheap configurations: less sharding, then less recomputation."""
    return SHARDING.index(r.sharding), CHECKPOINT_MODES.index(r.activation_checkpoint)


def describe_config(r):
    checkpoint = f"activation checkpointing {r.activation_checkpoint}"
    if r.world_size == 1:
        return checkpoint  # one GPU: nothing sharded
    return f"sharding {r.sharding} ({ZERO_NAMES[r.sharding]}), {checkpoint}"


def config_keys(r, config_precision):
    keys = []
    if r.world_size > 1:
        keys.append(SHARDING_KEY.format(r.sharding))
    if r.activation_checkpoint != "none":
        keys.append(CHECKPOINT_KEYS[r.activation_checkpoint])
    if r.precision != config_precision:
        keys.append(f"trainer.precision={r.precision}")
    return keys


def recommend_config(m, crows, gpus, args_context):
    """{"gpu", "precision", "world_size", "sharding", "activation_checkpoint", "text", "reasons"}:
    docs/planning.md's "recommendation" over configurations: the cheapest per run where the config's
    batch fits (without prices the fastest, and among rows within NEAR_TIE of it the smallest GPU);
    equal costs go to less sharding, then less recomputation."""
    batch, n = m["batch_size"], crows[0].world_size if crows else 1
    context_bytes, margin, acts = args_context
    fitting = [r for r in crows if r.fits]
    reasons = []
    gpu_word = f"{n} GPU{'s' if n > 1 else ''}"

    def result(pick, text):
        return {"gpu": pick.gpu if pick else None, "precision": pick.precision if pick else None,
                "world_size": n, "sharding": pick.sharding if pick else None,
                "activation_checkpoint": pick.activation_checkpoint if pick else None, "text": text,
                "reasons": reasons}

    if not fitting:
        return _recommend_no_fit(m, crows, gpus, acts, context_bytes, margin, result, reasons)
    priced = [r for r in fitting if r.usd_per_run is not None]
    if priced:
        best = min(r.usd_per_run for r in priced)
        near = [r for r in priced if r.usd_per_run <= best * (1 + 1e-9)]
        pick = min(near, key=lambda r: (_simplicity(r), r.epoch_seconds))
        reasons.append(f"cheapest per run ({fmt_usd(pick.usd_per_run)} for {gpu_word}, "
                       f"{fmt_seconds(pick.epoch_seconds * m['epochs'])}) of {len(priced)} priced configurations "
                       f"where batch {batch} fits")
    else:
        fastest = min(r.epoch_seconds for r in fitting)
        near = [r for r in fitting if r.epoch_seconds <= fastest * (1 + NEAR_TIE)]
        top_peak = {g["name"]: max(float(g[k]) for k in PEAK_KEYS.values()) for g in gpus}
        pick = min(near, key=lambda r: (top_peak[r.gpu], r.memory_gib, _simplicity(r), r.epoch_seconds))
        reasons.append(f"fastest ({fmt_seconds(pick.epoch_seconds)}/epoch, "
                       f"{fmt_seconds(pick.epoch_seconds * m['epochs'])}/run) where batch {batch} fits; no prices "
                       f"given (--price GPU=USD_PER_HOUR)")
        if len({r.gpu for r in near}) > 1:
            reasons.append(f"GPUs within {NEAR_TIE:.0%} of the fastest: this is the smallest of them")
    reasons.append(_why_this_config(pick, crows))
    others = [r for r in (priced or fitting) if r is not pick]
    if others:
        cost = (lambda r: r.usd_per_run) if priced else (lambda r: r.epoch_seconds)
        runner = min(others, key=lambda r: (cost(r), _simplicity(r)))
        what = fmt_usd(runner.usd_per_run) + " per run" if priced else fmt_seconds(runner.epoch_seconds) + "/epoch"
        reasons.append(f"next: {runner.gpu} {runner.precision}, {describe_config(runner)} at {what}")
    if n > 1:
        share = pick.communication_seconds / pick.step_seconds if pick.step_seconds > 0 else 0.0
        reasons.append(f"sends {fmt_bytes(pick.communication_bytes)} per GPU per optimizer step: "
                       f"{fmt_seconds(pick.communication_seconds)} over {pick.link} ({pick.link_gb_s:g} GB/s), "
                       f"{share:.0%} of the step (no overlap assumed)")
    if pick.activation_checkpoint != "none":
        reasons.append(f"checkpointing adds {fmt_seconds(pick.recompute_seconds)} per step "
                       f"(+{pick.recompute_seconds / max(pick.compute_seconds - pick.recompute_seconds, 1e-30):.0%} "
                       f"compute) to recompute activations")
    keys = config_keys(pick, m["precision"])
    if keys:
        reasons.append("set " + " ".join(keys) + (f" and run on {n} GPUs (tools/ember run --nproc {n}, or "
                                                  f"torchrun)" if n > 1 else ""))
    if pick.launch_bound:
        reasons.append(f"launch-bound: a batch of {batch} holds less math than the step floor; a larger batch "
                       f"(up to {pick.largest_batch:,} fits) would use the GPU better")
    text = f"{pick.gpu}, {pick.precision}, {gpu_word}, {describe_config(pick)}, batch {batch}"
    return result(pick, text)


def _why_this_config(pick, crows):
    """Why this stage and mode: what the simpler configurations need on the same GPU and precision."""
    same = [r for r in crows if (r.gpu, r.precision) == (pick.gpu, pick.precision)]
    usable = f"{fmt_bytes(pick.memory_budget_bytes)} usable on {pick.gpu}"
    simpler = [r for r in same if _simplicity(r) < _simplicity(pick) and not r.fits]
    plain = "plain DDP" if pick.world_size > 1 else "no sharding"
    if pick.sharding == "none" and pick.activation_checkpoint == "none":
        return f"{plain} and no checkpointing fit: {fmt_bytes(pick.memory_needed_bytes)} of {usable}"
    if not simpler:
        return (f"{describe_config(pick)} needs {fmt_bytes(pick.memory_needed_bytes)} of {usable}, and is as "
                f"cheap as the simpler configurations that fit")
    shown = sorted(simpler, key=_simplicity)[:3]
    need = "; ".join(f"{describe_config(r)} needs {fmt_bytes(r.memory_needed_bytes)}" for r in shown)
    return (f"{need}: more than the {usable}; {describe_config(pick)} needs "
            f"{fmt_bytes(pick.memory_needed_bytes)}")


def _recommend_no_fit(m, crows, gpus, acts, context_bytes, margin, result, reasons):
    batch = m["batch_size"]
    n = crows[0].world_size if crows else 1
    some = [r for r in crows if r.largest_batch > 0]
    if some:
        best = max(some, key=lambda r: (r.largest_batch, tuple(-x for x in _simplicity(r)),
                                        -(r.usd_per_run or 0.0), -r.epoch_seconds))
        micro = best.largest_batch
        accumulate = math.ceil(batch * m["accumulate_grad_batches"] / micro)
        micro = math.ceil(batch * m["accumulate_grad_batches"] / accumulate)
        reasons.append(f"set the batch size to {micro} and trainer.accumulate_grad_batches={accumulate} (same "
                       f"effective batch)" + ("; " + " ".join(config_keys(best, m["precision"]))
                                              if config_keys(best, m["precision"]) else ""))
        text = (f"{best.gpu} {best.precision}, {n} GPU{'s' if n > 1 else ''}, {describe_config(best)}, with batch "
                f"{micro} x {accumulate} accumulation: batch {batch} fits no configuration; the largest batch is "
                f"{best.largest_batch} there")
        return result(best, text)
    # Nothing fits one sample: the least memory there is, and the world size at which it would fit.
    biggest = max(gpus, key=lambda g: g["memory_gib"])
    precision = next((r.precision for r in crows if r.gpu == biggest["name"]), None)
    candidates = [a for a in (acts.get(precision) or {}).values() if a["available"]]
    text = f"no configuration at {n} GPU{'s' if n > 1 else ''} fits even one sample"
    if candidates:
        act = min(candidates, key=lambda a: a["per_sample_bytes"])
        mode = next(k for k, v in acts[precision].items() if v is act)
        stage = least_memory_stage(m)
        parts = config_fixed_parts(m, stage, n, act, context_bytes)
        need = sum(parts.values()) + act["per_sample_bytes"]
        budget = memory_budget(biggest["memory_gib"], margin)
        if need <= budget:  # outside the stages and modes asked for
            fits = largest_batch(budget, need - act["per_sample_bytes"], act["per_sample_bytes"], 0, 0)
            what = (f"sharding {stage} ({ZERO_NAMES[stage]}) with activation checkpointing {mode}" if n > 1
                    else f"activation checkpointing {mode}")
            flags = (f"--sharding {stage} " if n > 1 else "") + f"--activation-checkpoint {mode}"
            text += (f" among the stages and modes asked for; {what} needs {fmt_bytes(need)} for one sample on "
                     f"{biggest['name']} ({fmt_bytes(budget)} usable) and fits batch {fits} there ({flags})")
            return result(None, text)
        text += (f": the least, sharding {stage} ({ZERO_NAMES[stage]}) with activation checkpointing {mode}, needs "
                 f"{fmt_bytes(need)} for one sample on {biggest['name']} ({fmt_bytes(budget)} usable)")
        more = least_memory_world_size(m, biggest, act, context_bytes, margin, 1, max(2 * n, 2))
        if more is not None:
            at_batch = least_memory_world_size(m, biggest, act, context_bytes, margin, batch, more)
            text += (f"; it would fit one sample at --world-size {more}"
                     + (f" and batch {batch} at {at_batch}" if at_batch and batch > 1 else ""))
        else:
            kept = ("the parameters outside the blocks, gathered blocks" if stage == "parameters"
                    else "the parameters (ZeRO-3 needs blocks)")
            text += (f"; no world size up to {MAX_WORLD_SIZE} fits: what is not sharded (activations, {kept}, the "
                     f"CUDA context) is too much alone")
    return result(None, text)
