"""The plan as text: the rows, the configurations and the nodes sections (render, --json aside).
"""

from .constants import COLLECTIVE_OF, GIB, GPU_COUNTS, PAYS_EFFICIENCY, TENSOR_ALLREDUCES_PER_BLOCK, ZERO_NAMES
from .formats import fmt_bytes, fmt_cores, fmt_count, fmt_rate, fmt_seconds, fmt_si, fmt_usd, table
from .nodes import _nodes_word
from .rows import largest_paying


def render(plan):
    ms, a = plan["measurement"], plan["assumptions"]
    out = []
    out.append(f"plan: {ms['recipe']}, measured on {ms.get('device_name') or ms['device']}  [{ms['path']}]")
    macs = ms.get("forward_macs_per_sample")
    out.append(f"  model      {fmt_count(ms['parameters'])} parameters ({fmt_bytes(ms['parameter_bytes'])}), "
               + (f"{fmt_si(macs)} MACs forward, " if macs else "")
               + f"{fmt_si(ms['train_flops_per_sample'])} FLOPs to train, per sample")
    out.append(f"  config     batch {ms['batch_size']} x {ms['accumulate_grad_batches']} accumulation, "
               f"{ms['epochs']} epochs, {ms['precision']}, {ms.get('optimizer') or '?'}; "
               f"{fmt_count(ms['train_samples'])} samples = {fmt_count(ms['steps_per_epoch'])} steps/epoch")
    if ms.get("samples_per_second"):
        sps = ms["samples_per_second"]
        out.append(f"  here       {fmt_count(sps)} samples/s on {ms['device']} = "
                   f"{fmt_seconds(ms['train_samples'] / sps)}/epoch")
    out.append(f"  memory     peak(b) = F + b*A ({ms.get('memory_method') or 'method not stated'}):")
    for p, mm in plan["memory_models"].items():
        source = "" if mm["source"] == "measured" else mm["source"]
        out.append(f"               {p:<11} F {fmt_bytes(mm['fixed_bytes']):>9}  "
                   f"A {fmt_bytes(mm['per_sample_bytes']):>9}/sample  {source}".rstrip())
    v = ms.get("verify")
    if v and all(isinstance(v.get(k), (int, float))
                 for k in ("batch", "predicted_peak_bytes", "measured_peak_bytes")):
        off = (v["predicted_peak_bytes"] - v["measured_peak_bytes"]) / max(v["measured_peak_bytes"], 1)
        out.append(f"             checked at batch {v['batch']} ({v.get('precision', '?')}): F + b*A = "
                   f"{fmt_bytes(v['predicted_peak_bytes'])}, measured {fmt_bytes(v['measured_peak_bytes'])} "
                   f"({off:+.1%})")
    out.append(f"             fits when {a['context_bytes'] / GIB:g} GiB CUDA context + parameters and buffers "
               f"+ F + b*A <= {1 - a['margin']:.0%} of the GPU's memory")
    texts = {}
    for p, mfu in plan["mfu"].items():
        texts.setdefault((mfu["value"], mfu["text"]), []).append(p)
    parts = [f"{v:.3g} for {', '.join(ps) if len(ps) < len(plan['mfu']) else 'every precision'} ({t})"
             for (v, t), ps in texts.items()]
    out.append("  MFU        " + "; ".join(parts))
    out.append(f"  step floor {a['step_floor_seconds'] * 1e3:.3g} ms per batch ({a['step_floor']})")

    out.append("")
    out.append(f"GPUs at batch {ms['batch_size']} per GPU (per-step and epoch times at the MFU above; "
               f"* = launch-bound)")
    priced = any(r["usd_per_hour"] is not None for r in plan["rows"])
    fed = "data_rate" in plan  # a recipe streaming shards: the CPU cores each GPU needs (cores/GPU)
    headers = ["GPU", "GiB", "precision", "fits", "max batch", "TFLOP/s", "step", "epoch"]
    headers += ["cores/GPU"] if fed else []
    headers += ["$/h", "$/epoch", "$/run"] if priced else []
    body, last = [], None
    for r in plan["rows"]:
        timing = r["fits"]  # times and costs of a batch that does not fit would mislead
        cells = [r["precision"], "yes" if r["fits"] else "no",
                 fmt_count(r["largest_batch"]) if r["largest_batch"] else "none", f"{r['peak_tflops']:g}",
                 (fmt_seconds(r["step_seconds"]) + ("*" if r["launch_bound"] else "")) if timing else "-",
                 fmt_seconds(r["epoch_seconds"]) if timing else "-"]
        if fed:
            cells.append(fmt_cores(r["cpu_cores_per_gpu"]) if timing else "-")
        if priced:
            cells += [fmt_usd(r["usd_per_hour"]), fmt_usd(r["usd_per_epoch"]) if timing else "-",
                      fmt_usd(r["usd_per_run"]) if timing else "-"]
        if (r["gpu"] == last and r["precision"] == "fp16-mixed" and body[-1][2] == "bf16-mixed"
                and body[-1][3:] == cells[1:]):
            body[-1][2] = "bf16/fp16-mixed"  # the same numbers: one line
            continue
        body.append([r["gpu"] if r["gpu"] != last else "", f"{r['memory_gib']:g}" if r["gpu"] != last else ""]
                    + cells)
        last = r["gpu"]
    out.append(table(headers, body, right={"GiB", "max batch", "TFLOP/s", "step", "epoch", "cores/GPU", "$/h",
                                           "$/epoch", "$/run"}))
    if not priced:
        out.append("(no prices: --price GPU=USD_PER_HOUR adds cost per epoch and per run)")

    f = plan["feeding"]
    out.append("")
    out.append("Feeding")
    ram = (f"{fmt_bytes(f['dataset_resident_bytes'])} dataset + {fmt_bytes(f['loader_bytes'])} loader staging "
           f"= {fmt_bytes(f['host_ram_bytes'])}")
    if f["streams"]:
        where = ("the recipe streams from storage" if f["dataset_resident_bytes"] <= 0
                 else f"more than {f['host_ram_gib']:g} GiB (--host-ram-gib): it must stream from storage")
        out.append(f"  host RAM   {ram}; {where}")
    else:
        read = fmt_bytes(f["disk_bytes"]) if f["disk_bytes"] > 0 else "its files"
        out.append(f"  host RAM   {ram}:\n             fits in {f['host_ram_gib']:g} GiB (--host-ram-gib), "
                   f"read from storage once ({read} at start)"
                   + ("; the dataset then lives in GPU memory" if f["device_resident"] else ""))
    if f["fastest"]:
        x = f["fastest"]
        h2d = ("dataset on the GPU: no copies" if f["device_resident"]
               else f"{fmt_rate(x['host_to_device_bytes_per_s'])} host-to-device (PCIe: {x['pcie_gb_s']:g} GB/s)")
        storage = ("storage rate unknown (disk_bytes 0)" if x["storage_bytes_per_s_if_streamed"] is None
                   else f"storage {fmt_rate(x['storage_bytes_per_s_if_streamed'])}"
                   + ("" if f["streams"] else " if it had to stream"))
        out.append(f"  fastest    {x['gpu']} {x['precision']}: {fmt_count(x['samples_per_second'])} samples/s "
                   f"need\n             {h2d}; {storage}")
    if fed:
        out.extend(render_cpu_cores(plan))

    dp = plan["data_parallel"]
    if dp["gpus"]:
        out.append("")
        out.append(f"Data-parallel: {fmt_bytes(dp['gradient_bytes'])} of gradients all-reduced per step, at "
                   f"each GPU's fastest precision")
        out.append(f"  {dp['rule']}")
        out.append("  cells: the most GPUs (of 2/4/8) that pay, with their efficiency; no = not even 2")
        names = ["NVLink", "PCIe", "25 GbE", "100 GbE", "400G IB"]
        body = []
        for entry in dp["gpus"]:
            cells = {("PCIe" if link["link"].startswith("PCIe") else link["link"]): link for link in entry["links"]}
            row = [entry["gpu"], entry["precision"], fmt_seconds(entry["step_seconds"])]
            for name in names:
                link = cells.get(name)
                if link is None:
                    row.append("-")
                    continue
                best = largest_paying(link)
                row.append(f"{best['n']}: {best['efficiency']:.2f}" if best
                           else f"no: {link['counts'][0]['efficiency']:.2f}")
            body.append(row)
        out.append(table(["GPU", "precision", "step"] + names, body, right={"step"} | set(names)))
        rec = plan["recommendation"]
        detail = next((e for e in dp["gpus"] if (e["gpu"], e["precision"]) == (rec["gpu"], rec["precision"])),
                      None)
        if detail:
            out.append(f"  {detail['gpu']} {detail['precision']} in detail: efficiency (speed-up) at n GPUs")
            body = [[link["link"], f"{link['gb_s']:g}"]
                    + [f"{c['efficiency']:.2f} ({c['speedup']:.1f}x)" for c in link["counts"]]
                    for link in detail["links"]]
            out.append("\n".join("  " + line for line in table(
                ["link", "GB/s"] + [f"n={n}" for n in GPU_COUNTS], body,
                right={"GB/s"} | {f"n={n}" for n in GPU_COUNTS}).split("\n")))

    cfg = plan["configurations"]
    if cfg["shown"]:
        out.append("")
        out.extend(render_configurations(plan))
    elif cfg["world_size"] == 1:
        out.append("")
        out.append("(sharding: --world-size N plans dist.sharding at N GPUs; activation checkpointing needs a "
                   "model with blocks: see 'configurations' in tools/ember plan --help)")

    if plan["nodes"]["shown"]:
        out.append("")
        out.extend(render_nodes(plan))

    if plan["layouts"]["shown"]:
        out.append("")
        out.extend(render_layouts(plan))

    for note in plan["notes"]:
        out.append(f"note: {note}")
    rec = plan["recommendation"]
    out.append("")
    out.append(f"Recommendation: {rec['text']}" + (f": {'; '.join(rec['reasons'])}" if rec["reasons"] else ""))
    return "\n".join(out)


def render_cpu_cores(plan):
    """The feeding section's CPU line: what one core decodes (measured) and the cores the fastest GPU needs."""
    rate, x = plan["data_rate"], plan["feeding"]["fastest"]
    per_core = rate["images_per_core_second"]
    measured = (f"measured: {fmt_count(rate['samples'])} samples in {rate['seconds']:.1f} s" if rate.get("samples")
                and rate.get("seconds") else "measured")
    out = [f"  CPU cores  one core decodes {per_core:,.1f} samples/s ({measured}, one decoder thread)"]
    if x:
        out[0] += ":"
        out.append(f"             {x['gpu']} {x['precision']} needs {fmt_cores(x['cpu_cores_per_gpu'])} cores per GPU "
                   f"({fmt_count(x['samples_per_second'])} / {per_core:,.1f} = {x['cpu_cores_per_gpu']:.1f}; cores/GPU "
                   f"above);\n             tools/ember doctor --plan compares a node's cores per GPU")
    return out


def render_configurations(plan):
    """The text of the sharding and checkpointing section: the state per GPU of each stage, the
    activations per mode, and one row per GPU x stage x mode."""
    ms, cfg = plan["measurement"], plan["configurations"]
    n, out = cfg["world_size"], []
    out.append(f"Sharding and activation checkpointing at {n} GPU{'s' if n > 1 else ''}, batch {ms['batch_size']} "
               f"per GPU (dist.sharding, model.activation_checkpoint_every)")
    if n > 1:
        micro = ms["accumulate_grad_batches"]
        out.append(f"  model state per GPU, and what each GPU sends per optimizer step of {micro} micro-batch"
                   f"{'es' if micro > 1 else ''} (P: trainable parameters, G: their gradients, P blocks / P rest: "
                   f"those inside / outside the model's blocks; /micro: every micro-batch):")
        body, hows, missing = [], {}, []
        for s, st in cfg["state"].items():
            if not st["available"]:
                missing.append(f"    {s} ({ZERO_NAMES[s]}): not planned: {st['why']}")
                continue
            ops = {}
            for c in st["communication"]["collectives"]:
                what = f"{c['op']} {COLLECTIVE_OF[c['of']]}" + (" /micro" if c["per"] == "micro-batch" else "")
                ops[what] = ops.get(what, 0) + 1
            sent = " + ".join((f"{k} x{v}" if v > 1 else k) for k, v in ops.items())
            body.append([f"{s} ({ZERO_NAMES[s]})", fmt_bytes(st["parameters"]), fmt_bytes(st["gradients"]),
                         fmt_bytes(st["optimizer_state"]), fmt_bytes(st["gathered_parameters"]),
                         fmt_bytes(st["communication_buffers"]),
                         fmt_bytes(st["communication"]["bytes_per_step"]), sent])
            for k, v in st["how"].items():
                hows.setdefault((k.replace("_", " "), v), []).append(s)
        heads = ["sharding", "parameters", "gradients", "optimizer", "gathered", "comm buffers", "sent/step",
                 "collectives"]
        out.extend("  " + line for line in table(heads, body, right=set(heads[1:7])).split("\n"))
        out.extend(f"    {k} ({', '.join(stages)}): {v}" for (k, v), stages in hows.items())
        out.extend(missing)
    out.append("  activations per sample (A), by checkpointing mode:")
    for precision, acts in cfg["activations"].items():
        missing = {}
        for mode, a in acts.items():
            if mode in cfg["activation_checkpoints"] and not a["available"]:
                missing.setdefault(a["why"], []).append(mode)
        for mode, a in acts.items():
            if mode not in cfg["activation_checkpoints"]:
                continue
            if not a["available"]:
                if mode == missing.get(a["why"], [mode])[0]:
                    out.append(f"    {precision:<11} {', '.join(missing[a['why']])}: not planned: {a['why']}")
                continue
            extra = "" if mode == "none" else f"; recomputation: {a['recompute']}"
            out.append(f"    {precision:<11} {mode:<6} A {fmt_bytes(a['per_sample_bytes']):>9}  {a['source']}{extra}")
    priced = any(r["usd_per_hour"] is not None for r in cfg["rows"])
    rec = plan["recommendation"]
    heads = ["GPU", "GiB", "precision", "sharding", "checkpoint", "memory", "fits", "max batch"]
    fed = "data_rate" in plan
    heads += (["link", "comm"] if n > 1 else []) + ["step", "epoch"] + (["cores/GPU"] if fed else [])
    heads += (["$/run"] if priced else []) + [""]
    body, last = [], None
    for r in cfg["rows"]:
        timing = r["fits"]
        picked = (rec.get("world_size") == n and (r["gpu"], r["precision"], r["sharding"], r["activation_checkpoint"])
                  == (rec.get("gpu"), rec.get("precision"), rec.get("sharding"), rec.get("activation_checkpoint")))
        cells = [r["gpu"] if r["gpu"] != last else "", f"{r['memory_gib']:g}" if r["gpu"] != last else "",
                 r["precision"], r["sharding"], r["activation_checkpoint"], fmt_bytes(r["memory_needed_bytes"]),
                 "yes" if r["fits"] else "no", fmt_count(r["largest_batch"]) if r["largest_batch"] else "none"]
        if n > 1:
            cells += [r["link"], fmt_seconds(r["communication_seconds"])]
        cells += [(fmt_seconds(r["step_seconds"]) + ("*" if r["launch_bound"] else "")) if timing else "-",
                  fmt_seconds(r["epoch_seconds"]) if timing else "-"]
        if fed:
            cells.append(fmt_cores(r["cpu_cores_per_gpu"]) if timing else "-")
        if priced:
            cells.append(fmt_usd(r["usd_per_run"]) if timing else "-")
        cells.append("<- recommended" if picked else "")
        body.append(cells)
        last = r["gpu"]
    out.append(f"  per GPU: memory at batch {ms['batch_size']} (fits: within {1 - plan['assumptions']['margin']:.0%} "
               f"of its GiB), the largest batch"
               + (", communication per optimizer step on the link (no overlap with compute)" if n > 1 else "")
               + ", step and epoch with recomputation" + (f", $/run on all {n} GPUs" if priced and n > 1 else ""))
    out.extend("  " + line for line in table(
        heads, body, right={"GiB", "memory", "max batch", "comm", "step", "epoch", "cores/GPU", "$/run"}).split("\n"))
    return out


def render_nodes(plan):
    """The text of the nodes section: the links, the model in one line, the table at the same per-GPU batch
    and at the same global batch, and the verdict."""
    nd, a = plan["nodes"], plan["assumptions"]
    g = nd["gpus_per_node"]
    gpus = f"{g} GPU{'s' if g > 1 else ''}"
    out = [f"Nodes: 1 to {nd['nodes']} nodes of {gpus} (--nodes, --gpus-per-node)"]
    if not nd["available"]:
        out.append(f"  {nd['why']}")
        return out
    micro = nd["accumulate_grad_batches"]
    out[0] += (f": {nd['gpu']} {nd['precision']}, sharding {nd['sharding']} ({ZERO_NAMES[nd['sharding']]}), "
               f"activation checkpointing {nd['activation_checkpoint']}, batch {nd['batch']}"
               + (f" x {micro} accumulation" if micro > 1 else "") + " per GPU (the recommended configuration)")
    intra, net = nd["links"]["intra"], nd["links"]["network"]
    inside = (f"{intra['link']} inside a node ({intra['gb_s']:g} GB/s per GPU per direction)" if g > 1
              else "one GPU a node")
    out.append(f"  links: {inside}; {net['link']} between nodes ({net['gb_s']:g} GB/s per node: --inter-link x "
               f"--nics-per-node {nd['nics_per_node']})")
    lat = a["nccl_latency_us"]
    out.append(f"  ring over n = nodes x {g} GPU{'s' if g > 1 else ''}: t = bytes x share x (n-1)/n / busbw + per "
               f"collective {lat['base']:g} us + {lat['nvlink_hop']:g} us (NVLink; PCIe {lat['pcie_hop']:g}) a step in "
               f"a node, {lat['network_hop']:g} us a step across")
    out.append(f"  busbw = min(intra link, NICs x NIC); the gradients' reduction overlaps backward ("
               f"{a['backward_share']:.2g} of the math), all-gathers do not (plan --help: \"Nodes\")")
    fed = "data_rate" in plan
    heads = ["nodes", "GPUs", "bound by", "busbw", "memory", "fits", "comm", "exposed", "step", "samples/s"]
    heads += (["cores/GPU"] if fed else []) + ["speed-up", "efficiency"]
    body = []
    for c in nd["counts"]:
        timing = c["speedup"] is not None  # times of a count that cannot hold the configuration would mislead
        body.append([str(c["nodes"]), str(c["gpus"]), c["link"] or "-",
                     f"{c['bus_gb_s']:g} GB/s" if c["bus_gb_s"] else "-", fmt_bytes(c["memory_needed_bytes"]),
                     "yes" if c["fits"] else "no", fmt_seconds(c["communication_seconds"]) if timing else "-",
                     fmt_seconds(c["exposed_seconds"]) if timing else "-",
                     fmt_seconds(c["step_seconds"]) if timing else "-",
                     fmt_count(c["samples_per_second"]) if timing else "-"]
                    + ([fmt_cores(c["cpu_cores_per_gpu"]) if timing else "-"] if fed else [])
                    + [f"{c['speedup']:.2f}x" if timing else "-", f"{c['efficiency']:.2f}" if timing else "-"])
    out.append(f"  the same batch per GPU (weak scaling), per optimizer step; speed-up and efficiency against the "
               f"fewest nodes that hold it; pays at efficiency >= {PAYS_EFFICIENCY}:")
    out.extend("  " + line for line in table(heads, body, right=set(heads[3:4] + heads[6:])).split("\n"))
    strong = [c for c in nd["counts"] if c["strong"] is not None]
    if len(strong) > 1:
        heads = ["nodes", "GPUs", "batch/GPU", "comm", "exposed", "step", "speed-up", "efficiency"]
        body = [[str(c["nodes"]), str(c["gpus"]), f"{c['strong']['batch']}"
                 + (f" x {c['strong']['accumulate_grad_batches']}" if c["strong"]["accumulate_grad_batches"] > 1
                    else ""),
                 fmt_seconds(c["strong"]["communication_seconds"]), fmt_seconds(c["strong"]["exposed_seconds"]),
                 fmt_seconds(c["strong"]["step_seconds"]), f"{c['strong']['speedup']:.2f}x",
                 f"{c['strong']['efficiency']:.2f}"] for c in strong]
        out.append(f"  the same global batch ({nd['global_batch']:,} samples a step; weak scaling's "
                   f"{_nodes_word(strong[0]['nodes'])}), split over more GPUs (strong scaling):")
        out.extend("  " + line for line in table(heads, body, right=set(heads[2:])).split("\n"))
    out.append(f"  Verdict: {nd['verdict']['text']}")
    if nd["verdict"]["strong_text"]:
        out.append(f"  Fixed global batch: {nd['verdict']['strong_text']}")
    return out


def render_layouts(plan):
    """The text of the layouts section: the model's shape and how it is known, the rules in three lines, one
    row per layout, and the verdict."""
    ly = plan["layouts"]
    shape, n, g = ly["model"], ly["world_size"], ly["gpus_per_node"]
    src = shape["sources"]
    where = f"{ly['nodes']} node{'s' if ly['nodes'] > 1 else ''} of {g}"
    out = [f"Layouts: pipeline P x tensor T x data D = {n} GPUs ({where}), {ly['gpu']} {ly['precision']}, the same "
           f"{fmt_count(ly['global_batch'])} samples a step for each (estimates from arithmetic, not measurements)"]
    heads = f"{shape['heads']} heads" if shape["heads"] is not None else "heads not given (--heads): T = 1 only"
    out.append(f"  model: {shape['blocks']} blocks ({shape['pieces']} pieces to put in stages), {heads}, width "
               f"{shape['width']}" + ("" if src["width"] == "--width" else " (estimated: --width)")
               + f", {fmt_count(shape['seq_len'])} tokens a sample" + ("" if src["seq_len"] == "--seq-len"
                                                                     else " (estimated: --seq-len)")
               + f": {fmt_bytes(shape['boundary_bytes_per_sample'])} a sample between blocks "
                 f"({shape['element_bytes']}-byte activations); {src['activations']}")
    out.append("  ranks tensor fastest, then data, then pipeline (Megatron-LM): a tensor group shares a node "
               "(T divides its GPUs, at most the heads: ceil(H/T) of H heads on the busiest rank); stages split "
               "the blocks evenly, the embedding and head on the end stages")
    live = "min(P - s, m)" if ly["schedule"] == "1f1b" else "all m"
    out.append(f"  memory: the busiest rank's (stage s): its blocks (+ the embedding/head at an end) / T of the "
               f"parameters, gradients, optimizer state (ZeRO-1: that / D) and F; + {live} microbatches' "
               f"activations of its blocks / T ({ly['schedule'].upper() if ly['schedule'] == 'gpipe' else '1F1B'}; "
               f"sequence parallelism: all of a block's split T ways)")
    out.append(f"  step: (m + P - 1) slots x (the busiest stage's share of a microbatch's math / T at the MFU (1/(P T) "
               f"when P divides the blocks) + {TENSOR_ALLREDUCES_PER_BLOCK} tensor all-reduces of B x S x C a block + "
               f"a send each way between stages of its 1/T) + the data group's exposed reduction; bubble "
               f"(P - 1)/(m + P - 1)")
    heads_row = ["P", "T", "D", "sharding", "microbatches", "memory", "fits", "bubble", "tensor", "sends",
                 "data exposed", "step", "samples/s", ""]
    body = []
    rec = ly["verdict"]["recommended"]
    for i, r in enumerate(ly["rows"]):
        sharding = r["sharding"] + ("" if r["activation_checkpoint"] == "none" else f" +{r['activation_checkpoint']}")
        body.append([str(r["pipeline"]), str(r["tensor"]), str(r["data"]), sharding,
                     f"{r['microbatches']} x {r['micro_batch']}", fmt_bytes(r["memory_needed_bytes"]),
                     "yes" if r["fits"] else "no", f"{r['bubble']:.1%}" if r["pipeline"] > 1 else "-",
                     fmt_seconds(r["tensor_seconds"]) if r["tensor"] > 1 else "-",
                     fmt_seconds(r["pipeline_seconds"]) if r["pipeline"] > 1 else "-",
                     fmt_seconds(r["exposed_seconds"]) if r["data"] > 1 else "-",
                     (fmt_seconds(r["step_seconds"]) + ("*" if r["launch_bound"] else "")) if r["fits"] else "-",
                     (fmt_count(r["samples_per_second"]) if r["samples_per_second"] >= 100
                      else f"{r['samples_per_second']:.3g}") if r["fits"] else "-",
                     "<- recommended" if i == rec else ""])
    usable = 1 - plan["assumptions"]["margin"]
    out.append(f"  per layout its fastest sharding and microbatches (m x samples) that fit, else its least memory; "
               f"fits: within {usable:.0%} of {fmt_bytes(ly['memory_budget_bytes'] / usable)}; P = T = 1 is section "
               f"4's configuration:")
    out.extend("  " + line for line in table(heads_row, body, right=set(heads_row[:3]) | set(heads_row[5:13]))
               .split("\n"))
    for x in ly["excluded"]:
        out.append(f"  P {x['pipeline']} x T {x['tensor']} x D {x['data']}: not planned: {x['why']}")
    for note in ly.get("notes") or []:
        out.append(f"  ({note})")
    out.append(f"  Layout: {ly['verdict']['text']}")
    return out
