"""The planner's constants and defaults (each a flag or a documented default: docs/planning.md,
"The planner's model"), and its error types.
"""
from pathlib import Path

from embertools.errors import ToolError


GIB = 1024**3
MIB = 1024**2
CONTEXT_GIB = 0.5  # CUDA context + library handles: device memory no allocator statistic counts
DEFAULT_MFU = 0.30  # a well-fed mid-sized model in eager LibTorch; small models get far less
DEFAULT_MARGIN = 0.10  # of the GPU's memory kept free: fragmentation, usable < sold, allocator slack
STEP_FLOOR_MS = 1.0  # an eager training step's kernel launches, when the measurement did not count them
LAUNCH_US = 5.0  # LibTorch dispatch + cudaLaunchKernel per op, eager C++ (several us; Python adds ~5 more)
GRAPH_LAUNCH_US = 10.0  # host: one cudaGraphLaunch of a whole training step (a few us; more for big graphs)
# Device: the least time of one kernel node inside a CUDA graph, back to back. An assumption, not
# measured on Ember: NVIDIA's "Getting Started with CUDA Graphs" (developer.nvidia.com/blog/cuda-graphs,
# V100) runs a ~2.9 us kernel at ~3.4 us per node in a graph, ~0.5 us between nodes; ATen's smallest
# elementwise kernels run ~1-2 us on the device. Replace it with a GPU's profile when one is at hand.
KERNEL_US = 2.0
# Launches of older measurements without step_ops (see docs/planning.md's "step floor").
KERNELS_PER_FORWARD_NODE = 3  # the node's forward kernel and about two in backward
FUSED_KERNELS_PER_BUCKET = {"sgd": 1, "adam": 2, "adamw": 2}  # _fused_sgd_; _foreach_add_ + _fused_adam(w)_
FUSED_FP16_KERNELS_PER_BUCKET = {"sgd": 0, "adam": 1, "adamw": 1}  # _foreach_sub_: a skipped step's count back
UNFUSED_KERNELS_PER_TENSOR = {"sgd": 4, "adam": 8, "adamw": 8}  # LibTorch's step, with weight decay
GRAD_SCALER_KERNELS = 3  # fp16-mixed: loss x scale, the inf check of the gradients, the scale's update
ESTIMATED_GROUPS = 2  # Ember's parameter groups by default: weight decay on matrices, none on the rest
PAYS_EFFICIENCY = 0.8  # data-parallel pays at n GPUs when t_step / (t_step + t_allreduce) >= this
LOADER_HOST_BATCHES = 3  # host staging: 2 prefetched batches (TensorLoader on CUDA) + 1 being gathered
DEFAULT_HOST_RAM_GIB = 16.0  # a small one-GPU cloud instance (e.g. 4 vCPUs, 16 GiB)
NEAR_TIE = 0.05  # rows within 5% of the fastest epoch count as equally fast
DP_WORTH_SECONDS = 3600.0  # recommend several GPUs only for a run of an hour or more on one
GPU_COUNTS = (2, 4, 8)
PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")
PEAK_KEYS = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "bf16-mixed": "bf16_tflops",
             "fp16-mixed": "fp16_tflops"}
PCIE_GB_S = {3: 16.0, 4: 32.0, 5: 64.0}  # x16, per direction (the datasheets' bidirectional figure halved)
NETWORKS = (("25 GbE", 25 / 8), ("100 GbE", 100 / 8), ("400G IB", 400 / 8))  # GB/s per GPU, one NIC each
GPU_FIELDS = ("memory_gib", "hbm_gb_s", "bf16_tflops", "fp16_tflops", "tf32_tflops", "fp32_tflops",
              "nvlink_gb_s", "pcie_gen")
DEFAULT_GPUS = Path(__file__).resolve().parents[2] / "plan" / "gpus.toml"  # tools/plan/gpus.toml
# Largest values the options take: beyond them a number is a typo, and the arithmetic overflows.
MAX_GIB = 2.0**20  # --context-gib, --host-ram-gib: 1 PiB (the recipe keys' *_gib bound)
MAX_USD_PER_HOUR = 1e4  # --price: the dearest cloud GPU rents for ~$10/h; a node of 8 for under $100/h
MAX_US = 1e6  # --launch-us, --graph-launch-us, --kernel-us: one second per launch
MAX_STEP_FLOOR_MS = 3.6e6  # --step-floor-ms: an hour per step
MAX_WORLD_SIZE = 65536  # --world-size: more GPUs than any one job has used
# dist.sharding's stages, least split first: DDP, ZeRO-1 (optimizer state), ZeRO-2 (+ gradients),
# ZeRO-3 (+ parameters); and the activation-checkpointing modes, least recomputed first.
SHARDING = ("none", "optimizer", "gradients", "parameters")
CHECKPOINT_MODES = ("none", "full", "light")
ZERO_NAMES = {"none": "DDP", "optimizer": "ZeRO-1", "gradients": "ZeRO-2", "parameters": "ZeRO-3"}
# What a run sets for each (printed by the recommendation). Light mode's key is not settled yet.
SHARDING_KEY = "dist.sharding={}"
CHECKPOINT_KEYS = {"none": "model.activation_checkpoint_every=0", "full": "model.activation_checkpoint_every=1",
                   "light": "the light activation-checkpointing mode (norms and activations recomputed)"}
COLLECTIVE_OF = {"parameters": "P", "gradients": "G", "block parameters": "P blocks", "other parameters": "P rest"}
RING_SHARE = {"all-reduce": 2.0, "reduce-scatter": 1.0, "all-gather": 1.0}  # x (n-1)/n of the buffer, per GPU
# ZeRO-3 holds, besides its shard, at most two blocks' parameters gathered: none is prefetched, a block
# is gathered just before its forward (one at a time) and again just before its backward, and freed once
# its parameters' gradients are all in, by when the backward of the block before it may have gathered its.
GATHERED_BLOCKS = 2
# Light checkpointing recomputes a block's norms and activation functions: the share of a block's
# saved activations they hold. Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
# Transformer Models", section 4.1) count a transformer layer's saved activations as 34 bytes per
# token per hidden unit in 16-bit (attention scores aside); the two layer norms' outputs are 4 of
# them and the GELU's output 8: 12/34. An estimate for a transformer block; a measurement
# (memory.PRECISION.activation_checkpoint.light) replaces it.
LIGHT_RECOMPUTED_SHARE = 12 / 34
GPUS_PER_NODE = 8  # a node's GPUs unless --gpus-per-node says (HGX/DGX boards: 8 on NVLink/NVSwitch)
BUCKET_CAP_MB = 25.0  # dist.bucket_cap_mb's default (0 in the config): the units ZeRO-1/2 split, in MiB
# --link: one link for every GPU (the older spelling of the topology, kept): nvlink and pcie put all
# --world-size GPUs in one node; a network puts each GPU in a node of its own with one NIC.
LINK_CHOICES = ("auto", "nvlink", "pcie", "25gbe", "100gbe", "400g-ib")
LINK_NETWORKS = {"25gbe": "eth-25", "100gbe": "eth-100", "400g-ib": "ib-ndr"}  # --link's names of --inter-link's
# The topology (--nodes, --gpus-per-node, --intra-link, --inter-link, --nics-per-node): nodes of G GPUs on
# NVLink/NVSwitch or PCIe inside, NICs between them. --inter-link: (name as printed, Gb/s per NIC: line rate).
INTRA_LINKS = ("auto", "nvlink", "nvswitch", "pcie")  # nvswitch: HGX boards' NVLink, the table's same figure
INTER_LINKS = {"eth-10": ("10 GbE", 10.0), "eth-25": ("25 GbE", 25.0), "eth-100": ("100 GbE", 100.0),
               "eth-200": ("200 GbE", 200.0), "eth-400": ("400 GbE", 400.0),
               "roce-100": ("100G RoCE", 100.0), "roce-200": ("200G RoCE", 200.0), "roce-400": ("400G RoCE", 400.0),
               "ib-hdr": ("200G IB", 200.0), "ib-ndr": ("400G IB", 400.0), "ib-xdr": ("800G IB", 800.0)}
DEFAULT_INTER_LINK = "ib-ndr"  # what --link auto assumed between nodes before the topology flags
# One NIC per node by default: the cautious figure (a second node must pay on it), what the planner
# assumed before (--link auto beyond 8 GPUs: 400G InfiniBand, 50 GB/s for the whole ring), and near what
# many rentable 8-GPU instances have (AWS p4d: 4 x 100 Gb/s EFA = one 400G NIC's worth). HGX/DGX H100
# clusters (AWS p5, Azure ND H100 v5, DGX SuperPOD) have one 400G NIC per GPU: --nics-per-node 8.
DEFAULT_NICS_PER_NODE = 1
MAX_LINK_GB_S = 1e5  # --intra-link GB/s and --inter-link Gb/s given as numbers: 100 TB/s is a typo
MAX_NICS_PER_NODE = 1024
# Latency of a ring collective, NCCL's own model (src/graph/tuning.cc, ncclTopoTuneModel, ring algorithm,
# Simple protocol, the one large buffers use): baseLat 8.4 us per collective + hwLat per step, NVLink
# 3.4 us, PCIe 5.7 us, network 9.6 us; a ring all-reduce over n ranks on N nodes takes 2 (n-1) steps of
# which 2 (N-1) cross the network, a reduce-scatter or an all-gather n-1 and N-1. Figures of NCCL 2.x;
# releases retune them. A number given for --intra-link is timed as PCIe.
NCCL_BASE_US = 8.4
NVLINK_HOP_US = 3.4
PCIE_HOP_US = 5.7
NET_HOP_US = 9.6
# Of a training step's math, backward's share: train FLOPs = 6 x MACs a sample, forward 2, backward 4.
# The gradients' reduction overlaps it (DDP's buckets, dist.sharding's units reduce-scatter as backward
# produces them); recomputation of checkpointed activations also runs in backward.
BACKWARD_SHARE = 2.0 / 3.0
# Pipeline x tensor x data layouts (--pipeline, --tensor, --microbatches, --schedule, --heads, --width,
# --seq-len). Schedules: 1F1B keeps min(P - s, m) microbatches' activations on stage s, GPipe all m.
SCHEDULES = ("1f1b", "gpipe")
DEFAULT_SCHEDULE = "1f1b"
# Megatron-LM's tensor parallelism (Shoeybi et al. 2019, figure 3): a transformer block's attention and
# MLP each end in an all-reduce of the block's output (B x S x C) in forward (g) and begin with one in
# backward (f): 4 a block a microbatch. With sequence parallelism (Korthikanti et al. 2022) each becomes a
# reduce-scatter and an all-gather: the same bytes.
TENSOR_ALLREDUCES_PER_BLOCK = 4
# The sharding stages a layout with P x T > 1 is planned with: ZeRO-1 over the data group (Megatron-LM's
# distributed optimizer); ZeRO-2/3 split what a pipeline accumulates over its microbatches.
LAYOUT_SHARDING = ("none", "optimizer")
ACTIVATION_ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16-mixed": 2, "fp16-mixed": 2}  # what stages send
MAX_HEADS = 65536  # --heads, --tensor
MAX_WIDTH = 2**20  # --width
MAX_SEQ_LEN = 2**24  # --seq-len: 16M tokens a sample
MAX_MICROBATCHES = 2**20  # --microbatches


# Bad input (exit 1), and a bad option such as a --price or --gpu naming no row of the table (exit 2).
PlanError = ToolError
