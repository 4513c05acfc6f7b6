"""The plan per GPU and precision: memory models, the rows (fit, largest batch, time, cost),
data-parallel pay-off, feeding and the recommendation.
"""
import math
from dataclasses import dataclass

from .arithmetic import (allreduce_seconds, cost_usd, cpu_cores_per_gpu, epoch_seconds, host_ram_bytes, largest_batch,
    memory_budget, memory_needed, scaling_efficiency, step_seconds)
from .constants import (DP_WORTH_SECONDS, GIB, GPU_COUNTS, LOADER_HOST_BATCHES, NEAR_TIE, NETWORKS, PAYS_EFFICIENCY,
    PCIE_GB_S, PEAK_KEYS)
from .formats import fmt_bytes, fmt_cores, fmt_count, fmt_seconds, fmt_usd


# ---------------------------------------------------------------------------------------------------
# The plan

@dataclass
class Row:
    gpu: str
    precision: str
    memory_gib: float
    peak_tflops: float
    mfu: float
    memory_needed_bytes: float  # at the config's batch
    memory_budget_bytes: float
    fits: bool
    largest_batch: int
    step_seconds: float  # one optimizer step (accumulate micro-batches) on one GPU
    launch_bound: bool
    epoch_seconds: float
    samples_per_second: float
    usd_per_hour: float | None
    usd_per_epoch: float | None
    usd_per_run: float | None
    memory_source: str


def graph_pool_doubles(measurement):
    """True when per-sample bytes count twice: trainer.cuda_graph on, and the probes did not run a
    real CUDA graph (memory_includes_graph_pool false: measured on the CPU). A graph run holds one
    step's activations in the graph's private pool while the epoch's short last batch and the
    evaluation allocate beside it."""
    return measurement.get("cuda_graph") is True and measurement.get("memory_includes_graph_pool") is not True


def memory_model(measurement, precision):
    """(F, A, source) for a precision, falling back as docs/planning.md says; A x 2 when
    graph_pool_doubles."""
    fixed, per_sample, source = _measured_memory(measurement, precision)
    if graph_pool_doubles(measurement):
        per_sample *= 2
        source = ("" if source == "measured" else source + "; ") + "A x 2: the CUDA graph's pool"
    return fixed, per_sample, source


def _measured_memory(measurement, precision):
    key, source = memory_entry_key(measurement, precision)
    entry = measurement["memory"][key]
    return entry["fixed_bytes"], entry["per_sample_bytes"], source


def memory_entry_key(measurement, precision):
    """(key of measurement["memory"] that plans `precision`, how): its own, else the fallbacks of the
    docs/planning.md (tf32: fp32's; fp16-mixed: bf16-mixed's; else fp32's; else any)."""
    memory = measurement["memory"]
    if precision in memory:
        return precision, "measured"
    if precision == "tf32" and "fp32" in memory:
        return "fp32", "fp32's numbers (same storage)"
    if precision == "fp16-mixed" and "bf16-mixed" in memory:
        return "bf16-mixed", "bf16-mixed's numbers (not measured; same widths)"
    if "fp32" in memory:
        return "fp32", "fp32's numbers (not measured; usually an over-estimate for a mixed mode)"
    other = next(iter(memory))
    return other, f"{other}'s numbers (not measured)"


def device_resident_bytes(m):
    """Bytes on the device before the loop: parameters, buffers, a device-resident dataset."""
    data = m["dataset"]
    resident = m["parameter_bytes"] + m["buffer_bytes"]
    if data.get("device_resident") is True:
        resident += data["resident_bytes"]
    return resident


def board_has(gpu, precision):
    """Whether the board has the precision's math: no bf16 before Ampere (peak 0), and tf32 only with
    TF32 tensor cores (T4 and V100 run it as fp32)."""
    peak = float(gpu[PEAK_KEYS[precision]])
    return peak > 0 and not (precision == "tf32" and peak <= gpu["fp32_tflops"])


def plan_rows(m, gpus, prices, mfus, margin, context_bytes, floor_seconds, precisions):
    batch, accumulate = m["batch_size"], m["accumulate_grad_batches"]
    flops = m["train_flops_per_sample"]
    train_samples = m["dataset"]["train_samples"]
    resident = device_resident_bytes(m)
    rows = []
    for gpu in gpus:
        for precision in precisions:
            if not board_has(gpu, precision):
                continue
            peak_tflops = float(gpu[PEAK_KEYS[precision]])
            fixed, per_sample, source = memory_model(m, precision)
            budget = memory_budget(gpu["memory_gib"], margin)
            needed = memory_needed(batch, fixed, per_sample, resident, context_bytes)
            mfu = mfus[precision].value
            peak = peak_tflops * 1e12
            step, bound = step_seconds(batch, flops, peak, mfu, floor_seconds, accumulate)
            epoch = epoch_seconds(train_samples, batch, flops, peak, mfu, floor_seconds)
            price = prices.get(gpu["name"], gpu.get("usd_per_hour"))
            per_epoch = cost_usd(epoch, price)
            rows.append(Row(
                gpu=gpu["name"], precision=precision, memory_gib=float(gpu["memory_gib"]),
                peak_tflops=peak_tflops, mfu=mfu, memory_needed_bytes=needed, memory_budget_bytes=budget,
                fits=needed <= budget,
                largest_batch=largest_batch(budget, fixed, per_sample, resident, context_bytes),
                step_seconds=step, launch_bound=bound, epoch_seconds=epoch,
                samples_per_second=train_samples / epoch, usd_per_hour=price, usd_per_epoch=per_epoch,
                usd_per_run=None if per_epoch is None else per_epoch * m["epochs"], memory_source=source))
    return rows


def links_of(gpu):
    """[(name, GB/s per GPU per direction)] a data-parallel group of this GPU could use."""
    links = []
    if gpu["nvlink_gb_s"] > 0:
        links.append(("NVLink", float(gpu["nvlink_gb_s"])))
    gen = int(gpu["pcie_gen"])
    links.append((f"PCIe Gen{gen}", PCIE_GB_S[gen]))
    links.extend(NETWORKS)
    return links


def best_row_per_gpu(rows, config_precision):
    """Each GPU's fastest precision among rows that fit (ties: the preference order)."""
    best = {}
    for row in rows:
        if not row.fits:
            continue
        key = (row.epoch_seconds, _precision_rank(row.precision, config_precision))
        if row.gpu not in best or key < best[row.gpu][0]:
            best[row.gpu] = (key, row)
    return [r for _, r in best.values()]


def _precision_rank(precision, config_precision):
    """Tie-break: the config's own precision, then bf16 (no loss scaling), tf32, fp32, fp16."""
    order = [config_precision] + [p for p in ("bf16-mixed", "tf32", "fp32", "fp16-mixed") if p != config_precision]
    return order.index(precision) if precision in order else len(order)


def data_parallel(m, gpus, best_rows):
    by_name = {g["name"]: g for g in gpus}
    out = []
    for row in best_rows:
        links = []
        for name, gb_s in links_of(by_name[row.gpu]):
            counts = []
            for n in GPU_COUNTS:
                t_ar = allreduce_seconds(m["gradient_bytes"], n, gb_s * 1e9)
                eff = scaling_efficiency(row.step_seconds, t_ar)
                counts.append({"n": n, "allreduce_seconds": t_ar, "efficiency": eff, "speedup": n * eff,
                               "pays": eff >= PAYS_EFFICIENCY})
            links.append({"link": name, "gb_s": gb_s, "counts": counts})
        out.append({"gpu": row.gpu, "precision": row.precision, "step_seconds": row.step_seconds,
                    "links": links})
    return out


def largest_paying(link):
    paying = [c for c in link["counts"] if c["pays"]]
    return paying[-1] if paying else None


def feeding(m, rows, host_ram_gib, margin, gpus):
    data = m["dataset"]
    on_device = data.get("device_resident") is True
    staged = 0 if on_device else LOADER_HOST_BATCHES
    ram = host_ram_bytes(data["resident_bytes"], m["batch_size"], data["sample_bytes"], staged)
    fits = ram <= (1.0 - margin) * host_ram_gib * GIB
    fitting = [r for r in rows if r.fits]
    fastest = max(fitting, key=lambda r: (r.samples_per_second, r.peak_tflops)) if fitting else None
    out = {"host_ram_bytes": ram, "dataset_resident_bytes": data["resident_bytes"],
           "loader_bytes": ram - data["resident_bytes"], "host_ram_gib": host_ram_gib,
           "fits_in_host_ram": fits, "streams": data["resident_bytes"] <= 0 or not fits,
           "disk_bytes": data["disk_bytes"], "device_resident": on_device,
           "fastest": None}
    if fastest is not None:
        sps = fastest.samples_per_second
        samples = data["train_samples"] + data["eval_samples"]
        disk_per_sample = data["disk_bytes"] / samples if data["disk_bytes"] > 0 else None
        pcie = PCIE_GB_S[int(next(g for g in gpus if g["name"] == fastest.gpu)["pcie_gen"])]
        out["fastest"] = {"gpu": fastest.gpu, "precision": fastest.precision, "samples_per_second": sps,
                          "host_to_device_bytes_per_s": 0.0 if on_device else sps * data["sample_bytes"],
                          "pcie_gb_s": pcie,
                          "storage_bytes_per_s_if_streamed": None if disk_per_sample is None
                          else sps * disk_per_sample}
    return out


def add_cpu_cores(plan):
    """With the plan's "data_rate" (MEASURE.json's, from a recipe streaming data.shards): the CPU cores
    per GPU that decode the training samples as fast as each planned speed uses them (cpu_cores_per_gpu
    of its samples/s per GPU), added in place as "cpu_cores_per_gpu" to each row, feeding.fastest, each
    configuration row (train_samples / (world_size x epoch_seconds) samples/s per GPU) and each node
    count (weak scaling: samples_per_second / gpus); the recommendation gets a reason. Without
    data_rate nothing changes."""
    rate = plan.get("data_rate")
    if rate is None:
        return
    per_core = rate["images_per_core_second"]
    train_samples = plan["measurement"]["train_samples"]
    for r in plan["rows"]:
        r["cpu_cores_per_gpu"] = cpu_cores_per_gpu(r["samples_per_second"], per_core)
    fastest = plan["feeding"]["fastest"]
    if fastest is not None:
        fastest["cpu_cores_per_gpu"] = cpu_cores_per_gpu(fastest["samples_per_second"], per_core)
    for r in plan["configurations"]["rows"]:
        r["cpu_cores_per_gpu"] = cpu_cores_per_gpu(train_samples / (r["world_size"] * r["epoch_seconds"]), per_core)
    for c in plan["nodes"].get("counts") or []:
        c["cpu_cores_per_gpu"] = cpu_cores_per_gpu(c["samples_per_second"] / c["gpus"], per_core)
    rec, cfg = plan["recommendation"], plan["configurations"]
    key = (rec.get("gpu"), rec.get("precision"), rec.get("sharding"), rec.get("activation_checkpoint"))
    picked = next((r for r in cfg["rows"] if cfg["shown"] and r["world_size"] == rec.get("world_size") and r["fits"]
                   and (r["gpu"], r["precision"], r["sharding"], r["activation_checkpoint"]) == key), None)
    picked = picked or next((r for r in plan["rows"] if r["fits"] and (r["gpu"], r["precision"]) == key[:2]), None)
    if picked is not None and rec.get("layout") is None:  # a pipeline/tensor layout's speed: not a row's
        sps = picked["cpu_cores_per_gpu"] * per_core
        rec["reasons"].append(f"feeding it takes {fmt_cores(picked['cpu_cores_per_gpu'])} CPU cores per GPU "
                              f"({fmt_count(sps)} samples/s a GPU; one core decodes {per_core:,.1f})")


def recommend(m, rows, dp, config_precision):
    """{"gpu", "precision", "text", "reasons"}: the rule of docs/planning.md's "recommendation"."""
    batch = m["batch_size"]
    fitting = [r for r in rows if r.fits]
    reasons = []

    def run_seconds(r):
        return r.epoch_seconds * m["epochs"]

    def rank(r):
        return _precision_rank(r.precision, config_precision)

    if not fitting:
        best = max(rows, key=lambda r: (r.largest_batch, -r.memory_gib), default=None)
        if best is None or best.largest_batch == 0:
            need = m["parameter_bytes"] + m["buffer_bytes"] + m["gradient_bytes"] + m["optimizer_state_bytes"]
            text = (f"no GPU in the table fits even one sample: parameters, gradients and optimizer state "
                    f"alone take {fmt_bytes(need)}; shard them over several GPUs (plan it with --world-size N: "
                    f"dist.sharding, ZeRO), or a smaller model or optimizer")
            return {"gpu": None, "precision": None, "world_size": 1, "sharding": None,
                    "activation_checkpoint": None, "text": text, "reasons": []}
        micro = best.largest_batch
        accumulate = math.ceil(batch * m["accumulate_grad_batches"] / micro)
        micro = math.ceil(batch * m["accumulate_grad_batches"] / accumulate)
        text = (f"{best.gpu} {best.precision} with batch {micro} x {accumulate} accumulation: batch {batch} "
                f"fits no GPU; the largest batch is {best.largest_batch} there")
        reasons.append(f"set the batch size to {micro} and trainer.accumulate_grad_batches={accumulate} "
                       f"(same effective batch)")
        return {"gpu": best.gpu, "precision": best.precision, "world_size": 1, "sharding": "none",
                "activation_checkpoint": "none", "text": text, "reasons": reasons}
    priced = [r for r in fitting if r.usd_per_run is not None]
    if priced:
        pick = min(priced, key=lambda r: (r.usd_per_run, r.epoch_seconds, rank(r)))
        reasons.append(f"cheapest per run ({fmt_usd(pick.usd_per_run)}, {fmt_seconds(run_seconds(pick))}) "
                       f"of {len(priced)} priced rows where batch {batch} fits")
    else:
        fastest = min(r.epoch_seconds for r in fitting)
        near = [r for r in fitting if r.epoch_seconds <= fastest * (1 + NEAR_TIE)]
        top_peak = {}  # a GPU's highest peak over its precisions: how big (and dear) the board is
        for r in rows:
            top_peak[r.gpu] = max(top_peak.get(r.gpu, 0.0), r.peak_tflops)
        pick = min(near, key=lambda r: (top_peak[r.gpu], r.memory_gib, r.epoch_seconds, rank(r)))
        reasons.append(f"fastest ({fmt_seconds(pick.epoch_seconds)}/epoch, {fmt_seconds(run_seconds(pick))}"
                       f"/run) where batch {batch} fits; no prices given (--price GPU=USD_PER_HOUR)")
        if len(near) > 1:
            reasons.append(f"{len(near)} rows are within {NEAR_TIE:.0%} of the fastest: this is the smallest "
                           f"GPU of them")
    if pick.precision != config_precision:
        reasons.append(f"the config uses {config_precision}: run with trainer.precision={pick.precision}")
    if pick.launch_bound:
        reasons.append(f"launch-bound: a batch of {batch} holds less math than the "
                       f"{fmt_seconds(pick.step_seconds / m['accumulate_grad_batches'])} step floor, so the real "
                       f"MFU will be far below {pick.mfu:.2f} and a bigger GPU is no faster; a larger batch "
                       f"(up to {pick.largest_batch:,} fits) would use it better")
    gpus_used, via = 1, ""
    entry = next((e for e in dp if e["gpu"] == pick.gpu and e["precision"] == pick.precision), None)
    if entry is not None:
        # The most GPUs that pay; at that count the first link in links_of's order (in-node first).
        options = [(largest_paying(link), -i, link) for i, link in enumerate(entry["links"])]
        options = [(c, i, link) for c, i, link in options if c is not None]
        if not options:
            first = entry["links"][0]
            reasons.append(f"data-parallel does not pay (efficiency {first['counts'][0]['efficiency']:.2f} "
                           f"at 2 GPUs over {first['link']})")
        else:
            c, _, link = max(options, key=lambda t: (t[0]["n"], t[1]))
            scaling = (f"up to {c['n']} GPUs over {link['link']} (efficiency {c['efficiency']:.2f}: "
                       f"{c['speedup']:.1f}x faster, {1 / c['efficiency'] - 1:.0%} dearer per run)")
            buckets = 0.0 if m.get("gradient_as_bucket_view") is True else m["gradient_bytes"]
            if run_seconds(pick) >= DP_WORTH_SECONDS and pick.memory_needed_bytes + buckets > pick.memory_budget_bytes:
                reasons.append(f"data-parallel would pay {scaling}, but DDP's buckets (a copy of the gradients, "
                               f"{fmt_bytes(buckets)}) do not fit beside batch {batch}: plan sharding with "
                               f"--world-size {c['n']}")
            elif run_seconds(pick) >= DP_WORTH_SECONDS:
                gpus_used, via = c["n"], f" over {link['link']}"
                reasons.append(f"data-parallel pays {scaling}")
            else:
                reasons.append(f"one GPU: a run takes {fmt_seconds(run_seconds(pick))}; data-parallel "
                               f"would pay {scaling} but saves little")
    text = f"{pick.gpu}, {pick.precision}, {gpus_used} GPU{'s' if gpus_used > 1 else ''}{via}, batch {batch}"
    return {"gpu": pick.gpu, "precision": pick.precision, "world_size": gpus_used, "sharding": "none",
            "activation_checkpoint": "none", "text": text, "reasons": reasons}
