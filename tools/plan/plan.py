#!/usr/bin/env python3
"""Which GPU to rent for a recipe: memory fit, time and cost per epoch, feeding, data-parallel,
sharding and activation checkpointing.

    tools/ember plan RECIPE [key=value ...] [--price GPU=USD ...]   (measures here, then runs this)
    python3 tools/plan/plan.py MEASURE.json [--gpus tools/plan/gpus.toml] [--price GPU=USD_PER_HOUR ...]
                          [--margin 0.10] [--mfu X] [--runs-dir runs] [--context-gib 0.5]
                          [--step-floor-ms 1] [--launch-us 5] [--graph-launch-us 10] [--kernel-us 2]
                          [--host-ram-gib 16] [--gpu NAME ...]
                          [--precision P ...] [--world-size N] [--sharding S ...]
                          [--activation-checkpoint M ...] [--link L] [--nodes N] [--gpus-per-node G]
                          [--intra-link L] [--inter-link L] [--nics-per-node K] [--pipeline P] [--tensor T]
                          [--microbatches M] [--schedule 1f1b|gpipe] [--heads H] [--width C] [--seq-len S]
                          [--json] [--check]
    python3 tools/plan/plan.py m.json --price L4=0.80 --price H100=2.99 --gpu L4 --gpu H100-SXM
    python3 tools/plan/plan.py m.json --world-size 8 --sharding all --activation-checkpoint all
    python3 tools/plan/plan.py m.json --nodes 4 --gpus-per-node 8 --inter-link ib-ndr --nics-per-node 8
    python3 tools/plan/plan.py m.json --nodes 4 --heads 64 --width 8192 --seq-len 4096 [--pipeline 4 --tensor 8]

--price takes a table name (H100-SXM) or a family (H100: every H100 row); an
exact name wins over its family. --gpu and --precision narrow the rows shown.

The arithmetic half of `tools/ember plan`: MEASURE.json comes from a recipe's
`RECIPE --measure OUT.json [key=value ...]`, which measures the model and its
memory on the machine at hand (no GPU needed); this script scales that to every
GPU of the table (tools/plan/gpus.toml, editable) and prints:

  1. per GPU and precision (fp32, tf32, bf16-mixed, fp16-mixed; bf16 and tf32
     only where the board has them): whether the config's batch fits, the
     largest batch that fits, time per step and per epoch, cost per epoch and
     per run (at --price or the table's usd_per_hour);
  2. feeding: host RAM the dataset and loader need, host-to-device and storage
     read rates at the fastest GPU's samples/s; for a recipe streaming shards
     (MEASURE.json's data_rate: samples one CPU core decodes a second) the CPU
     cores each GPU needs at its samples/s, also a cores/GPU column of 1, 4, 5;
  3. data-parallel on 2/4/8 GPUs over NVLink, PCIe and networks;
  4. sharding and activation checkpointing (shown at --world-size N > 1, or
     when the measurement allows checkpointing): per GPU, for each dist.sharding
     stage (--sharding: none, optimizer, gradients, parameters; all by default)
     and checkpointing mode (--activation-checkpoint: none, full, light), the
     memory at the config's batch and its parts, the largest batch, the bytes
     each GPU sends per optimizer step and their time on the link (--link), the
     step and epoch with recomputation, the cost of a run on N GPUs;
  5. nodes (shown with more than one node: --nodes N, or --world-size past a
     node of 8): the recommended configuration of section 4 on 1, 2, 4, ...
     N nodes, its communication with latency and overlap, samples/s at the same
     per-GPU batch and at the same global batch, and whether a second node pays
     or costs more than it saves;
  6. layouts (shown at --world-size N > 1 for a model with blocks): pipeline P x
     tensor T x data D = N (ranks tensor fastest, then data, then pipeline, as
     Megatron-LM numbers them; T divides a node's GPUs, at most --heads; P at most
     the blocks + embedding + head), each at the same global batch: the memory
     of its busiest rank, the pipeline's bubble, tensor all-reduces, sends
     between stages, the data group's exposed reduction, the step (--pipeline,
     --tensor: only that layout beside plain data parallelism; --microbatches,
     --schedule); estimates from arithmetic, not measurements;
  7. a one-line recommendation and its reasons: the fastest layout that fits,
     and a sentence when plain data parallelism is as good.
--json prints the same as one JSON object (docs/planning.md, "JSON output").

The model (its rules, constants and defaults) and both JSON formats, MEASURE.json and
--json's output, are specified in docs/planning.md ("The planner's model"); its code is
in tools/embertools/plan/, one module per part of that specification.

Options are checked before anything is read: a value out of range (NaN, an
infinity, a negative price, --price past $10,000/h, ...), or a --price or
--gpu naming no row of the table, is a usage error. --check checks them and
exits (tools/ember plan runs it before measuring).

Exit status: 0 planned, 1 bad input (the message names the file and key), 2 usage.
"""
import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/: the shared package, embertools

from embertools.errors import UsageError
from embertools.plan.constants import (CHECKPOINT_MODES, CONTEXT_GIB, DEFAULT_GPUS, DEFAULT_HOST_RAM_GIB,
    DEFAULT_INTER_LINK, DEFAULT_MARGIN, DEFAULT_MFU, DEFAULT_NICS_PER_NODE, DEFAULT_SCHEDULE, GPUS_PER_NODE,
    GRAPH_LAUNCH_US, INTER_LINKS, INTRA_LINKS, KERNEL_US, LAUNCH_US, LINK_CHOICES, LINK_NETWORKS, MAX_GIB, MAX_HEADS,
    MAX_LINK_GB_S, MAX_MICROBATCHES, MAX_NICS_PER_NODE, MAX_SEQ_LEN, MAX_STEP_FLOOR_MS, MAX_US, MAX_WIDTH,
    MAX_WORLD_SIZE, PRECISIONS, SCHEDULES, PlanError, SHARDING, STEP_FLOOR_MS)
from embertools.plan.inputs import load_gpus, load_measurement, parse_price, parse_prices
from embertools.plan.nodes import make_plan, select_gpus
from embertools.plan.render import render


def parse_args(argv):
    p = argparse.ArgumentParser(description="GPU-rental plan from a `RECIPE --measure` file; docs/planning.md "
                                            "(\"The planner's model\") documents the model, its constants and "
                                            "both JSON formats.")
    p.add_argument("measurement", type=Path, nargs="?", help="MEASURE.json written by `RECIPE --measure`")
    p.add_argument("--gpus", type=Path, default=DEFAULT_GPUS, help="GPU table (default: tools/plan/gpus.toml)")
    p.add_argument("--price", action="append", default=[], metavar="GPU=USD_PER_HOUR",
                   help="price of one GPU-hour; repeat per GPU (overrides the table's usd_per_hour)")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                   help=f"share of GPU memory kept free (default {DEFAULT_MARGIN})")
    p.add_argument("--mfu", type=float, default=None,
                   help=f"assumed model FLOPs utilisation (default: calibrated from a CUDA run, else "
                        f"{DEFAULT_MFU})")
    p.add_argument("--runs-dir", default="runs",
                   help="run folders to calibrate the MFU from (default runs; '' = none)")
    p.add_argument("--context-gib", type=float, default=CONTEXT_GIB,
                   help=f"CUDA context overhead per GPU, GiB (default {CONTEXT_GIB})")
    p.add_argument("--step-floor-ms", type=float, default=None,
                   help="least time of a training step on a GPU, ms (default: from what the measurement counted "
                        f"the step launching, see 'step floor' in tools/ember plan --help; else {STEP_FLOOR_MS})")
    p.add_argument("--launch-us", type=float, default=LAUNCH_US,
                   help=f"host cost of launching one op (LibTorch dispatch + kernel launch), us (default "
                        f"{LAUNCH_US:g})")
    p.add_argument("--graph-launch-us", type=float, default=GRAPH_LAUNCH_US,
                   help=f"host cost of one cudaGraphLaunch of a whole step (trainer.cuda_graph), us "
                        f"(default {GRAPH_LAUNCH_US:g})")
    p.add_argument("--kernel-us", type=float, default=KERNEL_US,
                   help=f"least device time of one kernel, e.g. a node inside a CUDA graph, us (default "
                        f"{KERNEL_US:g}: an assumption, see KERNEL_US in tools/plan/plan.py)")
    p.add_argument("--host-ram-gib", type=float, default=DEFAULT_HOST_RAM_GIB,
                   help=f"host RAM per GPU of the instance, GiB (default {DEFAULT_HOST_RAM_GIB:g})")
    p.add_argument("--gpu", action="append", default=[], metavar="NAME", help="only this GPU; repeatable")
    p.add_argument("--precision", action="append", choices=PRECISIONS, help="only this precision; repeatable")
    p.add_argument("--world-size", type=_world_size, default=None, metavar="N",
                   help="GPUs of one data-parallel run to plan sharding and its communication for (default 1, or "
                        f"--nodes x --gpus-per-node; 1 to {MAX_WORLD_SIZE})")
    p.add_argument("--nodes", type=_whole("--nodes", MAX_WORLD_SIZE, "2"), default=None, metavar="N",
                   help=f"nodes the GPUs are in (default: --world-size / {GPUS_PER_NODE}, rounded up); more than one "
                        "adds the nodes section: 1, 2, 4, ... nodes and whether another node pays")
    p.add_argument("--gpus-per-node", type=_whole("--gpus-per-node", MAX_WORLD_SIZE, "8"), default=None, metavar="G",
                   help=f"GPUs in each node (default {GPUS_PER_NODE}, or --world-size / --nodes); world size = N x G")
    p.add_argument("--intra-link", type=_intra_link, default=None, metavar="L",
                   help="link between the GPUs of a node: nvlink (or nvswitch), pcie, or a number of GB/s per GPU per "
                        "direction (default auto: the board's NVLink from the GPU table, else its PCIe)")
    p.add_argument("--inter-link", type=_inter_link, default=None, metavar="L",
                   help=f"each NIC between nodes: {', '.join(INTER_LINKS)}, or a number of Gb/s (default "
                        f"{DEFAULT_INTER_LINK}: 400 Gb/s InfiniBand)")
    p.add_argument("--nics-per-node", type=_whole("--nics-per-node", MAX_NICS_PER_NODE, "8"), default=None,
                   metavar="K", help=f"NICs of --inter-link in each node (default {DEFAULT_NICS_PER_NODE}; a DGX/HGX "
                                     "H100 node: 8, one a GPU)")
    p.add_argument("--sharding", action="append", choices=SHARDING + ("all",),
                   help="dist.sharding stage(s) to plan at --world-size: none (DDP), optimizer (ZeRO-1), gradients "
                        "(ZeRO-2), parameters (ZeRO-3), all (default); repeatable")
    p.add_argument("--activation-checkpoint", action="append", choices=CHECKPOINT_MODES + ("all",),
                   help="activation-checkpointing mode(s) to plan: none, full (every block recomputed), light "
                        "(norms and activations recomputed), all (default: those the measurement allows); repeatable")
    p.add_argument("--link", choices=LINK_CHOICES, default="auto",
                   help="one link for all --world-size GPUs, the older spelling: nvlink or pcie (one node of them "
                        "all), 25gbe, 100gbe or 400g-ib (a node per GPU, one NIC each); default auto: the topology of "
                        "--nodes, --gpus-per-node, --intra-link, --inter-link and --nics-per-node")
    p.add_argument("--pipeline", type=_whole("--pipeline", MAX_WORLD_SIZE, "4"), default=None, metavar="P",
                   help="plan only layouts of P pipeline stages (beside plain data parallelism); default: every P")
    p.add_argument("--tensor", type=_whole("--tensor", MAX_HEADS, "8"), default=None, metavar="T",
                   help="plan only layouts of T tensor-parallel ranks (T divides --gpus-per-node, at most --heads); "
                        "default: every T")
    p.add_argument("--microbatches", type=_whole("--microbatches", MAX_MICROBATCHES, "32"), default=None, metavar="M",
                   help="microbatches a pipeline (of P x T GPUs, P x T > 1) runs per optimizer step (>= P under "
                        "1F1B); default: the fastest that fits of those that split its samples evenly")
    p.add_argument("--schedule", choices=SCHEDULES, default=DEFAULT_SCHEDULE,
                   help=f"pipeline schedule: 1f1b keeps min(P - s, m) microbatches' activations on stage s, gpipe "
                        f"all m (default {DEFAULT_SCHEDULE})")
    p.add_argument("--heads", type=_whole("--heads", MAX_HEADS, "12"), default=None, metavar="H",
                   help="the model's attention heads (tensor parallelism splits them: without, T = 1)")
    p.add_argument("--width", type=_whole("--width", MAX_WIDTH, "768"), default=None, metavar="C",
                   help="the model's hidden width (default: estimated from a block's parameters, 12 C^2 + 13 C)")
    p.add_argument("--seq-len", type=_whole("--seq-len", MAX_SEQ_LEN, "1024"), default=None, metavar="S",
                   help="tokens a sample (default: estimated as train FLOPs / (6 x parameters))")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--no-color", action="store_true", help="accepted for tools/ember; the output has no colour")
    p.add_argument("--check", action="store_true",
                   help="check the options (and the names in --price and --gpu against the table) and exit; "
                        "tools/ember plan runs it before measuring")
    args = p.parse_args(argv)
    if args.measurement is None and not args.check:
        p.error("the measurement MEASURE.json is required (write it with `RECIPE --measure MEASURE.json`)")
    # (option, value, low, high, low excluded, high excluded, example): NaN, infinities and
    # values past the bounds are usage errors, before anything is read.
    ranges = [("--margin", args.margin, 0, 1, False, True, "0.10: 10% kept free"),
              ("--mfu", args.mfu, 0, 1, True, False, "0.30: 30% of the peak"),
              ("--context-gib", args.context_gib, 0, MAX_GIB, False, False, "0.5"),
              ("--step-floor-ms", args.step_floor_ms, 0, MAX_STEP_FLOOR_MS, False, False, "1"),
              ("--launch-us", args.launch_us, 0, MAX_US, False, False, "5"),
              ("--graph-launch-us", args.graph_launch_us, 0, MAX_US, False, False, "10"),
              ("--kernel-us", args.kernel_us, 0, MAX_US, False, False, "2"),
              ("--host-ram-gib", args.host_ram_gib, 0, MAX_GIB, True, False, "16")]
    for name, value, low, high, low_open, high_open, example in ranges:
        if value is None:
            continue
        inside = (math.isfinite(value) and (value > low if low_open else value >= low)
                  and (value < high if high_open else value <= high))
        if not inside:
            p.error(f"{name} {value}: expected a number {'>' if low_open else '>='} {low:g} and "
                    f"{'<' if high_open else '<='} {high:.10g} (e.g. {name} {example})")
    for item in args.price:
        try:
            parse_price(item)
        except UsageError as e:
            p.error(str(e))
    if args.precision:
        args.precision = [p for p in PRECISIONS if p in args.precision]
    try:
        args.topology = resolve_topology(args.world_size, args.nodes, args.gpus_per_node, args.intra_link,
                                         args.inter_link, args.nics_per_node, args.link)
    except UsageError as e:
        p.error(str(e))
    args.world_size = args.topology["world_size"]
    try:
        check_layout_options(args)
    except UsageError as e:
        p.error(str(e))
    asked = [s for s in args.sharding or [] if s != "all"]
    args.sharding_asked = [] if not args.sharding or "all" in args.sharding else [s for s in SHARDING if s in asked]
    args.sharding = args.sharding_asked or list(SHARDING)
    if args.world_size == 1 and [s for s in asked if s != "none"]:
        p.error(f"--sharding {asked[-1] if asked[-1] != 'none' else asked[0]}: sharding splits state over several "
                f"GPUs; give --world-size N with N > 1 (e.g. --world-size 8)")
    if args.world_size == 1:
        args.sharding = ["none"]  # one GPU has nothing to split: every stage is "none" there
    args.checkpoint_asked = [] if not args.activation_checkpoint or "all" in args.activation_checkpoint \
        else [c for c in CHECKPOINT_MODES if c in args.activation_checkpoint]
    args.activation_checkpoint = args.checkpoint_asked or list(CHECKPOINT_MODES)
    return args


def check_layout_options(args):
    """--pipeline, --tensor, --microbatches and --heads against the topology: UsageError for a layout that
    cannot be (T not dividing a node's GPUs or the heads, P x T not dividing the world size, fewer
    microbatches than stages under 1F1B)."""
    world, per_node = args.world_size, args.topology["gpus_per_node"]
    pipeline, tensor = args.pipeline or 1, args.tensor or 1
    if world == 1 and pipeline * tensor > 1:
        flag = "--pipeline" if pipeline > 1 else "--tensor"
        raise UsageError(f"{flag} {pipeline if pipeline > 1 else tensor}: a layout splits the model over several "
                         f"GPUs; give --world-size N with N > 1 (e.g. --world-size 8)")
    if tensor > 1:
        if per_node % tensor:
            raise UsageError(f"--tensor {tensor}: a tensor-parallel group stays inside one node: T must divide its "
                             f"{per_node} GPUs (--gpus-per-node)")
        if args.heads is None:
            raise UsageError(f"--tensor {tensor}: tensor parallelism splits the attention heads: give --heads H "
                             f"(e.g. --heads 64)")
        if tensor > args.heads:
            raise UsageError(f"--tensor {tensor}: each tensor-parallel rank needs a head: T must be at most the "
                             f"{args.heads} attention heads (--heads)")
    if world % (pipeline * tensor):
        raise UsageError(f"--pipeline {pipeline} x --tensor {tensor} = {pipeline * tensor} does not divide the "
                         f"{world} GPUs: the data-parallel degree D = world / (P x T) must be whole")
    if args.microbatches is not None and args.schedule == "1f1b" and args.microbatches < pipeline:
        raise UsageError(f"--microbatches {args.microbatches}: 1F1B needs at least one microbatch a stage "
                         f"(--pipeline {pipeline}); give --microbatches {pipeline} or more, or --schedule gpipe")


def _world_size(text):
    """--world-size: a whole number from 1 to MAX_WORLD_SIZE (argparse turns the ValueError into exit 2)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of GPUs (e.g. --world-size 8)") from None
    if not 1 <= n <= MAX_WORLD_SIZE:
        raise argparse.ArgumentTypeError(f"{n}: expected 1 to {MAX_WORLD_SIZE} GPUs (e.g. --world-size 8)")
    return n


def _whole(option, most, example):
    """argparse type of a whole-number option from 1 to `most`."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number (e.g. {option} {example})") from None
        if not 1 <= n <= most:
            raise argparse.ArgumentTypeError(f"{n}: expected 1 to {most} (e.g. {option} {example})")
        return n
    return parse


def _link_number(text, option, unit, example):
    """A link's bandwidth given as a number: finite, > 0, at most MAX_LINK_GB_S; else an argparse error."""
    try:
        x = float(text)
    except ValueError:
        return None
    if not (math.isfinite(x) and 0 < x <= MAX_LINK_GB_S):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of {unit} > 0 and <= {MAX_LINK_GB_S:g} "
                                         f"(e.g. {option} {example})")
    return x


def _intra_link(text):
    """--intra-link: a name of INTRA_LINKS, or GB/s per GPU per direction."""
    name = text.strip().lower()
    if name in INTRA_LINKS:
        return name
    x = _link_number(text, "--intra-link", "GB/s", "450")
    if x is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {', '.join(INTRA_LINKS)} or GB/s per GPU (e.g. "
                                         f"--intra-link nvlink, --intra-link 450)")
    return x


def _inter_link(text):
    """--inter-link: a name of INTER_LINKS (or --link's 25gbe, 100gbe, 400g-ib), or Gb/s per NIC."""
    name = text.strip().lower()
    name = LINK_NETWORKS.get(name, name)
    if name in INTER_LINKS:
        return name
    x = _link_number(text, "--inter-link", "Gb/s", "400")
    if x is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {', '.join(INTER_LINKS)} or Gb/s per NIC (e.g. "
                                         f"--inter-link ib-ndr, --inter-link 400)")
    return x


def resolve_topology(world_size, nodes, gpus_per_node, intra, inter, nics, link="auto"):
    """The GPUs a run has and the links between them, from the options (None: not given): {"world_size",
    "nodes", "gpus_per_node", "intra", "inter", "nics_per_node", "link"}. Any two of --world-size, --nodes,
    --gpus-per-node give the third (world = N x G); all three must agree, and a world size must split
    into equal nodes. --nodes alone: nodes of GPUS_PER_NODE; --gpus-per-node alone: one node; neither:
    nodes of GPUS_PER_NODE (the last holding the rest). --link other than auto is one link for every
    GPU (see LINK_CHOICES) and takes none of the topology's flags. UsageError for a contradiction."""
    flags = [name for name, value in (("--nodes", nodes), ("--gpus-per-node", gpus_per_node),
                                      ("--intra-link", intra), ("--inter-link", inter), ("--nics-per-node", nics))
             if value is not None]
    out = {"intra": intra or "auto", "inter": DEFAULT_INTER_LINK if inter is None else inter,
           "nics_per_node": nics or DEFAULT_NICS_PER_NODE, "link": link}
    if link != "auto":
        if flags:
            raise UsageError(f"--link {link} is one link for every GPU (the older spelling); with {flags[0]} give "
                             f"the link of each hop instead: --intra-link inside a node, --inter-link between nodes "
                             f"(e.g. --intra-link nvlink --inter-link eth-25)")
        world = world_size or 1
        if link in ("nvlink", "pcie"):
            return dict(out, world_size=world, nodes=1, gpus_per_node=world, intra=link)
        return dict(out, world_size=world, nodes=world, gpus_per_node=1, inter=LINK_NETWORKS[link])
    if nodes is not None and gpus_per_node is not None:
        if world_size is not None and world_size != nodes * gpus_per_node:
            raise UsageError(f"--world-size {world_size} contradicts --nodes {nodes} x --gpus-per-node "
                             f"{gpus_per_node} = {nodes * gpus_per_node} GPUs: give two of the three, or three "
                             f"that agree")
        world = nodes * gpus_per_node
    elif nodes is not None:
        if world_size is None:
            gpus_per_node, world = GPUS_PER_NODE, nodes * GPUS_PER_NODE
        elif world_size % nodes:
            raise UsageError(f"--world-size {world_size} does not split into --nodes {nodes} equal nodes: give "
                             f"--gpus-per-node G (world size = N x G) or a multiple of {nodes}")
        else:
            gpus_per_node, world = world_size // nodes, world_size
    elif gpus_per_node is not None:
        if world_size is None:
            nodes, world = 1, gpus_per_node
        elif world_size % gpus_per_node:
            raise UsageError(f"--world-size {world_size} is not a whole number of nodes of --gpus-per-node "
                             f"{gpus_per_node}: give --nodes N (world size = N x G) or a multiple of {gpus_per_node}")
        else:
            nodes, world = world_size // gpus_per_node, world_size
    else:
        world = world_size or 1
        gpus_per_node, nodes = min(world, GPUS_PER_NODE), -(-world // GPUS_PER_NODE)
    if world > MAX_WORLD_SIZE:
        raise UsageError(f"--nodes {nodes} x --gpus-per-node {gpus_per_node} = {world} GPUs: expected at most "
                         f"{MAX_WORLD_SIZE}")
    if nodes == 1 and (inter is not None or nics is not None):
        raise UsageError(f"{'--inter-link' if inter is not None else '--nics-per-node'} links nodes, but the plan "
                         f"has one node of {gpus_per_node} GPU{'s' if gpus_per_node > 1 else ''}: give --nodes N "
                         f"with N > 1 (e.g. --nodes 2)")
    if gpus_per_node == 1 and intra is not None:
        raise UsageError("--intra-link links the GPUs inside a node, but each node has one GPU: give "
                         "--gpus-per-node G with G > 1 (e.g. --gpus-per-node 8)")
    return dict(out, world_size=world, nodes=nodes, gpus_per_node=gpus_per_node)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        gpus = load_gpus(args.gpus)
        prices = parse_prices(args.price, gpus)
        select_gpus(gpus, args.gpu)
        if args.check:
            return 0
        m = load_measurement(args.measurement)
        plan = make_plan(m, gpus, prices, args, args.measurement)
    except PlanError as e:
        print(f"[plan] error: {e}", file=sys.stderr)
        return e.exit_status  # 2 a UsageError, 1 bad input
    print(json.dumps(plan, indent=1) if args.json else render(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
