"""The planner's arithmetic: pure functions of numbers (memory, step and epoch time, launches,
collectives, sharded bytes, recomputation), unit-tested by tests/tools/plan_test.py.
"""
import math

from .constants import (ESTIMATED_GROUPS, FUSED_FP16_KERNELS_PER_BUCKET, FUSED_KERNELS_PER_BUCKET, GIB,
    GRAD_SCALER_KERNELS, GRAPH_LAUNCH_US, KERNELS_PER_FORWARD_NODE, KERNEL_US, LIGHT_RECOMPUTED_SHARE,
    LOADER_HOST_BATCHES, NCCL_BASE_US, RING_SHARE, SHARDING, STEP_FLOOR_MS, TENSOR_ALLREDUCES_PER_BLOCK,
    UNFUSED_KERNELS_PER_TENSOR)


# ---------------------------------------------------------------------------------------------------
# Arithmetic: pure functions of numbers, unit-tested (tests/tools/plan_test.py).

def allreduce_seconds(nbytes, n_gpus, bandwidth_bytes_per_s):
    """Ring all-reduce of `nbytes` over `n_gpus`: each GPU sends and receives 2 (n-1)/n of the
    buffer (reduce-scatter, then all-gather) over its link of `bandwidth_bytes_per_s` per
    direction. No latency term. 0 for one GPU."""
    if n_gpus <= 1:
        return 0.0
    return 2.0 * (n_gpus - 1) / n_gpus * nbytes / bandwidth_bytes_per_s


def ring_bus_bandwidth(nodes, gpus_per_node, intra_bytes_per_s, network_bytes_per_s):
    """Bus bandwidth (nccl-tests' busbw: t = share x (n-1)/n x bytes / busbw) of a ring over `nodes` nodes
    of `gpus_per_node` GPUs: the slowest hop. Inside a node each GPU sends its share to the next over its
    link (`intra_bytes_per_s` per GPU per direction); between nodes a ring leaves each node once, so the
    node's NICs together (`network_bytes_per_s`: NICs x NIC rate) carry what one GPU sends, and NCCL's
    rings (channels) spread over all NICs: busbw = min(intra, NICs x NIC). The hierarchical view gives
    the same bound: each GPU sends 1/G of the buffer across at (NICs x NIC) / G. One node: the intra
    link; one GPU a node: the network."""
    if nodes <= 1:
        return intra_bytes_per_s
    if gpus_per_node <= 1:
        return network_bytes_per_s
    return min(intra_bytes_per_s, network_bytes_per_s)


def ring_latency_seconds(op, n, nodes, intra_hop_seconds, net_hop_seconds):
    """Latency of one ring collective over n GPUs on `nodes` nodes, NCCL's model (NCCL_BASE_US): the
    base + each step's hop latency; an all-reduce has 2 (n-1) steps, 2 (nodes-1) of them across the
    network; a reduce-scatter or all-gather half of each. 0 on one GPU."""
    if n <= 1:
        return 0.0
    twice = 2 if op == "all-reduce" else 1
    steps, across = twice * (n - 1), twice * (max(nodes, 1) - 1)
    return NCCL_BASE_US * 1e-6 + (steps - across) * intra_hop_seconds + across * net_hop_seconds


def collective_seconds(op, nbytes, n, nodes, bus_bytes_per_s, intra_hop_seconds, net_hop_seconds, calls=1):
    """A ring collective over an `nbytes` buffer split into `calls` launches (DDP's buckets, the units of
    dist.sharding): collective_bytes / busbw + calls x the latency of one (the alpha-beta model; nccl-tests'
    doc/PERFORMANCE.md for the bandwidth term, NCCL's tuning model for the latency). 0 on one GPU."""
    if n <= 1:
        return 0.0
    return (collective_bytes(op, nbytes, n) / bus_bytes_per_s
            + calls * ring_latency_seconds(op, n, nodes, intra_hop_seconds, net_hop_seconds))


def exposed_seconds(seconds, units, backward_seconds):
    """What a reduction of `units` equal units taking `seconds` in all adds to a step when it overlaps a
    backward of `backward_seconds` that produces the units evenly (unit i ready at i/units of it) and the
    collectives run one at a time: the last unit's share at least (it is ready when backward ends), and
    all that backward cannot hide: max(seconds / units, seconds - backward x (units - 1) / units)."""
    if seconds <= 0:
        return 0.0
    units = max(int(units), 1)
    return max(seconds / units, seconds - backward_seconds * (units - 1) / units)


def scaling_efficiency(step_seconds, allreduce_s):
    """Share of a data-parallel step spent computing, with no overlap: t / (t + t_allreduce)."""
    return step_seconds / (step_seconds + allreduce_s)


def memory_needed(batch, fixed_bytes, per_sample_bytes, resident_bytes, context_bytes):
    """Device bytes a training run needs at micro-batch `batch`: context + resident + F + b*A.
    `resident_bytes`: what sits on the device before the loop (parameters, buffers, a
    device-resident dataset)."""
    return context_bytes + resident_bytes + fixed_bytes + batch * per_sample_bytes


def memory_budget(memory_gib, margin):
    """Bytes a run may use on a GPU sold with `memory_gib`, keeping `margin` of it free."""
    return (1.0 - margin) * memory_gib * GIB


def largest_batch(budget_bytes, fixed_bytes, per_sample_bytes, resident_bytes, context_bytes):
    """The largest batch b with memory_needed(b) <= budget_bytes; 0 when not even one sample fits."""
    room = budget_bytes - context_bytes - resident_bytes - fixed_bytes
    if room < per_sample_bytes:
        return 0
    return int(room // per_sample_bytes)


def step_seconds(batch, flops_per_sample, peak_flops, mfu, floor_seconds, accumulate=1):
    """(seconds per optimizer step, launch_bound): `accumulate` micro-batches of `batch`
    samples, each max(math at peak * mfu, floor); launch_bound when the floor won."""
    math_seconds = batch * flops_per_sample / (peak_flops * mfu)
    return accumulate * max(math_seconds, floor_seconds), math_seconds < floor_seconds


def epoch_seconds(train_samples, batch, flops_per_sample, peak_flops, mfu, floor_seconds):
    """One pass over `train_samples` in ceil(train_samples / batch) micro-batches."""
    per_batch, _ = step_seconds(batch, flops_per_sample, peak_flops, mfu, floor_seconds)
    return math.ceil(train_samples / batch) * per_batch


def optimizer_launches(optimizer, fused, parameter_tensors, fp16, groups=ESTIMATED_GROUPS):
    """Kernels one optimizer step launches, estimated for a measurement without step_ops.
    Ember's fused optimizers (`fused`) launch per (device, dtype) bucket of each parameter group,
    whatever the number of tensors; LibTorch's launch per tensor. An unknown optimizer counts as
    SGD (Ember's default)."""
    kind = optimizer if optimizer in FUSED_KERNELS_PER_BUCKET else "sgd"
    if fused:
        buckets = min(groups, parameter_tensors)  # one model, one device and dtype: a bucket per group
        kernels = buckets * (FUSED_KERNELS_PER_BUCKET[kind] + (FUSED_FP16_KERNELS_PER_BUCKET[kind] if fp16 else 0))
    else:
        kernels = parameter_tensors * UNFUSED_KERNELS_PER_TENSOR[kind]
    return kernels + (GRAD_SCALER_KERNELS if fp16 else 0)


def _accumulation(m):
    accumulate = m.get("accumulate_grad_batches", 1)
    return accumulate if isinstance(accumulate, int) and accumulate >= 1 else 1


def step_launches(m):
    """What one optimizer step of the measured config launches: {"cuda_graph", "eager", "graph_outside",
    "graph_inside", "counted", "text"}. Counts from step_ops when the measurement has them, else
    estimated from forward_graph_nodes and parameter_tensors as an eager step; None when neither."""
    ops = m.get("step_ops") if isinstance(m.get("step_ops"), dict) else {}
    graph = m.get("cuda_graph") is True
    uncounted = "; trainer.cuda_graph is on but the graph was not counted: planned as eager (remeasure)"
    eager, outside, inside = ops.get("eager"), ops.get("graph_outside"), ops.get("graph_inside")
    counts = lambda *xs: all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
    if counts(eager) and eager > 0:
        if graph and counts(outside, inside):
            return {"cuda_graph": True, "eager": eager, "graph_outside": outside, "graph_inside": inside,
                    "counted": True,
                    "text": f"{inside:g} ops inside the CUDA graph, {outside:g} outside it per step (counted)"}
        return {"cuda_graph": False, "eager": eager, "graph_outside": None, "graph_inside": None,
                "counted": True, "text": f"{eager:g} ops in one eager step (counted)" + (uncounted if graph else "")}
    nodes, tensors = m.get("forward_graph_nodes"), m.get("parameter_tensors")
    if not (isinstance(nodes, int) and isinstance(tensors, int) and nodes > 0):
        return None
    fused = m.get("optimizer_fused") is not False  # unknown: Ember's default, the fused optimizer
    fp16 = m.get("precision") == "fp16-mixed"
    optimizer = m.get("optimizer") if m.get("optimizer") in FUSED_KERNELS_PER_BUCKET else "sgd"
    opt = optimizer_launches(optimizer, fused, tensors, fp16)
    accumulate = _accumulation(m)
    if fused:
        per_bucket = FUSED_KERNELS_PER_BUCKET[optimizer] + (FUSED_FP16_KERNELS_PER_BUCKET[optimizer] if fp16 else 0)
        detail = (f"fused {optimizer}, {per_bucket} x {min(ESTIMATED_GROUPS, tensors)} parameter groups"
                  + ("" if "optimizer_fused" in m else " (fused assumed: the file does not say)"))
    else:
        detail = f"LibTorch's {optimizer}, {UNFUSED_KERNELS_PER_TENSOR[optimizer]} x {tensors} parameter tensors"
    if fp16:
        detail += f", + {GRAD_SCALER_KERNELS} GradScaler"
    kernels = accumulate * KERNELS_PER_FORWARD_NODE * nodes + opt
    micro = f"{accumulate} x " if accumulate > 1 else ""
    text = (f"~{kernels} kernels, estimated: {micro}{KERNELS_PER_FORWARD_NODE} x {nodes} forward graph nodes + "
            f"{opt} optimizer ({detail})" + (uncounted if graph else ""))
    return {"cuda_graph": False, "eager": kernels, "graph_outside": None, "graph_inside": None,
            "counted": False, "text": text}


def launch_floor(launches, launch_us, graph_launch_us, kernel_us):
    """(host_us, device_us) of one optimizer step's `launches` (step_launches): the host launching, the
    device running. A sync-free step overlaps them, so the step takes at least the larger."""
    if launches["cuda_graph"]:
        outside, inside = launches["graph_outside"], launches["graph_inside"]
        return graph_launch_us + outside * launch_us, (inside + outside) * kernel_us
    return launches["eager"] * launch_us, launches["eager"] * kernel_us


def step_floor(m, step_floor_ms, launch_us, graph_launch_us=GRAPH_LAUNCH_US, kernel_us=KERNEL_US):
    """(seconds, how) of the least time of one training micro-batch on a GPU: what the configured step
    launches (step_launches) per micro-batch, or the --step-floor-ms constant (given, or nothing
    counted)."""
    if step_floor_ms is not None:
        return step_floor_ms / 1000.0, "--step-floor-ms"
    launches = step_launches(m)
    if launches is None:
        return STEP_FLOOR_MS / 1000.0, "kernel launches, not counted in this measurement; --step-floor-ms"
    accumulate = _accumulation(m)
    host, device = launch_floor(launches, launch_us, graph_launch_us, kernel_us)
    bound = "host" if host >= device else "device"
    if launches["cuda_graph"]:
        outside, inside = launches["graph_outside"], launches["graph_inside"]
        how = (f"{launches['text']}: the larger of host {graph_launch_us:g} us graph launch + {outside} x "
               f"{launch_us:g} us = {host:g} us and device ({inside} + {outside}) x {kernel_us:g} us = "
               f"{device:g} us, {bound}-bound; --graph-launch-us, --launch-us, --kernel-us (an assumption)")
    else:
        how = (f"{launches['text']} x {launch_us:g} us host launch" if bound == "host" else
               f"{launches['text']} x {kernel_us:g} us on the device (more than {launch_us:g} us to launch)")
        how += "; --launch-us, --kernel-us"
    if accumulate > 1:
        how += f"; per micro-batch: / {accumulate} accumulation"
    return max(host, device) * 1e-6 / accumulate, how + ", --step-floor-ms"


def cost_usd(seconds, usd_per_hour):
    """What `seconds` on one GPU cost at `usd_per_hour`; None without a price."""
    return None if usd_per_hour is None else seconds / 3600.0 * usd_per_hour


def fit_memory(probes):
    """(F, A) of peak(b) = F + b*A by least squares over [{"batch", "peak_bytes"}, ...]
    (two or more different batches)."""
    xs = [float(p["batch"]) for p in probes]
    ys = [float(p["peak_bytes"]) for p in probes]
    if len(set(xs)) < 2:
        raise ValueError("needs probes at two or more different batch sizes")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def host_ram_bytes(resident_bytes, batch, sample_bytes, staged_batches=LOADER_HOST_BATCHES):
    """Host memory to keep a GPU fed: the loaded dataset plus the loader's staged batches."""
    return resident_bytes + staged_batches * batch * sample_bytes


def cpu_cores_per_gpu(samples_per_second_per_gpu, images_per_core_second):
    """CPU cores that decode a GPU's training samples as fast as it trains on them: its samples/s over
    what one core decodes a second (MEASURE.json's data_rate, measured with one decoder thread). A
    fraction: the display rounds it up."""
    return samples_per_second_per_gpu / images_per_core_second


# Sharding (dist.sharding) and activation checkpointing (model.activation_checkpoint_every): the model
# of docs/planning.md's "sharding" and "activation checkpointing", as pure functions of numbers.

def padded_elements(units, n):
    """Elements one of `n` ranks holds of `units` (element counts) split 1/n, each unit padded to a
    multiple of n: sum(ceil(u / n))."""
    return sum(-(-int(u) // n) for u in units)


def shard_bytes(nbytes, n, units=None):
    """Bytes of an `nbytes` state one of `n` ranks holds when it is split 1/n: nbytes / n, times the
    padding of each of `units` (element counts of the pieces split one by one; None: one piece, whose
    padding of at most n - 1 elements is left out)."""
    if n <= 1:
        return float(nbytes)
    if not units:
        return nbytes / n
    return nbytes * padded_elements(units, n) / sum(units)


def model_state_bytes(parameter_bytes, gradient_bytes, optimizer_state_bytes, sharding, n, units=None,
                      whole_parameter_bytes=0.0):
    """Per-GPU bytes of the model's state at a dist.sharding stage over `n` ranks: {"parameters",
    "gradients", "optimizer_state", "total"}. Each stage splits one more state 1/n (shard_bytes):
    optimizer (ZeRO-1) the optimizer state, gradients (ZeRO-2) also the gradients, parameters (ZeRO-3)
    also the parameters but `whole_parameter_bytes` of them (those outside the model's blocks, which
    every rank keeps whole): parameters = shard_bytes(parameter_bytes - whole) + whole. The ZeRO
    paper's model state: without the transients (gathered blocks, communication buffers) and without
    ZeRO-1's shard of the reduced gradient (sharding_parts adds both)."""
    level = SHARDING.index(sharding)
    whole = min(float(whole_parameter_bytes), float(parameter_bytes))
    out = {"parameters": (shard_bytes(parameter_bytes - whole, n, units) + whole if level >= 3
                          else float(parameter_bytes)),
           "gradients": shard_bytes(gradient_bytes, n, units) if level >= 2 else float(gradient_bytes),
           "optimizer_state": (shard_bytes(optimizer_state_bytes, n, units) if level >= 1
                               else float(optimizer_state_bytes))}
    out["total"] = out["parameters"] + out["gradients"] + out["optimizer_state"]
    return out


def collective_bytes(op, nbytes, n):
    """Bytes each of `n` GPUs sends (and receives) in a ring collective over an `nbytes` buffer:
    all-reduce 2 (n-1)/n, reduce-scatter and all-gather (n-1)/n each; 0 on one GPU."""
    return 0.0 if n <= 1 else RING_SHARE[op] * (n - 1) / n * nbytes


def communication(sharding, n, parameter_bytes, gradient_bytes, accumulate=1, block_parameter_bytes=None):
    """What a dist.sharding stage sends per GPU per optimizer step of `accumulate` micro-batches, as
    dist::ShardedDataParallel (lib/src/dist/sharding.cpp) does: {"collectives": [{"op", "of", "per",
    "bytes"}], "micro_batch_bytes", "step_bytes", "bytes_per_step"}. `parameter_bytes`: the trainable
    parameters (what the all-gathers rebuild), `gradient_bytes`: their gradients (what is reduced),
    `block_parameter_bytes`: of the parameters, those inside the model's blocks (ZeRO-3 only; None:
    all of them). "per" is "micro-batch" (sent each micro-batch) or "step" (once per optimizer step);
    bytes_per_step = accumulate x micro_batch_bytes + step_bytes.
      none (DDP)          an all-reduce of the gradients, at the last micro-batch;
      optimizer (ZeRO-1)  a reduce-scatter of the gradients at the last micro-batch (they accumulate
                          whole in .grad before it, as DDP's no_sync), + an all-gather of the updated
                          parameters: DDP's volume when parameters and gradients are as large;
      gradients (ZeRO-2)  a reduce-scatter of the gradients every micro-batch (the full gradient is
                          not kept), + the all-gather of the updated parameters;
      parameters (ZeRO-3) every micro-batch: an all-gather of each block's parameters before its
                          forward and again before its backward, and the reduce-scatter; per step the
                          all-gather of the updated parameters outside the blocks (when there are any)."""
    blocks = float(parameter_bytes) if block_parameter_bytes is None else min(float(block_parameter_bytes),
                                                                               float(parameter_bytes))
    rows = {"none": [("all-reduce", "gradients", "step")],
            "optimizer": [("reduce-scatter", "gradients", "step"), ("all-gather", "parameters", "step")],
            "gradients": [("reduce-scatter", "gradients", "micro-batch"), ("all-gather", "parameters", "step")],
            "parameters": [("all-gather", "block parameters", "micro-batch"),
                           ("all-gather", "block parameters", "micro-batch"),
                           ("reduce-scatter", "gradients", "micro-batch")]
                          + ([("all-gather", "other parameters", "step")] if parameter_bytes - blocks > 0 else [])}
    sizes = {"parameters": parameter_bytes, "gradients": gradient_bytes, "block parameters": blocks,
             "other parameters": parameter_bytes - blocks}
    collectives = [{"op": op, "of": of, "per": per, "bytes": collective_bytes(op, sizes[of], n)}
                   for op, of, per in rows[sharding]]
    micro = sum(c["bytes"] for c in collectives if c["per"] == "micro-batch")
    step = sum(c["bytes"] for c in collectives if c["per"] == "step")
    return {"collectives": collectives, "micro_batch_bytes": micro, "step_bytes": step,
            "bytes_per_step": accumulate * micro + step}


def checkpointed_blocks(blocks, every):
    """Blocks whose activations are recomputed with model.activation_checkpoint_every=`every`
    (blocks 0, k, 2k, ...): ceil(blocks / every)."""
    return -(-blocks // every)


def full_checkpoint_per_sample_bytes(per_sample, blocks, every, block_bytes, input_bytes, largest_block_bytes=None):
    """Per-sample activation bytes with every `every`-th of `blocks` blocks checkpointed: each
    checkpointed block keeps its input instead of its activations, and in backward the block being
    recomputed holds its activations again (the largest block's, at the peak).
      per_sample   A without checkpointing (all saved activations, per sample)
      block_bytes  of A, what the blocks save, all blocks together
      input_bytes  the blocks' inputs, all blocks together
      largest_block_bytes  the most one block saves (None: block_bytes / blocks)
    = A - c (block_bytes / L) + c (input_bytes / L) + largest, c = checkpointed_blocks(L, every)."""
    c = checkpointed_blocks(blocks, every)
    largest = block_bytes / blocks if largest_block_bytes is None else largest_block_bytes
    return per_sample - c * block_bytes / blocks + c * input_bytes / blocks + largest


def light_checkpoint_per_sample_bytes(per_sample, blocks, block_bytes, recomputed_share=None,
                                      largest_block_bytes=None):
    """Per-sample activation bytes when the blocks recompute only their norms and activations: they
    drop `recomputed_share` (LIGHT_RECOMPUTED_SHARE) of what they save, and the block in backward
    holds its share again: A - s x block_bytes + s x largest."""
    share = LIGHT_RECOMPUTED_SHARE if recomputed_share is None else recomputed_share
    largest = block_bytes / blocks if largest_block_bytes is None else largest_block_bytes
    return per_sample - share * block_bytes + share * largest


def recompute_factor(mode, train_flops_per_sample, block_macs_per_sample, blocks, every):
    """Step time with checkpointing / without, from FLOPs: full recomputes the checkpointed blocks'
    forward once in backward, 2 x their MACs per sample (forward FLOPs = 2 x MACs), of the step's
    train_flops_per_sample; light recomputes elementwise ops whose FLOPs do not count (their time is
    light_recompute_seconds)."""
    if mode != "full":
        return 1.0
    share = checkpointed_blocks(blocks, every) / blocks
    return 1.0 + 2.0 * block_macs_per_sample * share / train_flops_per_sample


def light_recompute_seconds(batch, recomputed_bytes_per_sample, hbm_bytes_per_s):
    """Time of the light mode's recomputation per micro-batch: the norms and activations are
    memory-bound, each recomputed byte read once (its input) and written once, at the board's
    memory bandwidth."""
    return 2.0 * batch * recomputed_bytes_per_sample / hbm_bytes_per_s


# Pipeline x tensor x data layouts (docs/distributed.md, "Pipeline, tensor and data degrees in the plan").

def divisors(n):
    """The divisors of n >= 1, ascending."""
    n = int(n)
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def pipeline_bubble(stages, microbatches):
    """The idle share of a pipeline step under GPipe or 1F1B: (P - 1) / (m + P - 1) (each of P stages waits
    P - 1 microbatch slots of m + P - 1 as the pipeline fills and drains). 0 for one stage."""
    return (stages - 1) / (microbatches + stages - 1)


def live_microbatches(stages, microbatches, stage, schedule):
    """Microbatches whose activations stage `stage` (0 = first) holds at its peak: 1F1B min(P - s, m)
    (a stage runs P - s forwards before its first backward), GPipe all m (every forward before any
    backward)."""
    return microbatches if schedule == "gpipe" else min(stages - stage, microbatches)


def stage_blocks(blocks, stages, stage):
    """Blocks stage `stage` holds of `blocks` split into `stages` contiguous stages as evenly as they go,
    the first stages taking one more when they do not divide (the first stage holds the most microbatches
    under 1F1B: the conservative side)."""
    return blocks // stages + (1 if stage < blocks % stages else 0)


def parallel_layouts(world, gpus_per_node, heads=None, pieces=None, pipeline=None, tensor=None):
    """[(P, T, D)] with P x T x D = world: T divides gpus_per_node (a tensor group stays in one node, its
    ranks consecutive: tensor fastest, then data, then pipeline, as Megatron-LM numbers them) and is at
    most the heads (each rank needs one; T = 1 only without them); P at most `pieces` (the model's blocks,
    its embedding and head). A given `pipeline` or `tensor` is the only value taken (P = T = 1, plain data
    parallelism, always stays). Ordered by P x T, then T."""
    out = []
    for t in divisors(gpus_per_node):
        if world % t or (t > 1 and (heads is None or t > heads)) or (tensor is not None and t not in (1, tensor)):
            continue
        for p in divisors(world // t):
            if (pieces is not None and p > pieces) or (pipeline is not None and p not in (1, pipeline)):
                continue
            forced = (pipeline is None or p == pipeline) and (tensor is None or t == tensor)
            if forced or (p, t) == (1, 1):
                out.append((p, t, world // (p * t)))
    return sorted(out, key=lambda x: (x[0] * x[1], x[1]))


def tensor_share(heads, tensor):
    """The share of a block the busiest of `tensor` ranks holds and computes: its heads' share, ceil(H/T)/H,
    when T does not divide the H heads (Ember cuts them unevenly, the longer parts first: dist/tensor_parallel.h's
    even_part; Megatron-LM requires T | H), else 1/T. 1/T without heads."""
    if tensor <= 1:
        return 1.0
    if not heads:
        return 1.0 / tensor
    return -(-heads // tensor) / heads


def tensor_parallel_seconds(blocks, micro_batch, boundary_bytes_per_sample, tensor, bus_bytes_per_s,
                            hop_seconds):
    """A stage's tensor-parallel communication per microbatch: TENSOR_ALLREDUCES_PER_BLOCK all-reduces a
    block of its output (micro_batch x boundary bytes: B x S x C elements) over the `tensor` ranks of one
    node (collective_seconds: bytes at the link's bus bandwidth + NCCL's latency, `hop_seconds` a step).
    On the critical path: no overlap. 0 without tensor parallelism."""
    if tensor <= 1:
        return 0.0
    one = collective_seconds("all-reduce", micro_batch * boundary_bytes_per_sample, tensor, 1, bus_bytes_per_s,
                             hop_seconds, hop_seconds)
    return TENSOR_ALLREDUCES_PER_BLOCK * blocks * one
