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
                          [--intra-link L] [--inter-link L] [--nics-per-node K] [--json] [--check]
    python3 tools/plan/plan.py m.json --price L4=0.80 --price H100=2.99 --gpu L4 --gpu H100-SXM
    python3 tools/plan/plan.py m.json --world-size 8 --sharding all --activation-checkpoint all
    python3 tools/plan/plan.py m.json --nodes 4 --gpus-per-node 8 --inter-link ib-ndr --nics-per-node 8

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
     read rates at the fastest GPU's samples/s;
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
  6. a one-line recommendation and its reasons.
--json prints the same as one JSON object (keys below, under "JSON output").

The model (every constant is a flag or a documented default)
  memory(b)   = context + parameter_bytes + buffer_bytes [+ resident_bytes when
                the dataset lives on the GPU] + F + b*A, with F, A the measured
                fit of the training loop's peak (gradients, optimizer state,
                activations, workspaces, batch); with trainer.cuda_graph and a
                measurement without the graph's pool (memory_includes_graph_pool
                false: on the CPU) A counts twice, see MEASURE.json. Fits when
                memory(b) <= (1 - margin) * memory_gib GiB. context (--context-gib,
                default 0.5 GiB): the CUDA context, cuBLAS/cuDNN handles and
                their kernels, which no allocator statistic sees.
  step time   = max(samples * train_flops_per_sample / (peak * MFU), step floor)
                per micro-batch, times accumulate_grad_batches per optimizer step.
                peak: the table's dense TFLOP/s of the precision's math (fp32:
                plain FMA; tf32/bf16/fp16: tensor cores).
  step floor  what the configured step's launches cost however little math it
                holds: below it a GPU is launch-bound, the real MFU falls far
                below the assumed one, and a bigger GPU is no faster. Steps are
                sync-free, so the host queues launches while the device runs
                earlier ones: the floor is the larger of the host's and the
                device's time for one optimizer step, per micro-batch (/
                accumulate_grad_batches). From step_ops (counted by the
                measurement: ATen ops that launch work in one whole step as
                configured, forward, backward, the optimizer, loss scaling):
                  eager (trainer.cuda_graph off): E x --launch-us (5 us: host
                    dispatch + launch per op; the device's E x --kernel-us is
                    less);
                  CUDA graph (trainer.cuda_graph on; accumulation is 1): the
                    larger of the host's --graph-launch-us (10 us, one
                    cudaGraphLaunch) + G x --launch-us, G the ops still launched
                    outside the graph per step, and the device's (I + G) x
                    --kernel-us, I the ops inside the graph (2 us: the least
                    device time of a kernel node; an assumption, see KERNEL_US).
                    Without G and I (an older measurement) it is planned as
                    eager, which overstates the floor; the output says so.
                Older measurements without step_ops: eager, estimated as
                3 x forward_graph_nodes (each autograd node's kernel and about
                two in backward) + the optimizer's launches: Ember's fused
                optimizers (the default; also when the file does not say) one
                kernel per (device, dtype) bucket of each parameter group
                (_fused_sgd_; Adam/AdamW _foreach_add_ + _fused_adam(w)_, and
                _foreach_sub_ with fp16 loss scaling), taken as 2 groups (decayed
                and not) of one bucket; LibTorch's (optim.fused=false) about 4
                (SGD) or 8 (Adam/AdamW) per parameter tensor; fp16-mixed adds
                the GradScaler's 3. Nothing counted: --step-floor-ms (default
                1 ms), which also overrides the counts when given.
  MFU         --mfu if given; else calibrated: monitor.mfu of the newest CUDA run
                of this recipe under --runs-dir (RUNS_DIR/<recipe>*/summary.json;
                the same precision preferred), or the measurement's own
                measured.mfu when it ran on CUDA; else DEFAULT_MFU (0.30). The
                output says which, per precision. An MFU measured on one GPU is
                applied to all: a first-order guess, not a law.
  epoch       = ceil(train_samples / batch_size) micro-batches (training only:
                validation adds eval_samples forward passes, about a third of a
                training sample's FLOPs each). Cost = hours * USD per GPU-hour.
  feeding     host RAM = resident_bytes + LOADER_HOST_BATCHES batches of
                sample_bytes (the loader's pinned staging); the dataset is read
                from storage once when that fits in --host-ram-gib (Ember's
                loaders hold the whole decoded dataset), else it would stream at
                samples/s * disk_bytes / (train_samples + eval_samples).
  data-parallel  ring all-reduce of gradient_bytes once per optimizer step:
                t_allreduce = 2 (n - 1) / n * gradient_bytes / bandwidth, with
                the per-GPU, per-direction bandwidth of the link (NVLink from the
                table; PCIe x16 of the board's generation: Gen3 16, Gen4 32,
                Gen5 64 GB/s; 25 GbE 3.125, 100 GbE 12.5, 400 Gb/s InfiniBand
                50 GB/s, one NIC per GPU). No latency term and no overlap with
                backward. It pays at n GPUs when the scaling efficiency
                t_step / (t_step + t_allreduce) >= PAYS_EFFICIENCY (0.8), t_step
                being one GPU's optimizer step at the config's per-GPU batch.
                Datasheet bandwidths are peaks: NCCL reaches ~70-90% of them.
  recommendation  among the (GPU, precision) rows where the config's batch fits:
                the cheapest per run among priced rows; without prices the
                fastest per epoch, and among rows within 5% of it (launch-bound
                ones tie) the smallest GPU (lowest top peak). Several GPUs only
                when data-parallel pays and a run on one takes an hour or more
                (it never lowers the cost: n GPUs at efficiency e cost 1/e), and
                DDP's buckets (a copy of the gradients, see "comm buffers") fit
                beside the batch; else it says to plan sharding at that count.
                When nothing fits the batch: the GPU with the largest batch and
                the accumulation that keeps the effective batch.
                With section 4 shown, at --world-size N > 1 (or on one GPU when
                the plain batch fits none): the same rule over its rows (GPU,
                precision, stage, mode) with the cost of all N GPUs; equal costs
                go to less sharding, then less recomputation. None fits the
                batch: the row with the largest batch, with accumulation. None
                fits one sample: the least memory there is (ZeRO-3, or ZeRO-2
                for a model without blocks; the mode with the least activations,
                the largest GPU) and the smallest power-of-two --world-size at
                which it would fit.

Configurations (section 4; the rows a GPU row can check against its measured peak)
  One precision per GPU: its row of section 1 with the fastest epoch (ties: the
  config's own), or each --precision asked. Per GPU at world size N, batch b:
  memory(b)   = context + buffers [+ resident dataset] + parameters + gradients
                + optimizer state + gathered + communication buffers + other + b*A_mode
    state       parameter_bytes, gradient_bytes, optimizer_state_bytes as
                measured, kept as dist::ShardedDataParallel keeps them
                (lib/include/ember/dist/sharding.h); each stage splits one more
                of them 1/N:
                  none (DDP)          all whole.
                  optimizer (ZeRO-1)  the optimizer state 1/N; the parameters
                    whole; the gradients whole (they accumulate in each
                    parameter's .grad over the micro-batches, as DDP's no_sync,
                    until their reduce-scatter at the last one) + this rank's
                    1/N of the reduced gradient, which it keeps between steps.
                  gradients (ZeRO-2)  also the gradients 1/N (each unit's
                    reduce-scattered as backward produces it, every micro-batch).
                  parameters (ZeRO-3) also the parameters of the model's blocks
                    (core::BlockModel: blocks.parameter_bytes) 1/N; those outside
                    the blocks (embeddings, the final norm, a tied head) stay
                    whole on every rank, as with ZeRO-2: parameters =
                    blocks.parameter_bytes x share + parameter_bytes -
                    blocks.parameter_bytes. A measurement without blocks (or
                    without their parameter bytes) cannot plan it: Ember refuses
                    dist.sharding=parameters for a model that is not a BlockModel.
                A split state's share is bytes x sum(ceil(u/N)) / sum(u) over the
                pieces u (elements) of sharding.unit_elements, each padded to a
                multiple of N (without them bytes / N: one piece, its padding left
                out). For a model whose parameters are all in blocks this is the
                ZeRO paper's figure 1 (7.5B parameters, 64 GPUs, 2+2+12 bytes
                each: 120, 31.4, 16.6, 1.9 GB), but for ZeRO-1's kept shard of
                the reduced gradient, which the paper does not count (31.6 GB
                with it). Embeddings of 50257 x 4096 outside the blocks raise
                ZeRO-3's 1.9 GB by all but 1/64 of their 0.41 GB (2.3 GB).
    gathered    ZeRO-3 only: sharding.gathered_parameter_bytes; else
                GATHERED_BLOCKS (2) x blocks.largest_parameter_bytes (else
                blocks.parameter_bytes / count): no block is prefetched; one is
                gathered just before its forward and freed after it (one at a
                time), gathered again just before its backward and freed when
                its parameters' gradients are all in, by when the block before
                it may have gathered its own for its backward (at most two).
    comm buffers  N > 1. DDP: its buckets, a copy of the gradients (PyTorch's
                gradient_as_bucket_view=false; 0 when the measurement says
                gradient_as_bucket_view true). ZeRO-1/2/3: no persistent copy;
                one unit's gradients copied flat while it is reduce-scattered
                (ZeRO-1 at the last micro-batch, ZeRO-2/3 at every one), a
                transient: sharding.transient_gradient_bytes when measured; else
                the largest unit (a unit's gradients have its parameters'
                dtype): ZeRO-1/2 one bucket of dist.bucket_cap_mb
                (sharding.bucket_cap_mb; absent or 0: 25 MiB) of parameters,
                ZeRO-3 the largest block; in both, the parameters outside the
                blocks instead when they are more (an embedding is one tensor:
                a bucket of its own however large; other parameters larger than
                the cap only a measurement sees).
    other       F_mode - gradient_bytes - optimizer_state_bytes (at least 0):
                F is taken to hold all gradients and the optimizer state (a
                step's peak is in backward with the state allocated); the rest
                of F (workspaces, autocast's weight copies) is not sharded.
    A_mode      per-sample activation bytes with checkpointing (below).
  A_mode      none: A as measured. full / light: measured when the measurement
              has memory.PRECISION.activation_checkpoint.MODE (probes, or F and
              A); else estimated from "none" and the model's blocks, labelled
              "estimated", with L = blocks.count, S = block_activation_bytes_per_sample
              (of A, what the blocks save; absent: all of A), X = block_input_
              bytes_per_sample (all blocks' inputs), B = largest_block_activation_
              bytes_per_sample (absent: S / L):
                full (every block, model.activation_checkpoint_every=1): each
                  checkpointed block keeps its input instead of what it saves, and
                  the block recomputed in backward holds its activations again:
                  A - c S/L + c X/L + B, c = ceil(L / every) blocks checkpointed;
                light (norms and activations recomputed): the blocks drop the
                  share s = LIGHT_RECOMPUTED_SHARE (12/34: Korthikanti et al. 2022
                  count a transformer layer's saved activations as 34 bytes a
                  token a hidden unit, the layer norms' outputs 4 and the GELU's
                  output 8) of S, and the block in backward holds its share
                  again: A - s S + s B.
              A model without blocks (no core::BlockModel) has only "none" unless
              measured. Under the graph rule A_mode counts twice, as A does.
  communication  bytes each GPU sends per optimizer step of a micro-batches, ring
              collectives ((N-1)/N of the buffer for a reduce-scatter or an
              all-gather, twice that for an all-reduce); P = the trainable
              parameters' bytes, P_b = the blocks' (blocks.parameter_bytes),
              G = gradient_bytes:
                none (DDP)          all-reduce G at the last micro-batch = 2 (N-1)/N G
                optimizer (ZeRO-1)  reduce-scatter G at the last micro-batch (accumulated
                                    whole before it), unit by unit, + all-gather P after
                                    the step = (N-1)/N G + (N-1)/N P (DDP's volume when P = G)
                gradients (ZeRO-2)  reduce-scatter G every micro-batch + all-gather P per step
                                    = a (N-1)/N G + (N-1)/N P (DDP's volume when a = 1 and P = G)
                parameters (ZeRO-3) every micro-batch: all-gather each block's parameters before
                                    its forward and again before its backward, reduce-scatter
                                    G; per step: all-gather the parameters outside the blocks
                                    = a (2 (N-1)/N P_b + (N-1)/N G) + (N-1)/N (P - P_b)
                                    (1.5x DDP when a = 1, P = G and every parameter is in a block)
              time = bytes / link bandwidth (per GPU, per direction), no latency
              term and no overlap with compute (section 5 adds both). The link
              is the ring's bus bandwidth over the topology ("Nodes" below): one
              node, its intra link (NVLink, else the board's PCIe); several, the
              slower of that and the node's NICs. Without the topology flags:
              nodes of GPUS_PER_NODE (8) and one 400G InfiniBand NIC a node (50
              GB/s), as before them. --link nvlink/pcie: one node of them all;
              --link 25gbe/100gbe/400g-ib: a node per GPU, one NIC each.
  time        per micro-batch: max(math, step floor) as in section 1, times
              the recomputation factor of full checkpointing, 1 + 2 M_blocks
              c/L / train_flops_per_sample (one more forward of the checkpointed
              blocks: 2 FLOPs a MAC; M_blocks = blocks.forward_macs_per_sample,
              else forward_macs_per_sample: an upper bound); light adds its
              dropped bytes read and written once more at the board's hbm_gb_s
              (norms and activations are memory-bound; their FLOPs do not
              count). Step = a (micro-batch + its communication) + the step's
              communication; epoch = ceil(train_samples / (N b)) micro-batches.
              Cost per run = epochs x epoch x N GPUs x USD per GPU-hour.

Nodes (section 5; the topology: world size = --nodes N x --gpus-per-node G)
  options     any two of --world-size, --nodes, --gpus-per-node give the third
              and all three must agree (a usage error otherwise); --nodes alone:
              nodes of 8; --world-size alone: nodes of 8, the last holding the
              rest. --intra-link (auto: the board's NVLink from the GPU table,
              else its PCIe x16; nvlink = nvswitch; pcie; or GB/s per GPU per
              direction), --inter-link (a NIC's line rate: eth-10/25/100/200/400,
              roce-100/200/400, ib-hdr 200, ib-ndr 400, ib-xdr 800 Gb/s, or Gb/s)
              x --nics-per-node (default 1: the cautious figure, and what the
              planner assumed before the flags; a DGX/HGX H100 node has 8).
              --inter-link or --nics-per-node on one node, --intra-link with one
              GPU a node, and --link other than auto with any of them: refused.
  busbw       a ring over n = N x G GPUs is as fast as its slowest hop (nccl-tests
              doc/PERFORMANCE.md: t = share x (n-1)/n x bytes / busbw, share 2 for
              an all-reduce, 1 for a reduce-scatter or an all-gather). Inside a
              node each GPU sends to the next over its intra link; a ring leaves a
              node once, and NCCL spreads its rings (channels) over all the NICs,
              so the node's NICs together carry what one GPU sends: busbw =
              min(intra, NICs x NIC) (NCCL's tuning model: busBw = channels x the
              per-channel network speed). Hierarchically (reduce-scatter in the
              node, all-reduce across, all-gather in the node) each GPU sends 1/G
              of the buffer across at (NICs x NIC) / G: the same bound. Line rates:
              NCCL reaches ~80-95% of them on InfiniBand/RoCE, less over TCP.
  latency     per collective, NCCL's ring model (src/graph/tuning.cc, Simple
              protocol): 8.4 us + 3.4 us (NVLink; PCIe 5.7 us) for each step inside
              a node + 9.6 us for each step across; an all-reduce has 2 (n-1)
              steps, 2 (N-1) of them across; a reduce-scatter or all-gather half.
              Collectives per buffer: DDP's buckets, ceil(gradient_bytes /
              dist.bucket_cap_mb); ZeRO-1/2's units (sharding.unit_elements, else
              buckets); ZeRO-3 a block at a time. NCCL picks a tree at many nodes
              when it is faster: there the ring's latency overstates.
  overlap     the gradients' reduction (DDP's all-reduce, the stages' reduce-
              scatter) runs bucket by bucket during backward, BACKWARD_SHARE (2/3)
              of the micro-batch's math (+ its recomputation), the buckets ready
              evenly through it: exposed = max(t / B, t - backward (B-1)/B) for B
              buckets of t in all (the last bucket always shows). All-gathers are
              exposed (Ember prefetches none). The same sharding stage, checkpoint
              mode and per-GPU batch at every count (section 4's recommended row).
  step        accumulate x micro-batch + the exposed communication. Same batch
              per GPU (weak scaling): samples/s = n x batch x accumulate / step;
              speed-up against the fewest nodes that hold the configuration
              (memory as section 4 at that world size), efficiency = speed-up /
              (GPU ratio). Same global batch (strong scaling): the fewest nodes'
              batch split over more GPUs, fewer micro-batches when the
              accumulation divides, else a smaller micro-batch; speed-up = their
              step / this step.
  verdict     a second node (two against one) pays when its efficiency is at
              least PAYS_EFFICIENCY (0.8, as the data-parallel table: at
              efficiency e a sample costs 1/e the GPU-hours), is faster but does
              not pay below it, and costs more than it saves when two nodes give
              fewer samples/s than one; the most nodes that pay.

MEASURE.json, schema 1 (sizes in bytes; written by `RECIPE --measure`)
  schema 1; recipe; device ("cpu" or "cuda:0"); device_name; threads
  batch_size, epochs, accumulate_grad_batches, precision, optimizer: the config's;
                         batch_size at most the training set (the batch the run
                         really uses; planned so when a file says more)
  config_batch_size (optional): data.batch_size as configured, when larger
  host_memory_limit_bytes (optional): tensor bytes the CPU measurement could use
                         (plan.host_memory_gib; 0 = none, on a GPU)
  parameters, trainable_parameters
  parameter_bytes, buffer_bytes
  gradient_bytes         fp32 gradients of the trainable parameters: what
                         data-parallel all-reduces per optimizer step
  optimizer_state_bytes
  forward_macs_per_sample
  train_flops_per_sample forward + backward (6 x MACs unless the recipe knows better)
  forward_graph_nodes, parameter_tensors
                         autograd nodes of one training forward, trainable tensors:
                         the kernels that bound a small model's step (optional)
  step_ops (optional): {eager: E, graph_outside: G or null, graph_inside: I or null,
                         data_loading: D} (per step, means; D, the loader's operators on the
                         training thread, is reported, not planned: a GPU run's loader gathers
                         on its own thread unless the data is resident)
                         ATen ops that launch work (leaf ops, views and allocations
                         excluded) in one optimizer step as configured (E; all
                         accumulate_grad_batches micro-batches), and with
                         trainer.cuda_graph those launched outside the graph per
                         replayed step (G) and inside it (I); G, I null when off
  cuda_graph, optimizer_fused (optional): the config's trainer.cuda_graph and
                         optim.fused (absent: off, and fused, their defaults)
  memory_includes_graph_pool (optional, default false): the probes ran a real
                         CUDA graph, so memory holds its private pool; when
                         false under cuda_graph the plan counts A twice (a graph
                         run holds one step's activations in its pool while the
                         short last batch and evaluation allocate beside it)
  memory: {PRECISION: {"probes": [{"batch", "peak_bytes"}, ...],
                       "fixed_bytes": F, "per_sample_bytes": A}}
                         probes_reduced_from (optional): [small, large] asked for
                         when they did not fit the host and smaller batches were
                         measured instead;
                         peak_bytes: device memory the training loop uses on top
                         of what is resident before it (parameters, buffers,
                         a resident dataset); peak(b) = F + b*A (fitted from the
                         probes by least squares when F, A are absent). Keys:
                         trainer.precision names. A missing tf32 uses fp32's
                         numbers (same storage), a missing fp16-mixed
                         bf16-mixed's (same widths), a missing mixed mode
                         fp32's (an over-estimate of activations, usually);
                         the output says so.
  memory_method          "CPU allocator statistics" or "CUDA caching allocator peak"
  dataset: {train_samples, eval_samples, sample_bytes (input + target per
            sample as batches carry them), disk_bytes (0 = unknown), disk_path,
            resident_bytes (host memory the loaded dataset holds),
            device_resident (optional, default false: the config keeps the
            dataset in GPU memory, data.resident)}
  measured: {samples_per_second, step_seconds, batch, mfu (or null),
             peak_flops, peak_source}: training speed on the measuring machine
             at batch (batch_size, or the largest the host holds when
             batch_size does not fit it)
  verify (optional): {batch, precision, predicted_peak_bytes,
             measured_peak_bytes, resident_bytes}: the fit checked at the
             config's batch (plan.verify=true); shown when present; {batch,
             skipped} when that batch does not fit the measuring host
  Sharding and activation checkpointing (optional; section 4 reads them, and
  estimates what is missing as "Configurations" says):
  blocks: {count, parameter_bytes, largest_parameter_bytes,
           forward_macs_per_sample}: the model's repeated blocks
                         (core::BlockModel::blocks()): how many; the bytes of the
                         parameters inside them, all together and the largest
                         block's (a parameter also used outside its block, a
                         tied weight, counts as outside: ZeRO-3 keeps it whole);
                         their forward MACs per sample, all together
  sharding: {bucket_cap_mb, unit_elements: [elements, ...], gathered_parameter_bytes,
             transient_gradient_bytes}: the config's dist.bucket_cap_mb (0:
                         25 MiB); the units dist.sharding splits one by one
                         (each padded to a multiple of N; ShardedDataParallel::
                         units()); the parameter bytes ZeRO-3 holds gathered at
                         its peak besides its shard; the largest unit's gradient
                         bytes copied flat for its reduce-scatter
  gradient_as_bucket_view (bool, default false): dist.gradient_as_bucket_view
  activation_checkpoint ("none", "full" or "light"; default "none"),
  activation_checkpoint_every (k; 0 = off): the measured config's own mode,
                         which memory.PRECISION's F and A then are
  memory.PRECISION also: activation_checkpoint: {MODE: {probes, fixed_bytes,
                         per_sample_bytes, every}} measured with that mode
                         (fixed_bytes optional: the unchecked F);
                         block_activation_bytes_per_sample (of A, what the blocks
                         save), block_input_bytes_per_sample (the blocks' inputs,
                         all together), largest_block_activation_bytes_per_sample

JSON output (--json): {"schema": 1, "measurement": {...the input's summary},
  "assumptions": {..., step_floor_seconds, step_floor (how), step_launches {cuda_graph,
            eager, graph_outside, graph_inside, counted, text}, launch_us, graph_launch_us,
            kernel_us, graph_pool_doubles_per_sample_bytes, world_size, link, nodes, gpus_per_node,
            intra_link, inter_link, nics_per_node, nccl_latency_us {base, nvlink_hop, pcie_hop,
            network_hop}, backward_share}, "mfu": {PRECISION: {value, source ("--mfu", "run",
            "measurement" or "default"), run, precision_measured, text}},
  "memory_models": {PRECISION: {fixed_bytes, per_sample_bytes, source}},
  "rows": [{gpu, precision, fits, largest_batch, step_seconds, epoch_seconds,
            usd_per_epoch, usd_per_run, ...}], "feeding": {...},
  "data_parallel": {rule, gradient_bytes, gpus: [{gpu, precision, step_seconds,
            links: [{link, gb_s, counts: [{n, allreduce_seconds, efficiency,
            speedup, pays}]}]}]},
  "configurations": {shown, world_size, link, shardings, activation_checkpoints,
            state: {STAGE: {available, parameters, gradients, optimizer_state, gathered_parameters,
                    communication_buffers, how, communication: {collectives: [{op, of ("parameters",
                    "gradients", "block parameters", "other parameters"), per, bytes}],
                    micro_batch_bytes, step_bytes, bytes_per_step}} or {available: false, why}},
            activations: {PRECISION: {MODE: {available, fixed_bytes, per_sample_bytes,
                    estimated, source, every, recompute_factor, recomputed_bytes_per_sample,
                    recompute} or {available: false, why}}},
            rows: [{gpu, precision, sharding, activation_checkpoint, world_size,
                    memory_needed_bytes, memory_parts, fits, largest_batch, link, link_gb_s,
                    communication_bytes, communication_seconds, compute_seconds,
                    recompute_seconds, step_seconds, epoch_seconds, usd_per_run, ...}]},
  "nodes": {shown, nodes, gpus_per_node, world_size, nics_per_node, and when shown: available
            (false: why), gpu, precision, sharding, activation_checkpoint, batch,
            accumulate_grad_batches, global_batch, memory_budget_bytes, links: {intra: {link, gb_s},
            network: {link, gb_s}}, counts: [{nodes, gpus, link, bus_gb_s, memory_needed_bytes, fits,
            compute_seconds, backward_seconds, communication_seconds, exposed_seconds, step_seconds,
            samples_per_second, speedup, efficiency, pays, strong: {batch, accumulate_grad_batches,
            fits, step_seconds, communication_seconds, exposed_seconds, speedup, efficiency, ...} or
            null}], verdict: {second_node ("pays", "does not pay", "costs more than it saves" or
            null), most_paying_nodes, text, strong_text}},
  "recommendation": {gpu, precision, world_size, sharding, activation_checkpoint, text,
            reasons}, "notes": [...]}
Seconds, bytes and USD are plain numbers; null = not applicable (no price, no fit).

Options are checked before anything is read: a value out of range (NaN, an
infinity, a negative price, --price past $10,000/h, ...), or a --price or
--gpu naming no row of the table, is a usage error. --check checks them and
exits (tools/ember plan runs it before measuring).

Exit status: 0 planned, 1 bad input (the message names the file and key), 2 usage.
"""
import argparse
import glob
import json
import math
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

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
# Launches of older measurements without step_ops (see the docstring's "step floor").
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
DEFAULT_GPUS = Path(__file__).resolve().parent / "gpus.toml"
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


class PlanError(Exception):
    """Bad input: the message says where, what, and what to do."""


class UsageError(PlanError):
    """A bad option (a --price or --gpu naming no row of the table): exit 2, like argparse's."""


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


# Sharding (dist.sharding) and activation checkpointing (model.activation_checkpoint_every): the model
# of the docstring's "sharding" and "activation checkpointing", as pure functions of numbers.

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


# ---------------------------------------------------------------------------------------------------
# Inputs

def _where(path, key):
    return f"{path}: '{key}'"


def _number(obj, key, path, minimum=None, integer=False):
    value = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PlanError(f"{_where(path, key)}: expected a number, got {json.dumps(value)} (is this a "
                        f"`RECIPE --measure` file of schema 1? rerun the measurement)")
    if integer and value != int(value):
        raise PlanError(f"{_where(path, key)}: expected a whole number, got {value}")
    if minimum is not None and value < minimum:
        raise PlanError(f"{_where(path, key)}: {value} is below {minimum}")
    return int(value) if integer else float(value)


def load_measurement(path):
    """MEASURE.json, checked: a dict with the schema-1 keys this script reads."""
    path = Path(path)
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: not found (write it with `RECIPE --measure {path}`)") from None
    except (OSError, ValueError) as e:
        raise PlanError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(m, dict):
        raise PlanError(f"{path}: a JSON {type(m).__name__}, expected an object")
    if m.get("schema") != 1:
        raise PlanError(f"{_where(path, 'schema')}: {json.dumps(m.get('schema'))}, this plan.py reads "
                        f"schema 1 (update tools/plan/plan.py or remeasure)")
    for key in ("recipe", "device", "precision"):
        if not isinstance(m.get(key), str):
            raise PlanError(f"{_where(path, key)}: expected a string, got {json.dumps(m.get(key))}")
    for key in ("batch_size", "epochs", "accumulate_grad_batches"):
        _number(m, key, path, minimum=1, integer=True)
    for key in ("parameters", "parameter_bytes", "buffer_bytes", "gradient_bytes", "optimizer_state_bytes"):
        _number(m, key, path, minimum=0)
    _number(m, "train_flops_per_sample", path, minimum=1)
    data = m.get("dataset")
    if not isinstance(data, dict):
        raise PlanError(f"{_where(path, 'dataset')}: expected an object")
    _number(data, "train_samples", f"{path}: dataset", minimum=1, integer=True)
    for key in ("eval_samples", "sample_bytes", "disk_bytes", "resident_bytes"):
        _number(data, key, f"{path}: dataset", minimum=0)
    memory = m.get("memory")
    if not isinstance(memory, dict) or not memory:
        raise PlanError(f"{_where(path, 'memory')}: expected an object with at least 'fp32'")
    for name, entry in memory.items():
        where = f"{path}: memory.{name}"
        if not isinstance(entry, dict):
            raise PlanError(f"{where}: expected an object")
        if "fixed_bytes" not in entry or "per_sample_bytes" not in entry:
            try:
                entry["fixed_bytes"], entry["per_sample_bytes"] = fit_memory(entry.get("probes") or [])
            except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
                raise PlanError(f"{where}: no fixed_bytes/per_sample_bytes and the probes cannot give "
                                f"them ({e})") from None
        _number(entry, "fixed_bytes", where)
        if _number(entry, "per_sample_bytes", where) <= 0:
            raise PlanError(f"{where}: per_sample_bytes {entry['per_sample_bytes']} must be positive "
                            f"(probes too close together? measure at batches further apart: "
                            f"plan.probe_small, plan.probe_large)")
    for key in ("cuda_graph", "optimizer_fused", "memory_includes_graph_pool"):
        if key in m and not isinstance(m[key], bool):
            raise PlanError(f"{_where(path, key)}: expected true or false, got {json.dumps(m[key])}")
    ops = m.get("step_ops")
    if ops is not None:
        if not isinstance(ops, dict):
            raise PlanError(f"{_where(path, 'step_ops')}: expected an object "
                            f"{{eager, graph_outside, graph_inside}}")
        for key in ("eager", "graph_outside", "graph_inside"):
            if ops.get(key) is not None:  # null: not counted (the graph's counts when cuda_graph is off)
                # Means over the counted steps: a read every 8 steps makes a fraction.
                ops[key] = _number(ops, key, f"{path}: step_ops", minimum=1 if key == "eager" else 0)
    _check_scaling_fields(m, path)
    return m


def _optional_number(obj, key, where, minimum=0, integer=False):
    """obj[key] checked when present (None: absent or null)."""
    if not isinstance(obj, dict) or obj.get(key) is None:
        return None
    return _number(obj, key, where, minimum=minimum, integer=integer)


def _check_scaling_fields(m, path):
    """The optional fields that sharding and activation checkpointing read (docstring: MEASURE.json)."""
    blocks = m.get("blocks")
    if blocks is not None:
        where = f"{path}: blocks"
        if not isinstance(blocks, dict):
            raise PlanError(f"{where}: expected an object {{count, parameter_bytes, largest_parameter_bytes, "
                            f"forward_macs_per_sample}}")
        _number(blocks, "count", where, minimum=1, integer=True)
        for key in ("parameter_bytes", "largest_parameter_bytes", "forward_macs_per_sample"):
            _optional_number(blocks, key, where)
        total, largest = blocks.get("parameter_bytes"), blocks.get("largest_parameter_bytes")
        if total is not None and total > m["parameter_bytes"]:
            raise PlanError(f"{where}: parameter_bytes {total:g} is more than the model's parameter_bytes "
                            f"{m['parameter_bytes']:g} (blocks count only the parameters inside the blocks)")
        if total is not None and largest is not None and largest > total:
            raise PlanError(f"{where}: largest_parameter_bytes {largest:g} is more than all blocks' "
                            f"parameter_bytes {total:g}")
    sharding = m.get("sharding")
    if sharding is not None:
        where = f"{path}: sharding"
        if not isinstance(sharding, dict):
            raise PlanError(f"{where}: expected an object {{bucket_cap_mb, unit_elements, gathered_parameter_bytes, "
                            f"transient_gradient_bytes}}")
        units = sharding.get("unit_elements")
        if units is not None and not (isinstance(units, list) and units and all(
                isinstance(u, int) and not isinstance(u, bool) and u >= 1 for u in units)):
            raise PlanError(f"{where}: 'unit_elements': expected a list of element counts >= 1, one per piece "
                            f"the sharding splits, got {json.dumps(units)[:80]}")
        for key in ("bucket_cap_mb", "gathered_parameter_bytes", "transient_gradient_bytes"):
            _optional_number(sharding, key, where)
    if "gradient_as_bucket_view" in m and not isinstance(m["gradient_as_bucket_view"], bool):
        raise PlanError(f"{_where(path, 'gradient_as_bucket_view')}: expected true or false, got "
                        f"{json.dumps(m['gradient_as_bucket_view'])}")
    mode = m.get("activation_checkpoint", "none")
    if mode not in CHECKPOINT_MODES:
        raise PlanError(f"{_where(path, 'activation_checkpoint')}: {json.dumps(mode)}, expected one of "
                        f"{', '.join(CHECKPOINT_MODES)} (the mode the measured config trains with)")
    _optional_number(m, "activation_checkpoint_every", str(path), minimum=0, integer=True)
    for name, entry in m["memory"].items():
        where = f"{path}: memory.{name}"
        for key in ("block_activation_bytes_per_sample", "block_input_bytes_per_sample",
                    "largest_block_activation_bytes_per_sample"):
            _optional_number(entry, key, where)
        modes = entry.get("activation_checkpoint")
        if modes is None:
            continue
        if not isinstance(modes, dict) or not set(modes) <= set(CHECKPOINT_MODES):
            raise PlanError(f"{where}.activation_checkpoint: expected an object keyed by "
                            f"{', '.join(CHECKPOINT_MODES)}, got {json.dumps(modes)[:80]}")
        for mode_name, measured in modes.items():
            at = f"{where}.activation_checkpoint.{mode_name}"
            if not isinstance(measured, dict):
                raise PlanError(f"{at}: expected an object {{probes, fixed_bytes, per_sample_bytes}}")
            if "per_sample_bytes" not in measured:
                try:
                    measured["fixed_bytes"], measured["per_sample_bytes"] = fit_memory(measured.get("probes") or [])
                except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
                    raise PlanError(f"{at}: no per_sample_bytes and the probes cannot give it ({e})") from None
            _optional_number(measured, "fixed_bytes", at, minimum=None)
            if _number(measured, "per_sample_bytes", at) <= 0:
                raise PlanError(f"{at}: per_sample_bytes {measured['per_sample_bytes']} must be positive")
            _optional_number(measured, "every", at, minimum=1, integer=True)


def load_gpus(path):
    """The GPU table: a list of dicts with GPU_FIELDS, name and source checked."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: not found (pass --gpus FILE; the default is {DEFAULT_GPUS})") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise PlanError(f"{path}: not a readable TOML file ({e})") from None
    gpus = table.get("gpu")
    if not isinstance(gpus, list) or not gpus:
        raise PlanError(f"{path}: no [[gpu]] tables")
    names = set()
    for i, gpu in enumerate(gpus):
        where = f"{path}: gpu #{i + 1}"
        if not isinstance(gpu.get("name"), str) or not gpu["name"]:
            raise PlanError(f"{where}: 'name' missing")
        where = f"{path}: gpu '{gpu['name']}'"
        if gpu["name"].lower() in names:
            raise PlanError(f"{where}: the name appears twice")
        names.add(gpu["name"].lower())
        for key in GPU_FIELDS:
            _number(gpu, key, where, minimum=0)
        if gpu["memory_gib"] <= 0 or gpu["fp32_tflops"] <= 0:
            raise PlanError(f"{where}: memory_gib and fp32_tflops must be positive")
        if int(gpu["pcie_gen"]) not in PCIE_GB_S:
            raise PlanError(f"{where}: pcie_gen {gpu['pcie_gen']}: expected one of {sorted(PCIE_GB_S)}")
        if "usd_per_hour" in gpu:
            _number(gpu, "usd_per_hour", where, minimum=0)
    return gpus


def parse_price(item):
    """"L4=0.80" -> ("L4", 0.8); UsageError unless GPU=USD with 0 <= USD <= MAX_USD_PER_HOUR."""
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
        raise UsageError(f"--price {item}: expected GPU=USD_PER_HOUR (e.g. --price L4=0.80)")
    try:
        usd = float(value)
    except ValueError:
        usd = math.nan
    if not math.isfinite(usd) or not 0 <= usd <= MAX_USD_PER_HOUR:
        raise UsageError(f"--price {item}: '{value}' is not a price in USD per GPU-hour (a number from 0 to "
                         f"{MAX_USD_PER_HOUR:g}, e.g. --price L4=0.80)")
    return name.strip(), usd


def parse_prices(items, gpus):
    """["L4=0.8", "H100=2.5", ...] -> {"L4": 0.8, "H100-SXM": 2.5, "H100-PCIe": 2.5}, keyed by the
    table's spelling. A name matches a row exactly, or every row of its family (H100 -> H100-SXM
    and H100-PCIe); an exact name wins over its family's price whatever the order."""
    names = [g["name"] for g in gpus]
    family, exact = {}, {}
    for item in items:
        name, usd = parse_price(item)
        key = name.lower()
        matches = [n for n in names if n.lower() == key]
        if matches:
            exact[matches[0]] = usd
            continue
        matches = [n for n in names if n.lower().startswith(key + "-")]
        if not matches:
            raise UsageError(f"--price {item}: no GPU '{name}' in the table; known: {', '.join(names)}")
        family.update((n, usd) for n in matches)
    return {**family, **exact}


@dataclass
class Calibration:
    """An MFU measured on a GPU: a run folder's summary.json or the measurement itself."""
    value: float
    source: str  # "--mfu", "run", "measurement" or "default"
    precision: str | None = None  # the precision it was measured in
    run: str | None = None  # the run folder, for source "run"
    device: str | None = None


def find_run_calibrations(runs_dir, recipe):
    """CUDA runs of `recipe` under `runs_dir` with a monitor.mfu, newest first."""
    found = []
    for summary_path in glob.glob(str(Path(runs_dir) / (glob.escape(recipe) + "*") / "summary.json")):
        summary_path = Path(summary_path)
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
            mtime = summary_path.stat().st_mtime
        except (OSError, ValueError):
            continue  # an unreadable summary is no calibration; report.py is the place to complain
        if not isinstance(summary, dict) or summary.get("recipe", recipe) != recipe:
            continue
        device = summary.get("device")
        mfu = (summary.get("monitor") or {}).get("mfu") if isinstance(summary.get("monitor"), dict) else None
        if not (isinstance(device, str) and device.startswith("cuda")):
            continue
        if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
            continue
        found.append((mtime, Calibration(float(mfu), "run", summary.get("precision"),
                                         str(summary_path.parent), device)))
    found.sort(key=lambda t: (t[0], t[1].run), reverse=True)
    return [c for _, c in found]


def choose_mfu(precision, mfu_flag, runs, measurement):
    """The MFU for one precision: --mfu; a run of that precision; the measurement's own when it
    ran on CUDA in that precision; a run of another precision; the measurement in another;
    DEFAULT_MFU."""
    if mfu_flag is not None:
        return Calibration(mfu_flag, "--mfu")
    measured = measurement.get("measured") or {}
    mine = None
    if str(measurement.get("device", "")).startswith("cuda"):
        value = measured.get("mfu")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1:
            mine = Calibration(float(value), "measurement", measurement["precision"], None,
                               measurement["device"])
    for candidates in ([c for c in runs if c.precision == precision],
                       [mine] if mine and mine.precision == precision else [], runs, [mine] if mine else []):
        if candidates:
            return candidates[0]
    return Calibration(DEFAULT_MFU, "default")


def describe_mfu(cal):
    if cal.source == "--mfu":
        return "--mfu"
    if cal.source == "default":
        return "default: no CUDA run with monitor.mfu found"
    where = f"run {cal.run}" if cal.source == "run" else "this measurement"
    return f"calibrated: {where} ({cal.device}, {cal.precision})"


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
    """(F, A, source) for a precision, falling back as the docstring says; A x 2 when
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
    docstring (tf32: fp32's; fp16-mixed: bf16-mixed's; else fp32's; else any)."""
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


def recommend(m, rows, dp, config_precision):
    """{"gpu", "precision", "text", "reasons"}: the rule of the docstring's "recommendation"."""
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


# ---------------------------------------------------------------------------------------------------
# Sharding and activation checkpointing at --world-size GPUs (the docstring's "configurations")

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
    full and light are otherwise estimated from "none" and the blocks (docstring). A x 2 under
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
    the docstring's "recommendation" over configurations: the cheapest per run where the config's
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


# ---------------------------------------------------------------------------------------------------
# Several nodes (the docstring's "nodes"): the recommended configuration on 1, 2, 4, ... nodes

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
        "recommendation": recommendation,
        "notes": notes,
    }
    return plan


# ---------------------------------------------------------------------------------------------------
# Text output

def fmt_bytes(n):
    n = float(n)
    if n >= GIB:
        return f"{n / GIB:.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n:.0f} B"


def fmt_rate(bytes_per_s):
    return f"{bytes_per_s / 1e9:.2f} GB/s" if bytes_per_s >= 1e9 else f"{bytes_per_s / 1e6:.1f} MB/s"


def fmt_seconds(s):
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def fmt_usd(x):
    if x is None:
        return "-"
    if x >= 100:
        return f"${x:,.0f}"
    if x >= 0.995:
        return f"${x:.2f}"
    if x >= 0.001:
        return f"${x:.3f}"
    return "<$0.001"


def fmt_si(x):
    """29e6 -> "29.0 M": a count with a decimal prefix."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f} {prefix}"
    return f"{x:.0f}"


def fmt_count(n):
    return f"{n:,.0f}"


def table(headers, rows, right=()):
    """Columns separated by two spaces; columns named in `right` right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = []
    for cells in [headers] + rows:
        parts = [str(c).rjust(w) if h in right else str(c).ljust(w) for c, w, h in zip(cells, widths, headers)]
        lines.append("  ".join(parts).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


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
    headers = ["GPU", "GiB", "precision", "fits", "max batch", "TFLOP/s", "step", "epoch"]
    headers += ["$/h", "$/epoch", "$/run"] if priced else []
    body, last = [], None
    for r in plan["rows"]:
        timing = r["fits"]  # times and costs of a batch that does not fit would mislead
        cells = [r["precision"], "yes" if r["fits"] else "no",
                 fmt_count(r["largest_batch"]) if r["largest_batch"] else "none", f"{r['peak_tflops']:g}",
                 (fmt_seconds(r["step_seconds"]) + ("*" if r["launch_bound"] else "")) if timing else "-",
                 fmt_seconds(r["epoch_seconds"]) if timing else "-"]
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
    out.append(table(headers, body, right={"GiB", "max batch", "TFLOP/s", "step", "epoch", "$/h", "$/epoch",
                                           "$/run"}))
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

    for note in plan["notes"]:
        out.append(f"note: {note}")
    rec = plan["recommendation"]
    out.append("")
    out.append(f"Recommendation: {rec['text']}" + (f": {'; '.join(rec['reasons'])}" if rec["reasons"] else ""))
    return "\n".join(out)


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
    heads += (["link", "comm"] if n > 1 else []) + ["step", "epoch"] + (["$/run"] if priced else []) + [""]
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
        heads, body, right={"GiB", "memory", "max batch", "comm", "step", "epoch", "$/run"}).split("\n"))
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
    heads = ["nodes", "GPUs", "bound by", "busbw", "memory", "fits", "comm", "exposed", "step", "samples/s",
             "speed-up", "efficiency"]
    body = []
    for c in nd["counts"]:
        timing = c["speedup"] is not None  # times of a count that cannot hold the configuration would mislead
        body.append([str(c["nodes"]), str(c["gpus"]), c["link"] or "-",
                     f"{c['bus_gb_s']:g} GB/s" if c["bus_gb_s"] else "-", fmt_bytes(c["memory_needed_bytes"]),
                     "yes" if c["fits"] else "no", fmt_seconds(c["communication_seconds"]) if timing else "-",
                     fmt_seconds(c["exposed_seconds"]) if timing else "-",
                     fmt_seconds(c["step_seconds"]) if timing else "-",
                     fmt_count(c["samples_per_second"]) if timing else "-",
                     f"{c['speedup']:.2f}x" if timing else "-", f"{c['efficiency']:.2f}" if timing else "-"])
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


def parse_args(argv):
    p = argparse.ArgumentParser(description="GPU-rental plan from a `RECIPE --measure` file; the top of "
                                            "tools/plan/plan.py documents the model, its constants and both JSON "
                                            "formats (tools/ember plan --help prints it).")
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
        raise UsageError(f"--intra-link links the GPUs inside a node, but each node has one GPU: give "
                         f"--gpus-per-node G with G > 1 (e.g. --gpus-per-node 8)")
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
        return 2 if isinstance(e, UsageError) else 1
    print(json.dumps(plan, indent=1) if args.json else render(plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
