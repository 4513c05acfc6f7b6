#!/usr/bin/env python3
"""tools/plan/plan.py: the arithmetic against hand computations, and the plan's shape.

1. Ring all-reduce time and scaling efficiency, numbers written out.
2. Largest batch: the bytes that fit, one sample short, none at all.
3. A 1.5B-parameter AdamW model fits no batch on a T4 and fits an H200.
4. Step, epoch and cost arithmetic, with accumulation and the launch floor.
5. The step floor follows what the configured step launches: a fused optimizer
   launches per parameter group, not per tensor (checked against the ops torch's
   own fused optimizers dispatch, when torch is installed); a CUDA graph's floor
   is below the eager one for a launch-bound model, and is the device's time
   when nothing launches outside the graph; older files are estimated.
6. Graph mode's memory: per-sample bytes twice from a CPU measurement, once from
   a CUDA one that held the graph's pool.
7. The calibrated MFU from fake run folders (CUDA runs only, precision preferred).
8. --json: valid JSON (no NaN), every documented key; the text output's sections.
9. gpus.toml's peaks equal Ember's C++ table (lib/src/core/flops.cpp).
10. Sharding, as dist::ShardedDataParallel does it: the ZeRO paper's 120 / 31.4
    / 16.6 / 1.9 GB (7.5B parameters in blocks, 64 GPUs; ZeRO-1's kept shard of
    the reduced gradient on top), ZeRO-3 with embeddings outside the blocks
    (kept whole); 1/N with padding per piece; bytes sent per stage (ZeRO-1 =
    ZeRO-2 = DDP, ZeRO-3 = 1.5x DDP with every parameter in a block;
    accumulation; ZeRO-3's all-gathers of the blocks per micro-batch, of the
    rest per step); links; the memory parts (DDP's bucket copy, the sharded
    stages' one unit copied flat, dist.bucket_cap_mb, ZeRO-3's two gathered
    blocks); no ZeRO-3 without blocks; one GPU's configuration = the plan's row.
11. Checkpointing: the estimates by hand, measured fields winning, the graph
    rule, nothing estimated without blocks.
12. The recommendation at N GPUs: plain DDP when it fits, else the cheapest
    stage (ZeRO-1 over ZeRO-2 at the same traffic, ZeRO-2 where ZeRO-1's whole
    gradients do not fit); checkpointing on one GPU; accumulation; nothing fits
    (and the world size that would); data-parallel only where DDP's buckets
    fit; docs/planning.md's example is what the planner prints.
13. Options: bad values exit 2; tools/ember forwards every planner option.
14. Nodes: the ring's bus bandwidth, NCCL's latency, the overlap with backward and
    a plan of 1 and 2 nodes by hand; the verdict flips from pays to costs more
    than it saves when the network between nodes gets slow; contradictory
    --world-size / --nodes / --gpus-per-node and misplaced link flags exit 2;
    the older --world-size and --link plan as before; docs/planning.md's
    example is what the planner prints.

    python3 tests/tools/plan_test.py [-v]
"""
import contextlib
import copy
import importlib.util
import io
import json
import math
import os
import re
import tempfile
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "tools" / "plan_measure_example.json"
GPUS = ROOT / "tools" / "plan" / "gpus.toml"

_spec = importlib.util.spec_from_file_location("plan", ROOT / "tools" / "plan" / "plan.py")
plan = importlib.util.module_from_spec(_spec)  # the command line: parse_args, main
_spec.loader.exec_module(plan)  # (it put tools/ on sys.path: the planner's parts, below)
from embertools.plan import arithmetic, constants, formats  # noqa: E402
from embertools.plan import inputs as plan_inputs, nodes as plan_nodes  # noqa: E402

GIB = 1024**3


def run_main(argv):
    """(exit status, stdout, stderr) of plan.main(argv)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = plan.main([str(a) for a in argv])
        except SystemExit as e:  # argparse's usage errors
            status = e.code
    return status, out.getvalue(), err.getvalue()


def big_model():
    """A 1.5B-parameter model trained with AdamW in fp32: 6 GB parameters, 6 GB gradients,
    12 GB Adam moments, 0.5 GB of activations per sample."""
    m = json.loads(EXAMPLE.read_text())
    m.update(recipe="big_lm", batch_size=8, epochs=1, optimizer="adamw", precision="bf16-mixed",
             parameters=1_500_000_000, trainable_parameters=1_500_000_000,
             parameter_bytes=6_000_000_000, buffer_bytes=0, gradient_bytes=6_000_000_000,
             optimizer_state_bytes=12_000_000_000, forward_macs_per_sample=3_000_000_000_000,
             train_flops_per_sample=18_000_000_000_000)
    # F = gradients + moments + 0.5 GB workspaces.
    m["memory"] = {"fp32": {"probes": [], "fixed_bytes": 18_500_000_000, "per_sample_bytes": 500_000_000},
                   "bf16-mixed": {"probes": [], "fixed_bytes": 21_500_000_000, "per_sample_bytes": 300_000_000}}
    m["dataset"] = {"train_samples": 100_000, "eval_samples": 1_000, "sample_bytes": 8192.0,
                    "disk_bytes": 400_000_000, "disk_path": "/data/tokens", "resident_bytes": 800_000_000}
    return m


def small_model(**fields):
    """The example measurement (FashionNet on the CPU: launch-bound on every GPU) with `fields`, e.g.
    step_ops and cuda_graph, as `RECIPE --measure` writes them."""
    m = json.loads(EXAMPLE.read_text())
    m.update(fields)
    return m


def torch_or_none():
    try:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return None, None
    return torch, TorchDispatchMode


def write_json(folder, name, obj):
    path = Path(folder) / name
    path.write_text(json.dumps(obj))
    return path


class Arithmetic(unittest.TestCase):
    def test_allreduce_by_hand(self):
        # 4 GPUs, 100 MB over 25 GB/s: 2 * 3/4 * 1e8 / 25e9 = 1.5e8 / 2.5e10 = 0.006 s.
        self.assertAlmostEqual(arithmetic.allreduce_seconds(1e8, 4, 25e9), 0.006, places=12)
        # 2 GPUs send half each way twice: 2 * 1/2 * 1e8 / 25e9 = 0.004 s.
        self.assertAlmostEqual(arithmetic.allreduce_seconds(1e8, 2, 25e9), 0.004, places=12)
        # 8 GPUs, FashionNet's 874,344 gradient bytes over 25 GbE (3.125 GB/s):
        # 2 * 7/8 * 874,344 = 1,530,102 bytes / 3.125e9 = 4.8963264e-4 s.
        self.assertAlmostEqual(arithmetic.allreduce_seconds(874_344, 8, 3.125e9), 4.8963264e-4, places=12)
        self.assertEqual(arithmetic.allreduce_seconds(1e9, 1, 1e9), 0.0)
        # With a 1 ms step: 1 / (1 + 0.48963264) = 0.671308...; below 0.8, so it does not pay.
        eff = arithmetic.scaling_efficiency(1e-3, 4.8963264e-4)
        self.assertAlmostEqual(eff, 1 / 1.48963264, places=12)
        self.assertLess(eff, constants.PAYS_EFFICIENCY)
        # 6 GB of gradients on 8 H100s over NVLink (450 GB/s): 1.75 * 6e9 / 450e9 = 0.0233 s.
        self.assertAlmostEqual(arithmetic.allreduce_seconds(6e9, 8, 450e9), 0.023333333333, places=9)

    def test_largest_batch_by_hand(self):
        # 16 GiB, 10% margin: 0.9 * 17,179,869,184 = 15,461,882,265.6 bytes.
        budget = arithmetic.memory_budget(16, 0.10)
        self.assertAlmostEqual(budget, 15_461_882_265.6, places=3)
        # Minus 0.5 GiB context (536,870,912), 1e9 resident, F 2e9:
        # room 11,925,011,353.6 -> 119 samples of 1e8 bytes.
        args = dict(fixed_bytes=2e9, per_sample_bytes=1e8, resident_bytes=1e9, context_bytes=0.5 * GIB)
        self.assertEqual(arithmetic.largest_batch(budget, **args), 119)
        self.assertLessEqual(arithmetic.memory_needed(119, **args), budget)
        self.assertGreater(arithmetic.memory_needed(120, **args), budget)
        self.assertEqual(arithmetic.memory_needed(119, **args), 0.5 * GIB + 1e9 + 2e9 + 119 * 1e8)
        # One sample short of fitting, and nothing left at all.
        self.assertEqual(arithmetic.largest_batch(3.5 * GIB, 2 * GIB, GIB + 1, 0, 0.5 * GIB), 0)
        self.assertEqual(arithmetic.largest_batch(3.5 * GIB, 2 * GIB, GIB, 0, 0.5 * GIB), 1)
        self.assertEqual(arithmetic.largest_batch(GIB, 2 * GIB, 1, 0, 0), 0)

    def test_fit_memory_from_probes(self):
        fixed, per_sample = arithmetic.fit_memory([{"batch": 8, "peak_bytes": 7_046_000},
                                             {"batch": 32, "peak_bytes": 21_734_000}])
        self.assertAlmostEqual(per_sample, 612_000, places=6)  # (21,734,000 - 7,046,000) / 24
        self.assertAlmostEqual(fixed, 2_150_000, places=3)
        with self.assertRaises(ValueError):
            arithmetic.fit_memory([{"batch": 8, "peak_bytes": 1}])

    def test_epoch_time_and_cost_by_hand(self):
        # 50,000 samples, batch 256, 1e10 FLOPs/sample, 312 TFLOP/s at MFU 0.4:
        # a batch is 2.56e12 / 1.248e14 = 0.0205128 s; ceil(50000/256) = 196 batches = 4.0205128 s.
        step, bound = arithmetic.step_seconds(256, 1e10, 312e12, 0.4, 1e-3)
        self.assertAlmostEqual(step, 2.56e12 / 1.248e14, places=12)
        self.assertFalse(bound)
        epoch = arithmetic.epoch_seconds(50_000, 256, 1e10, 312e12, 0.4, 1e-3)
        self.assertAlmostEqual(epoch, 196 * 2.56e12 / 1.248e14, places=9)
        # At $2.00 per hour: 4.0205128 / 3600 * 2 = $0.00223362.
        self.assertAlmostEqual(arithmetic.cost_usd(epoch, 2.0), epoch / 1800, places=12)
        self.assertAlmostEqual(arithmetic.cost_usd(3600, 2.5), 2.5)
        self.assertIsNone(arithmetic.cost_usd(epoch, None))
        # Accumulation: 4 micro-batches per optimizer step.
        self.assertAlmostEqual(arithmetic.step_seconds(256, 1e10, 312e12, 0.4, 1e-3, accumulate=4)[0], 4 * step)
        # FashionNet on an H100 in bf16: 128 * 28,984,320 / (989e12 * 0.3) = 12.5 us < 1 ms: the floor.
        step, bound = arithmetic.step_seconds(128, 28_984_320, 989e12, 0.3, 1e-3)
        self.assertEqual(step, 1e-3)
        self.assertTrue(bound)
        self.assertAlmostEqual(arithmetic.epoch_seconds(60_000, 128, 28_984_320, 989e12, 0.3, 1e-3), 0.469)

    def test_host_ram(self):
        # 55,440,000 resident + 3 staged batches of 128 x 792 B = 55,744,128 bytes.
        self.assertEqual(arithmetic.host_ram_bytes(55_440_000, 128, 792.0), 55_744_128)


class StepFloor(unittest.TestCase):
    """The floor is what the configured step launches, not a fixed formula."""
    US = 1e-6

    def floor(self, m, **kw):
        return arithmetic.step_floor(m, None, kw.get("launch_us", constants.LAUNCH_US),
                               kw.get("graph_launch_us", constants.GRAPH_LAUNCH_US), kw.get("kernel_us", constants.KERNEL_US))

    def test_fused_optimizer_launches_per_group_not_per_tensor(self):
        launches = arithmetic.optimizer_launches
        for name in ("sgd", "adam", "adamw"):
            for fp16 in (False, True):
                fused = [arithmetic.optimizer_launches(name, True, n, fp16) for n in (2, 16, 160)]
                unfused = [arithmetic.optimizer_launches(name, False, n, fp16) for n in (2, 16, 160)]
                self.assertEqual(len(set(fused)), 1, (name, fp16, fused))  # the tensor count does not matter
                # LibTorch's: the same launches for every tensor, 14 more tensors then 144 more.
                self.assertEqual((unfused[2] - unfused[1]) * 14, (unfused[1] - unfused[0]) * 144, (name, unfused))
                self.assertGreater(unfused[1], unfused[0])
                for f, u in zip(fused, unfused):
                    self.assertLess(f, u, (name, fp16))
            # Loss scaling adds launches.
            self.assertGreater(launches(name, True, 16, True), launches(name, True, 16, False))
        # Adam's step count is taken back on a skipped step (_foreach_sub_); SGD has no count.
        scaler = constants.GRAD_SCALER_KERNELS
        self.assertEqual(launches("sgd", True, 16, True) - launches("sgd", True, 16, False), scaler)
        self.assertGreater(launches("adam", True, 16, True) - launches("adam", True, 16, False), scaler)
        # Adam does more per step than SGD, fused or not.
        self.assertGreater(launches("adamw", True, 16, False), launches("sgd", True, 16, False))
        self.assertGreater(launches("adamw", False, 16, False), launches("sgd", False, 16, False))

    @unittest.skipIf(torch_or_none()[0] is None, "torch is not installed in this Python")
    def test_fused_counts_are_what_torch_dispatches(self):
        """Ember's fused optimizers call the ATen ops that torch.optim's fused=True path calls, per
        (device, dtype) bucket of each group (train/fused_optim.cpp on CUDA); LibTorch's SGD is
        Python's single-tensor SGD. Count the ops one step dispatches (torch on the CPU: the same ops)."""
        torch, mode = torch_or_none()
        not_work = {"_record_function_enter_new", "_record_function_exit"}  # profiler markers

        class Count(mode):
            def __init__(self):
                super().__init__()
                self.ops = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.overloadpacket.__name__ not in not_work:
                    self.ops.append(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        def launches(cls, n, scaled, **options):
            torch.manual_seed(0)
            params = [torch.nn.Parameter(torch.randn(8, 8) if i % 2 == 0 else torch.randn(8)) for i in range(n)]
            # Ember's two groups: weight decay on the matrices, none on the vectors.
            opt = cls([{"params": params[0::2]}, {"params": params[1::2], "weight_decay": 0.0}], **options)
            for p in params:
                p.grad = torch.randn_like(p)
            opt.step()  # state made: the next step is a steady one
            if scaled:  # what GradScaler hands a fused optimizer (fp16-mixed)
                opt.grad_scale, opt.found_inf = torch.tensor(1.0), torch.tensor(0.0)
            counter = Count()
            with counter:
                opt.step()
            return counter.ops

        classes = {"sgd": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=5e-4)),
                   "adam": (torch.optim.Adam, dict(lr=1e-3, weight_decay=1e-4)),
                   "adamw": (torch.optim.AdamW, dict(lr=1e-3, weight_decay=1e-2))}
        for name, (cls, options) in classes.items():
            for n in (4, 40):
                for scaled in (False, True):
                    ops = launches(cls, n, scaled, fused=True, **options)
                    expected = arithmetic.optimizer_launches(name, True, n, scaled)
                    expected -= constants.GRAD_SCALER_KERNELS if scaled else 0  # the scaler's own are not the step's
                    self.assertEqual(len(ops), expected, (name, n, scaled, ops))
        # LibTorch's SGD (optim.fused=false) is torch's single-tensor SGD: per tensor add (weight
        # decay), mul_ + add_ (momentum), add_. The plan counts the decay for every tensor; here the
        # 10 vectors' group has none.
        cls, options = classes["sgd"]
        ops = launches(cls, 20, False, foreach=False, **options)
        self.assertEqual(len(ops) + 10, arithmetic.optimizer_launches("sgd", False, 20, False), ops)

    def test_estimate_of_an_older_measurement(self):
        # No step_ops: 3 kernels per forward node + the optimizer's; fused (or not saying) launches per group.
        old = small_model(forward_graph_nodes=40, parameter_tensors=16)
        unfused = dict(old, optimizer_fused=False)
        fused = dict(old, optimizer_fused=True)
        f_old, how_old = self.floor(old)
        f_fused, _ = self.floor(fused)
        f_unfused, how_unfused = self.floor(unfused)
        self.assertEqual(f_old, f_fused)  # not saying = Ember's default, fused
        self.assertIn("fused assumed", how_old)
        self.assertLess(f_fused, f_unfused)
        saved = arithmetic.optimizer_launches("sgd", False, 16, False) - arithmetic.optimizer_launches("sgd", True, 16, False)
        self.assertAlmostEqual(f_unfused - f_fused, saved * constants.LAUNCH_US * self.US, places=12)
        self.assertIn("LibTorch's sgd", how_unfused)
        # The forward's nodes still count: a deeper model has a higher floor, the optimizer unchanged.
        self.assertGreater(self.floor(dict(old, forward_graph_nodes=80))[0], f_old)
        # fp16-mixed adds the GradScaler's launches.
        self.assertGreater(self.floor(dict(old, precision="fp16-mixed"))[0], f_old)
        # Nothing counted: the constant.
        self.assertEqual(self.floor(small_model())[0], constants.STEP_FLOOR_MS / 1000)
        self.assertEqual(arithmetic.step_floor(old, 2.5, 5.0)[0], 0.0025)  # --step-floor-ms wins

    def test_counted_eager_step(self):
        m = small_model(step_ops={"eager": 200, "graph_outside": None, "graph_inside": None}, cuda_graph=False,
                        optimizer_fused=True, forward_graph_nodes=40, parameter_tensors=16)
        floor, how = self.floor(m)
        # The host launches every op; the device runs each faster than that: the host's time is the floor.
        self.assertAlmostEqual(floor, 200 * constants.LAUNCH_US * self.US, places=12)
        self.assertGreater(constants.LAUNCH_US, constants.KERNEL_US)
        self.assertIn("200 ops", how)
        # The counts win over the estimate from nodes and tensors; twice the ops, twice the floor.
        self.assertAlmostEqual(self.floor(dict(m, step_ops={"eager": 400}))[0], 2 * floor, places=12)
        # A device slower than the host's launches bounds the step instead.
        slow, how = self.floor(m, kernel_us=8.0)
        self.assertAlmostEqual(slow, 200 * 8.0 * self.US, places=12)
        self.assertIn("on the device", how)
        # Accumulation: the count is one optimizer step's; the floor per micro-batch is its share, so
        # a launch-bound optimizer step costs the count's launches once.
        acc = dict(m, accumulate_grad_batches=4)
        per_micro, how = self.floor(acc)
        self.assertIn("/ 4", how)
        step, bound = arithmetic.step_seconds(128, 1.0, 1e15, 0.3, per_micro, accumulate=4)
        self.assertTrue(bound)
        self.assertAlmostEqual(step, 200 * constants.LAUNCH_US * self.US, places=12)

    def test_graph_floor(self):
        eager = small_model(step_ops={"eager": 200, "graph_outside": None, "graph_inside": None},
                            cuda_graph=False, optimizer_fused=True)
        graph = small_model(step_ops={"eager": 200, "graph_outside": 12, "graph_inside": 198},
                            cuda_graph=True, optimizer_fused=True)
        f_eager, _ = self.floor(eager)
        f_graph, how = self.floor(graph)
        # One graph launch instead of 200: the floor drops, yet never below what the device must run.
        self.assertLess(f_graph, f_eager)
        self.assertGreaterEqual(f_graph, (198 + 12) * constants.KERNEL_US * self.US)
        self.assertIn("198 ops inside", how)
        self.assertIn("--kernel-us", how)
        # Nothing outside the graph: the floor is the device's time for the graph's kernels alone.
        bare = dict(graph, step_ops={"eager": 200, "graph_outside": 0, "graph_inside": 198})
        self.assertAlmostEqual(self.floor(bare)[0], 198 * constants.KERNEL_US * self.US, places=12)
        # A free device (kernel_us 0) leaves the host: one graph launch + the ops outside it.
        self.assertAlmostEqual(self.floor(graph, kernel_us=0.0)[0],
                               (constants.GRAPH_LAUNCH_US + 12 * constants.LAUNCH_US) * self.US, places=12)
        # Ops launched outside the graph never lower the floor, and raise it once the host bounds it.
        floors = [self.floor(dict(graph, step_ops={"eager": 200, "graph_outside": g, "graph_inside": 198}))[0]
                  for g in (0, 10, 100, 1000)]
        self.assertEqual(floors, sorted(floors))
        self.assertGreater(floors[-1], floors[0])
        # trainer.cuda_graph without the graph's counts (an older file): planned as eager, and said.
        uncounted = dict(eager, cuda_graph=True)
        floor, how = self.floor(uncounted)
        self.assertEqual(floor, f_eager)
        self.assertIn("remeasure", how)

    def test_graph_rows_are_faster_when_launch_bound(self):
        ops = {"eager": 200, "graph_outside": 12, "graph_inside": 198}
        with tempfile.TemporaryDirectory() as tmp:
            results = []
            for graph in (False, True):
                m = small_model(step_ops=ops if graph else dict(ops, graph_outside=None, graph_inside=None),
                                cuda_graph=graph, optimizer_fused=True)
                status, out, err = run_main([write_json(tmp, f"{graph}.json", m), "--json", "--runs-dir", ""])
                self.assertEqual(status, 0, err)
                results.append(json.loads(out))
        eager, graph = results
        self.assertTrue(graph["assumptions"]["step_launches"]["cuda_graph"])
        self.assertFalse(eager["assumptions"]["step_launches"]["cuda_graph"])
        for e, g in zip(eager["rows"], graph["rows"]):
            self.assertEqual((e["gpu"], e["precision"]), (g["gpu"], g["precision"]))
            self.assertLessEqual(g["step_seconds"], e["step_seconds"])
            if e["launch_bound"]:
                self.assertLess(g["step_seconds"], e["step_seconds"])


class Plans(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.no_runs = self.dir / "no_runs"

    def tearDown(self):
        self.tmp.cleanup()

    def plan_json(self, measurement, *extra):
        status, out, err = run_main([measurement, "--json", "--runs-dir", self.no_runs, *extra])
        self.assertEqual(status, 0, err)

        def no_constants(name):
            raise AssertionError(f"--json printed {name}: not JSON")
        return json.loads(out, parse_constant=no_constants)

    def rows(self, result, gpu):
        return [r for r in result["rows"] if r["gpu"] == gpu]

    def test_too_big_for_t4_fits_h200(self):
        path = write_json(self.dir, "big.json", big_model())
        result = self.plan_json(path)
        t4 = self.rows(result, "T4")
        self.assertEqual([r["precision"] for r in t4], ["fp32", "fp16-mixed"])  # no bf16, no tf32
        for row in t4:
            self.assertFalse(row["fits"])
            self.assertEqual(row["largest_batch"], 0)  # not at any batch
        # H200 fp32: budget 0.9 * 141 GiB = 136,258,837,217.28; minus 0.5 GiB context, 6e9
        # parameters, F 18.5e9 -> room 111,221,966,305.28 -> 222 samples of 5e8.
        h200 = {r["precision"]: r for r in self.rows(result, "H200")}
        self.assertTrue(h200["fp32"]["fits"])
        self.assertEqual(h200["fp32"]["largest_batch"], 222)
        self.assertAlmostEqual(h200["fp32"]["memory_needed_bytes"], 0.5 * GIB + 6e9 + 18.5e9 + 8 * 5e8)
        # bf16-mixed: F 21.5e9, A 3e8 -> room 108,221,966,305.28 -> 360; fp16-mixed borrows it.
        self.assertEqual(h200["bf16-mixed"]["largest_batch"], 360)
        self.assertEqual(h200["fp16-mixed"]["largest_batch"], 360)
        self.assertIn("bf16-mixed's numbers", h200["fp16-mixed"]["memory_source"])
        self.assertNotEqual(result["recommendation"]["gpu"], "T4")
        # Text: T4 rows say no and none.
        status, out, _ = run_main([path, "--runs-dir", self.no_runs, "--gpu", "T4", "--gpu", "H200"])
        self.assertEqual(status, 0)
        t4_lines = [line for line in out.splitlines() if line.startswith("T4 ")]
        self.assertEqual(len(t4_lines), 1)
        self.assertRegex(t4_lines[0], r"\bno\s+none\b")

    def test_nothing_fits_anywhere(self):
        m = big_model()
        m["parameter_bytes"] = m["gradient_bytes"] = 200 * GIB
        path = write_json(self.dir, "huge.json", m)
        result = self.plan_json(path)
        self.assertTrue(all(not r["fits"] and r["largest_batch"] == 0 for r in result["rows"]))
        self.assertIsNone(result["recommendation"]["gpu"])
        self.assertIn("shard", result["recommendation"]["text"])

    def test_batch_too_big_suggests_accumulation(self):
        m = big_model()
        m["batch_size"] = 1024  # 0.5 TB of activations in fp32
        result = self.plan_json(write_json(self.dir, "wide.json", m), "--precision", "fp32")
        rec = result["recommendation"]
        self.assertEqual(rec["gpu"], "H200")  # the largest batch: 222
        self.assertIn("trainer.accumulate_grad_batches=5", " ".join(rec["reasons"]))  # ceil(1024/222)

    def test_prices_and_cost_columns(self):
        result = self.plan_json(EXAMPLE, "--price", "T4=0.35", "--price", "h100-sxm=2.99", "--mfu", "0.5")
        t4 = self.rows(result, "T4")[0]  # fp32: 128 * 28,984,320 / (8.1e12 * 0.5) = 0.916 ms < 1 ms floor
        self.assertAlmostEqual(t4["step_seconds"], 1e-3)
        self.assertAlmostEqual(t4["epoch_seconds"], 0.469)
        self.assertAlmostEqual(t4["usd_per_epoch"], 0.469 / 3600 * 0.35)
        self.assertAlmostEqual(t4["usd_per_run"], 8 * 0.469 / 3600 * 0.35)
        self.assertIsNone(self.rows(result, "L4")[0]["usd_per_run"])
        rec = result["recommendation"]
        self.assertEqual(rec["gpu"], "T4")  # launch-bound everywhere: the cheaper hour wins
        self.assertTrue(any("launch-bound" in r for r in rec["reasons"]))
        self.assertTrue(all(r["mfu"] == 0.5 for r in result["rows"]))
        status, _, err = run_main([EXAMPLE, "--price", "A999=1"])
        self.assertEqual(status, 2)  # a usage error, as a bad --margin
        self.assertIn("A999", err)
        # A family prices every row of it; an exact name wins over it in either order.
        gpus = plan_inputs.load_gpus(GPUS)
        for items in (["h100-pcie=2", "H100=2.5"], ["H100=2.5", "H100-PCIe=2"]):
            prices = plan_inputs.parse_prices(items + ["A100=1.5"], gpus)
            self.assertEqual(prices, {"H100-SXM": 2.5, "H100-PCIe": 2.0, "A100-40GB": 1.5, "A100-80GB": 1.5})
        for bad in ("H1=2", "H100=cheap", "H100=-1", "H100", "H100=nan", "H100=1e400", "H100=20000"):
            with self.assertRaises(plan.UsageError):
                plan_inputs.parse_prices([bad], gpus)

    def test_calibrated_mfu_from_run_folders(self):
        runs = self.dir / "runs"

        def run(name, age, **summary):
            folder = runs / name
            folder.mkdir(parents=True)
            path = write_json(folder, "summary.json", {"recipe": name.split("-")[0], **summary})
            stamp = time.time() - age
            os.utime(path, (stamp, stamp))

        run("fashion_mnist-1", 50, device="cuda:0", precision="bf16-mixed", monitor={"mfu": 0.042})
        run("fashion_mnist-2", 10, device="cpu", precision="fp32", monitor={"mfu": 0.7})  # not a GPU
        run("fashion_mnist-3", 5, device="cuda:0", precision="fp32", monitor={"mfu": None})  # no MFU
        run("cifar_resnet-1", 1, device="cuda:0", precision="fp32", monitor={"mfu": 0.5})  # other recipe
        (runs / "fashion_mnist-4").mkdir()  # unfinished: no summary.json
        found = plan_inputs.find_run_calibrations(runs, "fashion_mnist")
        self.assertEqual([(c.run, c.value) for c in found], [(str(runs / "fashion_mnist-1"), 0.042)])
        m = json.loads(EXAMPLE.read_text())
        for precision in ("bf16-mixed", "fp32"):  # fp32 borrows the bf16 run's: the only one
            cal = plan_inputs.choose_mfu(precision, None, found, m)
            self.assertEqual((cal.value, cal.source, cal.precision), (0.042, "run", "bf16-mixed"))
        # A newer fp32 run: fp32 takes it, bf16-mixed keeps its own precision's.
        run("fashion_mnist-5", 1, device="cuda:0", precision="fp32", monitor={"mfu": 0.02})
        found = plan_inputs.find_run_calibrations(runs, "fashion_mnist")
        self.assertEqual(plan_inputs.choose_mfu("fp32", None, found, m).value, 0.02)
        self.assertEqual(plan_inputs.choose_mfu("bf16-mixed", None, found, m).value, 0.042)
        self.assertEqual(plan_inputs.choose_mfu("tf32", None, found, m).value, 0.02)  # newest of any precision
        self.assertEqual(plan_inputs.choose_mfu("fp32", 0.6, found, m).source, "--mfu")
        self.assertEqual(plan_inputs.choose_mfu("fp32", None, [], m).value, constants.DEFAULT_MFU)
        # A CUDA measurement's own MFU comes after runs of its precision.
        m_cuda = dict(m, device="cuda:0", precision="fp32", measured=dict(m["measured"], mfu=0.11))
        self.assertEqual(plan_inputs.choose_mfu("fp32", None, [], m_cuda).source, "measurement")
        # End to end: the rows use it, the output says where it came from.
        status, out, err = run_main([EXAMPLE, "--json", "--runs-dir", runs])
        self.assertEqual(status, 0, err)
        result = json.loads(out)
        self.assertEqual(result["mfu"]["bf16-mixed"]["run"], str(runs / "fashion_mnist-1"))
        self.assertEqual({r["mfu"] for r in result["rows"] if r["precision"] == "bf16-mixed"}, {0.042})
        status, out, _ = run_main([EXAMPLE, "--runs-dir", runs])
        self.assertIn("calibrated: run " + str(runs / "fashion_mnist-1"), out)

    def test_json_shape(self):
        result = self.plan_json(EXAMPLE)
        self.assertEqual(result["schema"], 1)
        for key in ("measurement", "assumptions", "mfu", "memory_models", "rows", "feeding", "data_parallel",
                    "recommendation", "notes"):
            self.assertIn(key, result)
        self.assertEqual(result["measurement"]["steps_per_epoch"], 469)  # ceil(60000 / 128)
        self.assertEqual(result["assumptions"]["context_bytes"], 0.5 * GIB)
        for key in ("step_floor_seconds", "step_floor", "step_launches", "launch_us", "graph_launch_us",
                    "kernel_us", "graph_pool_doubles_per_sample_bytes"):
            self.assertIn(key, result["assumptions"])
        self.assertIsNone(result["assumptions"]["step_launches"])  # the example counted nothing
        self.assertEqual(set(result["mfu"]), set(constants.PRECISIONS))
        self.assertEqual(result["mfu"]["fp32"]["source"], "default")
        row_keys = {"gpu", "precision", "memory_gib", "peak_tflops", "mfu", "memory_needed_bytes",
                    "memory_budget_bytes", "fits", "largest_batch", "step_seconds", "launch_bound",
                    "epoch_seconds", "samples_per_second", "usd_per_hour", "usd_per_epoch", "usd_per_run",
                    "memory_source"}
        for row in result["rows"]:
            self.assertEqual(set(row), row_keys)
        gpus = {r["gpu"] for r in result["rows"]}
        self.assertEqual(gpus, {"T4", "V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "L4", "L40S",
                                "H100-SXM", "H100-PCIe", "H200"})
        self.assertEqual(len(result["rows"]), 34)  # T4, V100 x2: 2 precisions; the other 7: 4
        feeding = result["feeding"]
        self.assertEqual(feeding["host_ram_bytes"], 55_744_128)
        self.assertTrue(feeding["fits_in_host_ram"])
        self.assertFalse(feeding["streams"])
        fastest = feeding["fastest"]
        self.assertAlmostEqual(fastest["host_to_device_bytes_per_s"], fastest["samples_per_second"] * 792.0)
        self.assertAlmostEqual(fastest["storage_bytes_per_s_if_streamed"],
                               fastest["samples_per_second"] * 30_878_551 / 70_000)
        dp = result["data_parallel"]
        self.assertEqual(dp["gradient_bytes"], 874_344)
        self.assertEqual(len(dp["gpus"]), 10)  # one row per GPU: its fastest precision
        h100 = next(e for e in dp["gpus"] if e["gpu"] == "H100-SXM")
        self.assertEqual([link["link"] for link in h100["links"]],
                         ["NVLink", "PCIe Gen5", "25 GbE", "100 GbE", "400G IB"])
        t4 = next(e for e in dp["gpus"] if e["gpu"] == "T4")
        self.assertEqual(t4["links"][0]["link"], "PCIe Gen3")  # no NVLink
        ethernet = next(link for link in h100["links"] if link["link"] == "25 GbE")
        self.assertEqual([c["n"] for c in ethernet["counts"]], [2, 4, 8])
        eight = ethernet["counts"][2]
        self.assertAlmostEqual(eight["allreduce_seconds"], 4.8963264e-4, places=12)
        self.assertAlmostEqual(eight["efficiency"], h100["step_seconds"] / (h100["step_seconds"] + 4.8963264e-4))
        self.assertFalse(eight["pays"])
        self.assertAlmostEqual(eight["speedup"], 8 * eight["efficiency"])
        rec = result["recommendation"]
        self.assertEqual(set(rec), {"gpu", "precision", "world_size", "sharding", "activation_checkpoint", "text",
                                    "reasons", "layout"})
        self.assertIsNone(rec["layout"])  # plain data parallelism (a pipeline/tensor layout: plan_parallel_test.py)
        self.assertFalse(result["layouts"]["shown"])  # one GPU: nothing to lay out
        self.assertEqual(rec["gpu"], "T4")  # all launch-bound, no prices: the smallest GPU
        self.assertTrue(any("one GPU" in r for r in rec["reasons"]))

    def test_text_sections(self):
        status, out, err = run_main([EXAMPLE, "--runs-dir", self.no_runs])
        self.assertEqual(status, 0, err)
        for heading in ("plan: fashion_mnist", "GPUs at batch 128", "Feeding", "Data-parallel", "Recommendation: "):
            self.assertIn(heading, out)
        self.assertIn("bf16-mixed's numbers (not measured; same widths)", out)
        self.assertIn("default: no CUDA run", out)
        self.assertEqual(out.strip().splitlines()[-1].count("Recommendation:"), 1)  # one line, last

    def test_measured_tf32_and_verify(self):
        m = json.loads(EXAMPLE.read_text())
        m["memory"]["tf32"] = {"probes": [{"batch": 8, "peak_bytes": 6_000_000},
                                          {"batch": 32, "peak_bytes": 18_000_000}]}  # F, A fitted: 2e6, 5e5
        m["verify"] = {"batch": 128, "precision": "fp32", "predicted_peak_bytes": 80_486_000,
                       "measured_peak_bytes": 76_000_000, "resident_bytes": 56_000_000}
        path = write_json(self.dir, "tf32.json", m)
        result = self.plan_json(path)
        self.assertEqual(result["memory_models"]["tf32"],
                         {"fixed_bytes": 2_000_000, "per_sample_bytes": 500_000, "source": "measured"})
        status, out, _ = run_main([path, "--runs-dir", self.no_runs, "--no-color"])  # tools/ember passes it
        self.assertEqual(status, 0)
        self.assertIn("checked at batch 128 (fp32)", out)
        self.assertIn("(+5.9%)", out)  # 80,486,000 / 76,000,000 - 1

    def test_device_resident_dataset(self):
        m = json.loads(EXAMPLE.read_text())
        plain = self.plan_json(write_json(self.dir, "host.json", m), "--gpu", "T4")
        m["dataset"]["device_resident"] = True  # data.resident: the dataset sits in GPU memory
        resident = self.plan_json(write_json(self.dir, "device.json", m), "--gpu", "T4")
        for a, b in zip(plain["rows"], resident["rows"]):
            self.assertAlmostEqual(b["memory_needed_bytes"] - a["memory_needed_bytes"], 55_440_000)
            self.assertLess(b["largest_batch"], a["largest_batch"])
        self.assertEqual(resident["feeding"]["fastest"]["host_to_device_bytes_per_s"], 0.0)
        self.assertEqual(resident["feeding"]["loader_bytes"], 0)

    def test_graph_memory_counts_the_pool_once(self):
        """A graph run holds one step's activations in the graph's pool while the short last batch and
        evaluation allocate beside it: a CPU measurement (no graph ran) counts per-sample bytes twice;
        a CUDA measurement that held the pool, once; without trainer.cuda_graph, once."""
        eager = self.plan_json(write_json(self.dir, "eager.json", small_model(cuda_graph=False)), "--gpu", "T4")
        cpu = self.plan_json(write_json(self.dir, "cpu.json", small_model(
            cuda_graph=True, memory_includes_graph_pool=False)), "--gpu", "T4")
        cuda = self.plan_json(write_json(self.dir, "cuda.json", small_model(
            cuda_graph=True, memory_includes_graph_pool=True)), "--gpu", "T4")
        older = self.plan_json(write_json(self.dir, "older.json", small_model()), "--gpu", "T4")
        for p in eager["memory_models"]:
            e, c, g = eager["memory_models"][p], cpu["memory_models"][p], cuda["memory_models"][p]
            self.assertEqual(c["per_sample_bytes"], 2 * e["per_sample_bytes"])
            self.assertEqual(c["fixed_bytes"], e["fixed_bytes"])  # the pool holds activations, not state
            self.assertIn("graph", c["source"])
            self.assertEqual(g, e)
            self.assertEqual(older["memory_models"][p], e)  # no cuda_graph field: off, its default
        batch = eager["measurement"]["batch_size"]
        for e, c, g in zip(eager["rows"], cpu["rows"], cuda["rows"]):
            per_sample = eager["memory_models"][e["precision"]]["per_sample_bytes"]
            self.assertAlmostEqual(c["memory_needed_bytes"] - e["memory_needed_bytes"], batch * per_sample,
                                   places=3)
            self.assertLess(c["largest_batch"], e["largest_batch"])
            self.assertEqual((g["memory_needed_bytes"], g["largest_batch"]),
                             (e["memory_needed_bytes"], e["largest_batch"]))
        self.assertTrue(any("private pool" in n for n in cpu["notes"]))
        self.assertFalse(any("private pool" in n for n in cuda["notes"] + eager["notes"]))
        self.assertTrue(cpu["assumptions"]["graph_pool_doubles_per_sample_bytes"])
        status, out, _ = run_main([self.dir / "cpu.json", "--runs-dir", self.no_runs, "--gpu", "T4"])
        self.assertEqual(status, 0)
        self.assertIn("A x 2: the CUDA graph's pool", out)
        self.assertIn("note: trainer.cuda_graph with memory measured without a graph", out)

    def test_bad_input(self):
        m = json.loads(EXAMPLE.read_text())
        bad = copy.deepcopy(m)
        bad["schema"] = 2
        status, _, err = run_main([write_json(self.dir, "schema.json", bad)])
        self.assertEqual(status, 1)
        self.assertIn("schema.json: 'schema'", err)
        bad = copy.deepcopy(m)
        del bad["gradient_bytes"]
        status, _, err = run_main([write_json(self.dir, "grad.json", bad)])
        self.assertEqual(status, 1)
        self.assertIn("'gradient_bytes'", err)
        for field, value, key in (("step_ops", {"eager": -3}, "'eager'"), ("step_ops", {"eager": 0.5}, "'eager'"),
                                  ("step_ops", [200], "'step_ops'"), ("cuda_graph", "yes", "'cuda_graph'")):
            bad = copy.deepcopy(m)
            bad[field] = value
            status, _, err = run_main([write_json(self.dir, "ops.json", bad)])
            self.assertEqual(status, 1, (field, value))
            self.assertIn(key, err)
        status, _, err = run_main([self.dir / "missing.json"])
        self.assertEqual((status, "--measure" in err), (1, True))
        status, _, _ = run_main([EXAMPLE, "--margin", "1.5"])
        self.assertEqual(status, 2)

    def test_bad_scaling_fields(self):
        """The optional fields of sharding and checkpointing are checked like the rest: exit 1 naming them."""
        cases = [(lambda m: m.update(blocks={"count": 0}), "blocks: 'count'"),
                 (lambda m: m.update(blocks=[4]), "blocks: expected an object"),
                 (lambda m: m.update(blocks={"count": 4, "parameter_bytes": 1e12}), "more than the model's"),
                 (lambda m: m.update(blocks={"count": 4, "parameter_bytes": 10, "largest_parameter_bytes": 20}),
                  "largest_parameter_bytes"),
                 (lambda m: m.update(sharding={"unit_elements": [3, 0]}), "'unit_elements'"),
                 (lambda m: m.update(sharding={"unit_elements": []}), "'unit_elements'"),
                 (lambda m: m.update(sharding={"gathered_parameter_bytes": -1}), "'gathered_parameter_bytes'"),
                 (lambda m: m.update(sharding={"bucket_cap_mb": "25"}), "'bucket_cap_mb'"),
                 (lambda m: m.update(gradient_as_bucket_view="no"), "'gradient_as_bucket_view'"),
                 (lambda m: m.update(activation_checkpoint="half"), "'activation_checkpoint'"),
                 (lambda m: m.update(activation_checkpoint_every=-1), "'activation_checkpoint_every'"),
                 (lambda m: m["memory"]["fp32"].update(activation_checkpoint={"half": {}}),
                  "memory.fp32.activation_checkpoint"),
                 (lambda m: m["memory"]["fp32"].update(activation_checkpoint={"full": {"per_sample_bytes": 0}}),
                  "memory.fp32.activation_checkpoint.full"),
                 (lambda m: m["memory"]["fp32"].update(activation_checkpoint={"full": {"probes": []}}),
                  "memory.fp32.activation_checkpoint.full"),
                 (lambda m: m["memory"]["fp32"].update(block_input_bytes_per_sample="many"),
                  "'block_input_bytes_per_sample'")]
        for change, named in cases:
            m = json.loads(EXAMPLE.read_text())
            change(m)
            status, _, err = run_main([write_json(self.dir, "bad.json", m), "--runs-dir", ""])
            self.assertEqual(status, 1, (named, err))
            self.assertIn(named, err)


def block_model(params=3e9, blocks=32, outside=0.1e9, batch=8, accumulate=1, per_sample=1e9, other_fixed=1e9,
                **fields):
    """A transformer-like measurement trained with AdamW in bf16-mixed with fp32 parameters, as Ember
    keeps them: `params` parameters, `outside` of them outside the `blocks` equal blocks; 4 bytes
    each for the parameters and the gradients, 8 for Adam's moments. F = gradients + moments +
    `other_fixed`; A = `per_sample`, of which the blocks save 90% and their inputs are 5%."""
    m = json.loads(EXAMPLE.read_text())
    p_bytes = 4 * params
    inside = params - outside
    macs = 2e9 * params / 1e9 * 1000  # 2 MACs per parameter per token, 1000 tokens
    m.update(recipe="gpt", batch_size=batch, epochs=1, accumulate_grad_batches=accumulate, optimizer="adamw",
             precision="bf16-mixed", parameters=params, trainable_parameters=params, parameter_bytes=p_bytes,
             buffer_bytes=0, gradient_bytes=p_bytes, optimizer_state_bytes=2 * p_bytes,
             forward_macs_per_sample=macs, train_flops_per_sample=6 * macs,
             blocks={"count": blocks, "parameter_bytes": 4 * inside, "largest_parameter_bytes": 4 * inside / blocks,
                     "forward_macs_per_sample": macs * inside / params})
    m["memory"] = {"bf16-mixed": {"probes": [], "fixed_bytes": 3 * p_bytes + other_fixed,
                                  "per_sample_bytes": per_sample,
                                  "block_activation_bytes_per_sample": 0.9 * per_sample,
                                  "block_input_bytes_per_sample": 0.05 * per_sample}}
    m["dataset"] = {"train_samples": 100_000, "eval_samples": 1_000, "sample_bytes": 8000.0, "disk_bytes": 8e8,
                    "disk_path": "/data/tokens", "resident_bytes": 8e8}
    m.update(fields)
    return m


def gpt2_xl():
    """The hand-written measurement of docs/planning.md's example: GPT-2 XL's shapes (48 blocks of
    12 x 1600^2 + 13 x 1600 parameters; outside them the 50257 x 1600 token and 1024 x 1600 position
    embeddings and the final norm, the head tied to the token embedding), AdamW, bf16-mixed with fp32
    parameters, batch 16 x 4 accumulation; 3 GB of activations a sample (34 bytes a token a hidden unit
    a block at 1024 tokens, Korthikanti et al., + the logits), 1 GB of workspaces."""
    h = 1600
    block, outside = 12 * h * h + 13 * h, 50257 * h + 1024 * h + 2 * h
    return block_model(params=48 * block + outside, blocks=48, outside=outside, batch=16, accumulate=4,
                       per_sample=3e9, other_fixed=1e9)


class Sharding(unittest.TestCase):
    """dist.sharding: the model state split 1/N, padded per piece, and what each stage sends."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def plan_json(self, m, *extra):
        status, out, err = run_main([write_json(self.dir, "m.json", m), "--json", "--runs-dir", "", *extra])
        self.assertEqual(status, 0, err)
        return json.loads(out)

    def test_zero_paper_figure(self):
        """Rajbhandari et al. 2020 (ZeRO), figure 1: 7.5B parameters on 64 GPUs, mixed-precision Adam,
        2 + 2 + 12 bytes a parameter (fp16 parameters and gradients; fp32 parameters, momentum and
        variance as optimizer state): 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU. The plan gives it for a
        model whose parameters are all in blocks, but for ZeRO-1's kept shard of the reduced gradient;
        embeddings outside the blocks stay whole under ZeRO-3."""
        psi = 7.5e9
        paper = {"none": 120.0, "optimizer": 31.4, "gradients": 16.6, "parameters": 1.9}
        for stage, gb in paper.items():
            state = arithmetic.model_state_bytes(2 * psi, 2 * psi, 12 * psi, stage, 64)
            self.assertEqual(round(state["total"] / 1e9, 1), gb, stage)
        # The formulas: 16 psi; 4 psi + 12 psi / 64; 2 psi + 14 psi / 64; 16 psi / 64.
        self.assertAlmostEqual(arithmetic.model_state_bytes(2 * psi, 2 * psi, 12 * psi, "optimizer", 64)["total"],
                               4 * psi + 12 * psi / 64)
        self.assertAlmostEqual(arithmetic.model_state_bytes(2 * psi, 2 * psi, 12 * psi, "gradients", 64)["total"],
                               2 * psi + 14 * psi / 64)
        # The same through the plan: a measurement with the paper's bytes, every parameter in one of 32
        # blocks, planned at 64 GPUs.
        m = block_model(params=psi, outside=0, blocks=32, parameter_bytes=2 * psi, gradient_bytes=2 * psi,
                        optimizer_state_bytes=12 * psi)
        m["blocks"].update(parameter_bytes=2 * psi, largest_parameter_bytes=2 * psi / 32)
        state = self.plan_json(m, "--world-size", "64", "--gpu", "H200")["configurations"]["state"]
        total = {s: state[s]["parameters"] + state[s]["gradients"] + state[s]["optimizer_state"] for s in paper}
        for stage, gb in paper.items():
            # ZeRO-1 also keeps the 1/64 of the reduced gradient it steps with (2 psi / 64 = 0.23 GB),
            # which the paper leaves out: 31.6 GB.
            kept = 2 * psi / 64 if stage == "optimizer" else 0.0
            self.assertEqual(round((total[stage] - kept) / 1e9, 1), gb, stage)
        self.assertEqual(round(total["optimizer"] / 1e9, 1), 31.6)
        # GPT-like: embeddings of 50257 x 4096 (fp16: 0.41 GB) outside the blocks stay whole on every rank
        # under ZeRO-3; the other stages, which keep every parameter whole or none, do not change.
        embed = 2 * 50257 * 4096
        gpt = copy.deepcopy(m)
        gpt["blocks"].update(parameter_bytes=2 * psi - embed, largest_parameter_bytes=(2 * psi - embed) / 32)
        gpt_state = self.plan_json(gpt, "--world-size", "64", "--gpu", "H200")["configurations"]["state"]
        gpt_total = {s: sum(gpt_state[s][k] for k in ("parameters", "gradients", "optimizer_state")) for s in paper}
        self.assertAlmostEqual(gpt_state["parameters"]["parameters"], (2 * psi - embed) / 64 + embed, delta=1)
        self.assertAlmostEqual(gpt_total["parameters"] - total["parameters"], embed * 63 / 64, delta=1)
        self.assertEqual(round(gpt_total["parameters"] / 1e9, 1), 2.3)  # 1.9 GB + 0.41 GB x 63/64
        for stage in ("none", "optimizer", "gradients"):
            self.assertAlmostEqual(gpt_total[stage], total[stage], delta=1, msg=stage)

    def test_one_over_n_with_padding(self):
        # 17 elements of 4 bytes in pieces of 10 and 7, over 4 ranks: ceil(10/4) + ceil(7/4) = 3 + 2 = 5
        # elements a rank (20 bytes), not 17/4 = 4.25.
        self.assertEqual(arithmetic.padded_elements([10, 7], 4), 5)
        self.assertAlmostEqual(arithmetic.shard_bytes(68, 4, [10, 7]), 20.0)
        self.assertAlmostEqual(arithmetic.shard_bytes(68, 4), 17.0)  # one piece: the padding is left out
        self.assertEqual(arithmetic.shard_bytes(68, 1, [10, 7]), 68.0)  # one rank holds everything
        # Pieces that divide evenly scale exactly 1/N; any pieces hold at most one element more each.
        for n in (2, 4, 8, 16):
            self.assertAlmostEqual(arithmetic.shard_bytes(4 * 4096, n, [1024, 3072]), 4 * 4096 / n)
            units = [1000, 333, 7]
            self.assertLessEqual(arithmetic.shard_bytes(4 * 1340, n, units), 4 * (1340 / n + len(units)))
            self.assertGreaterEqual(arithmetic.shard_bytes(4 * 1340, n, units), 4 * 1340 / n)
        # Each stage splits one more state; the rest stay whole.
        full = dict(parameters=100.0, gradients=200.0, optimizer_state=400.0)
        for stage, split in (("none", set()), ("optimizer", {"optimizer_state"}),
                             ("gradients", {"optimizer_state", "gradients"}),
                             ("parameters", {"optimizer_state", "gradients", "parameters"})):
            state = arithmetic.model_state_bytes(100, 200, 400, stage, 4)
            for key, value in full.items():
                self.assertAlmostEqual(state[key], value / 4 if key in split else value, msg=(stage, key))
        # Through the plan: the measurement's pieces pad what each GPU holds.
        m = block_model(params=1000, outside=100, sharding={"unit_elements": [600, 399, 1]})
        state = self.plan_json(m, "--world-size", "8", "--gpu", "H100-SXM")["configurations"]["state"]
        elements = 75 + 50 + 1  # ceil(600/8) + ceil(399/8) + ceil(1/8)
        self.assertAlmostEqual(state["gradients"]["gradients"], 4 * elements)
        self.assertAlmostEqual(state["parameters"]["optimizer_state"], 8 * elements)
        # ZeRO-1 keeps the gradients whole (.grad, over the micro-batches) and its shard of the reduced ones.
        self.assertAlmostEqual(state["optimizer"]["gradients"], 4000 + 4 * elements)
        # ZeRO-3 splits the blocks' 3600 bytes of parameters alike; the 400 outside them stay whole.
        self.assertAlmostEqual(state["parameters"]["parameters"], 3600 * elements / 1000 + 400)

    def test_communication_per_stage(self):
        b, n = 1e9, 8
        ring = 7 / 8 * b  # (n-1)/n of the buffer: one reduce-scatter or all-gather
        self.assertAlmostEqual(arithmetic.collective_bytes("all-reduce", b, n), 2 * ring)
        self.assertAlmostEqual(arithmetic.collective_bytes("all-gather", b, n), ring)
        # An all-reduce's bytes over the link are the data-parallel table's time.
        self.assertAlmostEqual(arithmetic.collective_bytes("all-reduce", b, n) / 450e9, arithmetic.allreduce_seconds(b, n, 450e9))
        volume = {s: arithmetic.communication(s, n, b, b)["bytes_per_step"] for s in constants.SHARDING}
        self.assertAlmostEqual(volume["none"], 2 * ring)  # DDP: all-reduce
        # ZeRO-1 and ZeRO-2: a reduce-scatter of the gradients + an all-gather of the updated parameters,
        # which is what DDP's all-reduce is made of (ZeRO-1 does not all-reduce).
        self.assertAlmostEqual(volume["optimizer"], volume["none"])
        self.assertEqual([c["op"] for c in arithmetic.communication("optimizer", n, b, b)["collectives"]],
                         ["reduce-scatter", "all-gather"])
        self.assertAlmostEqual(volume["gradients"], volume["none"])
        self.assertAlmostEqual(volume["parameters"], 1.5 * volume["none"])  # 2 all-gathers + reduce-scatter
        # Accumulation of 4: ZeRO-2 and ZeRO-3 reduce-scatter (and ZeRO-3 gathers) every micro-batch,
        # DDP and ZeRO-1 (the gradients accumulate whole in .grad, as DDP's no_sync) at the last one only.
        acc = {s: arithmetic.communication(s, n, b, b, accumulate=4)["bytes_per_step"] for s in constants.SHARDING}
        self.assertAlmostEqual(acc["none"], 2 * ring)
        self.assertAlmostEqual(acc["optimizer"], 2 * ring)
        self.assertEqual({c["per"] for c in arithmetic.communication("optimizer", n, b, b, 4)["collectives"]}, {"step"})
        self.assertAlmostEqual(acc["gradients"], 4 * ring + ring)
        self.assertAlmostEqual(acc["parameters"], 4 * 3 * ring)
        # ZeRO-3 gathers per micro-batch only the blocks' parameters (0.8 of them here); the rest (0.2),
        # whole on every rank, once per step after the optimizer step, like ZeRO-2.
        zero3 = arithmetic.communication("parameters", n, b, b, accumulate=4, block_parameter_bytes=0.8 * b)
        self.assertAlmostEqual(zero3["micro_batch_bytes"], 7 / 8 * (2 * 0.8 * b + b))
        self.assertAlmostEqual(zero3["step_bytes"], 7 / 8 * 0.2 * b)
        self.assertAlmostEqual(zero3["bytes_per_step"], 4 * 7 / 8 * 2.6 * b + 7 / 8 * 0.2 * b)
        self.assertEqual([(c["op"], c["of"], c["per"]) for c in zero3["collectives"]],
                         [("all-gather", "block parameters", "micro-batch")] * 2
                         + [("reduce-scatter", "gradients", "micro-batch"), ("all-gather", "other parameters", "step")])
        # Every parameter in a block: no per-step all-gather at all.
        self.assertEqual(len(arithmetic.communication("parameters", n, b, b, block_parameter_bytes=b)["collectives"]), 3)
        # Parameters and gradients of other widths: each collective moves its own buffer.
        mixed = arithmetic.communication("gradients", n, 2e9, 4e9)
        self.assertAlmostEqual(mixed["bytes_per_step"], 7 / 8 * 4e9 + 7 / 8 * 2e9)
        self.assertEqual({c["of"] for c in mixed["collectives"]}, {"gradients", "parameters"})
        for s in constants.SHARDING:
            self.assertEqual(arithmetic.communication(s, 1, b, b)["bytes_per_step"], 0.0)  # one GPU sends nothing

    def test_links_and_times_in_the_rows(self):
        m = block_model(accumulate=2)
        for n, link, name, gb_s in ((8, "auto", "NVLink", 450.0), (16, "auto", "400G IB", 50.0),
                                    (8, "pcie", "PCIe Gen5", 64.0), (8, "25gbe", "25 GbE", 3.125)):
            rows = self.plan_json(m, "--world-size", str(n), "--link", link, "--gpu", "H100-SXM",
                                  "--activation-checkpoint", "none")["configurations"]["rows"]
            self.assertEqual(len(rows), 4)  # one per stage
            for r in rows:
                self.assertEqual((r["link"], r["link_gb_s"]), (name, gb_s))
                # 2.9e9 of the 3e9 parameters are in the blocks.
                sent = arithmetic.communication(r["sharding"], n, 4 * 3e9, 4 * 3e9, 2, 4 * 2.9e9)["bytes_per_step"]
                self.assertAlmostEqual(r["communication_bytes"], sent)
                self.assertAlmostEqual(r["communication_seconds"], sent / (gb_s * 1e9))
                self.assertAlmostEqual(r["step_seconds"], r["compute_seconds"] + r["communication_seconds"])
        # A board without NVLink communicates over PCIe, also when NVLink is asked for.
        rows = self.plan_json(m, "--world-size", "4", "--link", "nvlink", "--gpu", "L40S")["configurations"]["rows"]
        self.assertEqual({r["link"] for r in rows}, {"PCIe Gen4 (no NVLink)"})

    def test_memory_parts(self):
        """The parts of a GPU's memory, at N = 8 on an H100 at batch 8, as dist::ShardedDataParallel keeps
        them: what each stage keeps whole and split, DDP's bucket copy of the gradients, the sharded stages'
        one unit copied flat for its reduce-scatter, ZeRO-3's two gathered blocks and its parameters
        outside the blocks kept whole."""
        m = block_model()
        p = 4 * 3e9  # parameter bytes = gradient bytes; Adam: 2p
        inside, outside, block = 4 * 2.9e9, 4 * 0.1e9, 4 * 2.9e9 / 32
        bucket = 25 * 2**20  # dist.bucket_cap_mb's default
        rows = self.plan_json(m, "--world-size", "8", "--gpu", "H100-SXM", "--activation-checkpoint", "none")
        parts = {r["sharding"]: r["memory_parts"] for r in rows["configurations"]["rows"]}
        self.assertAlmostEqual(parts["none"]["communication_buffers"], p)  # gradient_as_bucket_view off
        # ZeRO-1: the moments split; whole gradients in .grad + the kept shard of the reduced ones; no bucket
        # copy of all the gradients, only the largest unit copied flat while it is reduce-scattered: here
        # what lies outside the blocks (0.4 GB, more than a 25 MiB bucket: an embedding is one tensor).
        self.assertAlmostEqual(parts["optimizer"]["optimizer_state"], 2 * p / 8)
        self.assertAlmostEqual(parts["optimizer"]["gradients"], p + p / 8)
        self.assertAlmostEqual(parts["optimizer"]["parameters"], p)
        self.assertAlmostEqual(parts["optimizer"]["communication_buffers"], outside)
        self.assertAlmostEqual(parts["gradients"]["gradients"], p / 8)
        self.assertAlmostEqual(parts["gradients"]["parameters"], p)
        self.assertAlmostEqual(parts["gradients"]["communication_buffers"], outside)
        # ZeRO-3: the blocks' parameters split, the 0.4 GB outside them whole; two blocks gathered (11.6 GB / 32
        # each); the largest unit is still what lies outside the blocks (0.4 GB > 0.36 GB a block).
        self.assertAlmostEqual(parts["parameters"]["parameters"], inside / 8 + outside)
        self.assertAlmostEqual(parts["parameters"]["gradients"], p / 8)
        self.assertAlmostEqual(parts["parameters"]["gathered_parameters"], 2 * block)
        self.assertAlmostEqual(parts["parameters"]["communication_buffers"], outside)
        for stage in ("none", "optimizer", "gradients"):
            self.assertEqual(parts[stage]["gathered_parameters"], 0.0)
        for stage, part in parts.items():
            self.assertAlmostEqual(part["other_fixed"], 1e9)  # F less the gradients and moments it holds
            self.assertAlmostEqual(part["activations"], 8 * 1e9)
            self.assertAlmostEqual(part["context"], 0.5 * GIB)
        needed = {r["sharding"]: r["memory_needed_bytes"] for r in rows["configurations"]["rows"]}
        self.assertAlmostEqual(needed["none"], 0.5 * GIB + p + p + p + 2 * p + 1e9 + 8e9)
        # ZeRO-1 saves 7/8 of the moments and DDP's bucket copy, less its unit and its gradient shard.
        self.assertAlmostEqual(needed["none"] - needed["optimizer"], 2 * p * 7 / 8 + p - outside - p / 8)
        self.assertAlmostEqual(needed["optimizer"] - needed["gradients"], p)  # the whole .grad
        # With gradient_as_bucket_view the buckets are the gradients: no copy.
        view = self.plan_json(dict(m, gradient_as_bucket_view=True), "--world-size", "8", "--gpu", "H100-SXM",
                              "--activation-checkpoint", "none")["configurations"]["rows"]
        self.assertAlmostEqual(needed["none"] - view[0]["memory_needed_bytes"], p)
        # Little outside the blocks (4 MB): ZeRO-1/2's unit is one bucket of dist.bucket_cap_mb (25 MiB by
        # default, 1000 MiB asked), ZeRO-3's the largest block whatever the cap.
        lean = block_model(outside=1e6)
        for cap, unit in ((None, bucket), (1000, 1000 * 2**20)):
            fields = {"sharding": {"bucket_cap_mb": cap}} if cap else {}
            state = self.plan_json(dict(lean, **fields), "--world-size", "8",
                                   "--gpu", "H100-SXM")["configurations"]["state"]
            self.assertAlmostEqual(state["gradients"]["communication_buffers"], unit)
            self.assertAlmostEqual(state["optimizer"]["communication_buffers"], unit)
            self.assertAlmostEqual(state["parameters"]["communication_buffers"], 4 * (3e9 - 1e6) / 32)
            self.assertIn("bucket of dist.bucket_cap_mb", state["gradients"]["how"]["communication_buffers"])
        # Measured transients replace the estimates.
        measured = dict(m, sharding={"gathered_parameter_bytes": 123.0, "transient_gradient_bytes": 45.0})
        state = self.plan_json(measured, "--world-size", "8", "--gpu", "H100-SXM")["configurations"]["state"]
        self.assertEqual((state["parameters"]["gathered_parameters"], state["parameters"]["communication_buffers"]),
                         (123.0, 45.0))
        self.assertEqual(state["parameters"]["how"]["gathered_parameters"], "measured")
        self.assertEqual(state["optimizer"]["communication_buffers"], 45.0)

    def test_zero3_needs_blocks(self):
        """Ember shards a model's parameters only for a core::BlockModel, gathered block by block: a
        measurement without blocks plans no ZeRO-3 (it is not estimated as "gathered whole"), says why,
        and is bad input when ZeRO-3 alone is asked for."""
        bare = block_model()
        del bare["blocks"]
        result = self.plan_json(bare, "--world-size", "8", "--gpu", "H100-SXM")
        state = result["configurations"]["state"]
        self.assertEqual(state["parameters"], {"available": False, "why": state["parameters"]["why"]})
        self.assertIn("core::BlockModel", state["parameters"]["why"])
        self.assertTrue(all(state[s]["available"] for s in ("none", "optimizer", "gradients")))
        self.assertEqual({r["sharding"] for r in result["configurations"]["rows"]}, {"none", "optimizer", "gradients"})
        # Without blocks ZeRO-2's unit is one 25 MiB bucket.
        self.assertAlmostEqual(state["gradients"]["communication_buffers"], 25 * 2**20)
        path = write_json(self.dir, "bare.json", bare)
        status, text, err = run_main([path, "--runs-dir", "", "--world-size", "8", "--gpu", "H100-SXM"])
        self.assertEqual(status, 0, err)
        self.assertRegex(text, r"parameters \(ZeRO-3\): not planned: the measurement names no blocks")
        self.assertNotRegex(text, r"bf16-mixed\s+parameters\s")
        status, _, err = run_main([path, "--runs-dir", "", "--world-size", "8", "--sharding", "parameters"])
        self.assertEqual(status, 1)
        self.assertIn("--sharding parameters: gpt's measurement cannot plan it", err)
        # Blocks without their parameter bytes cannot say which parameters ZeRO-3 splits either.
        vague = block_model()
        vague["blocks"] = {"count": 32}
        state = self.plan_json(vague, "--world-size", "8", "--gpu", "H100-SXM")["configurations"]["state"]
        self.assertFalse(state["parameters"]["available"])
        self.assertIn("parameter_bytes", state["parameters"]["why"])
        # Nothing fits one sample: the least memory there is without blocks is ZeRO-2.
        huge = block_model(params=100e9)
        del huge["blocks"]
        rec = self.plan_json(huge, "--world-size", "2", "--gpu", "H100-SXM")["recommendation"]
        self.assertIsNone(rec["gpu"])
        self.assertIn("the least, sharding gradients (ZeRO-2)", rec["text"])

    def test_one_gpu_rows_are_the_single_gpu_plan(self):
        """At --world-size 1 without sharding or checkpointing a configuration is the plan's own row:
        the same memory, largest batch, step and epoch."""
        m = block_model(accumulate=2)
        result = self.plan_json(m, "--precision", "bf16-mixed")
        singles = {r["gpu"]: r for r in result["rows"]}
        configs = [r for r in result["configurations"]["rows"] if r["activation_checkpoint"] == "none"]
        self.assertEqual(len(configs), len(singles))
        for c in configs:
            s = singles[c["gpu"]]
            self.assertEqual(c["sharding"], "none")
            self.assertAlmostEqual(c["memory_needed_bytes"], s["memory_needed_bytes"], places=3)
            self.assertEqual(c["largest_batch"], s["largest_batch"])
            self.assertAlmostEqual(c["step_seconds"], s["step_seconds"])
            self.assertAlmostEqual(c["epoch_seconds"], s["epoch_seconds"])
            self.assertEqual(c["communication_bytes"], 0.0)


class Checkpointing(unittest.TestCase):
    """Activations per sample with checkpointing: measured when the measurement has them, else estimated
    from the blocks and said so."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def plan(self, m, *extra):
        path = write_json(self.dir, "m.json", m)
        status, out, err = run_main([path, "--json", "--runs-dir", "", *extra])
        self.assertEqual(status, 0, err)
        status, text, err = run_main([path, "--runs-dir", "", *extra])
        self.assertEqual(status, 0, err)
        return json.loads(out), text

    def test_estimates_by_hand(self):
        # A = 1000 bytes a sample, 4 blocks saving 800 of them, their inputs 40 (10 each).
        # Every block checkpointed: 1000 - 800 + 40 + one block's 200 while it is recomputed = 440.
        self.assertAlmostEqual(arithmetic.full_checkpoint_per_sample_bytes(1000, 4, 1, 800, 40), 440)
        # Every 2nd (blocks 0 and 2): 1000 - 400 + 20 + 200 = 820.
        self.assertEqual(arithmetic.checkpointed_blocks(4, 2), 2)
        self.assertAlmostEqual(arithmetic.full_checkpoint_per_sample_bytes(1000, 4, 2, 800, 40), 820)
        self.assertEqual(arithmetic.checkpointed_blocks(5, 2), 3)  # blocks 0, 2, 4
        # The largest block, when known, is the one held while it is recomputed.
        self.assertAlmostEqual(arithmetic.full_checkpoint_per_sample_bytes(1000, 4, 1, 800, 40, 350), 590)
        # One block alone saves nothing: its input is kept and all of it comes back.
        self.assertAlmostEqual(arithmetic.full_checkpoint_per_sample_bytes(1000, 1, 1, 800, 40), 1040)
        # Light: the blocks drop 12/34 of what they save, the one in backward holds it again.
        s = 12 / 34
        self.assertAlmostEqual(constants.LIGHT_RECOMPUTED_SHARE, s)
        self.assertAlmostEqual(arithmetic.light_checkpoint_per_sample_bytes(1000, 4, 800), 1000 - s * 800 + s * 200)
        self.assertAlmostEqual(arithmetic.light_checkpoint_per_sample_bytes(1000, 4, 800, 0.5), 1000 - 400 + 100)
        # Time: full recomputes the checkpointed blocks' forward, 2 x MACs of 6 x MACs to train.
        self.assertAlmostEqual(arithmetic.recompute_factor("full", 6e9, 1e9, 4, 1), 1 + 2 / 6)
        self.assertAlmostEqual(arithmetic.recompute_factor("full", 6e9, 1e9, 4, 2), 1 + 2 / 6 / 2)
        self.assertEqual(arithmetic.recompute_factor("light", 6e9, 1e9, 4, 1), 1.0)
        # Light's recomputation is memory-bound: 8 samples x 1 MB read and written at 2 TB/s = 8 us.
        self.assertAlmostEqual(arithmetic.light_recompute_seconds(8, 1e6, 2e12), 8e-6)

    def test_estimated_from_the_blocks(self):
        m = block_model(params=1e9, per_sample=2e9, blocks=20)
        result, text = self.plan(m, "--gpu", "H100-SXM")
        acts = result["configurations"]["activations"]["bf16-mixed"]
        a0, inside, inputs = 2e9, 0.9 * 2e9, 0.05 * 2e9
        self.assertEqual(acts["none"]["per_sample_bytes"], a0)
        self.assertFalse(acts["none"]["estimated"])
        self.assertAlmostEqual(acts["full"]["per_sample_bytes"], a0 - inside + inputs + inside / 20)
        self.assertAlmostEqual(acts["light"]["per_sample_bytes"],
                               a0 - constants.LIGHT_RECOMPUTED_SHARE * inside + constants.LIGHT_RECOMPUTED_SHARE * inside / 20)
        self.assertTrue(acts["full"]["estimated"] and acts["light"]["estimated"])
        macs = m["blocks"]["forward_macs_per_sample"]
        self.assertAlmostEqual(acts["full"]["recompute_factor"], 1 + 2 * macs / m["train_flops_per_sample"])
        self.assertIn("estimated", acts["full"]["source"])
        # The rows: less memory, a larger batch, a longer step.
        rows = {r["activation_checkpoint"]: r for r in result["configurations"]["rows"]}
        self.assertLess(rows["full"]["memory_needed_bytes"], rows["light"]["memory_needed_bytes"])
        self.assertLess(rows["light"]["memory_needed_bytes"], rows["none"]["memory_needed_bytes"])
        self.assertAlmostEqual(rows["none"]["memory_needed_bytes"] - rows["full"]["memory_needed_bytes"],
                               8 * (a0 - acts["full"]["per_sample_bytes"]))
        self.assertGreater(rows["full"]["largest_batch"], rows["none"]["largest_batch"])
        none_step = rows["none"]["step_seconds"]
        self.assertAlmostEqual(rows["full"]["step_seconds"], none_step * acts["full"]["recompute_factor"])
        self.assertAlmostEqual(rows["full"]["recompute_seconds"], rows["full"]["step_seconds"] - none_step)
        # Light: the dropped bytes once more through HBM (H100-SXM: 3,350 GB/s).
        dropped = constants.LIGHT_RECOMPUTED_SHARE * inside
        self.assertAlmostEqual(rows["light"]["recompute_seconds"], 2 * 8 * dropped / 3350e9)
        # The text labels them.
        self.assertRegex(text, r"bf16-mixed\s+full\s+A .*estimated: 20 blocks keep their inputs")
        self.assertRegex(text, r"bf16-mixed\s+none\s+A .*measured")

    def test_measured_fields_win(self):
        m = block_model(params=1e9, per_sample=2e9)
        m["memory"]["bf16-mixed"]["activation_checkpoint"] = {
            "full": {"fixed_bytes": 12.5e9, "per_sample_bytes": 0.7e9, "every": 1},
            "light": {"probes": [{"batch": 2, "peak_bytes": 16e9}, {"batch": 6, "peak_bytes": 22e9}]}}
        result, text = self.plan(m, "--gpu", "H100-SXM")
        acts = result["configurations"]["activations"]["bf16-mixed"]
        self.assertEqual((acts["full"]["per_sample_bytes"], acts["full"]["fixed_bytes"]), (0.7e9, 12.5e9))
        self.assertAlmostEqual(acts["light"]["per_sample_bytes"], 1.5e9)  # (22 - 16) / 4, fitted from the probes
        self.assertAlmostEqual(acts["light"]["fixed_bytes"], 13e9)
        for mode in ("full", "light"):
            self.assertFalse(acts[mode]["estimated"])
            self.assertTrue(acts[mode]["source"].startswith("measured"))
        # Light recomputes what it saved: 2.0 - 1.5 GB a sample.
        self.assertAlmostEqual(acts["light"]["recomputed_bytes_per_sample"], 0.5e9)
        self.assertNotRegex(text, r"full\s+A .*estimated")
        # A run measured with checkpointing on: its own entry is that mode, and "none" cannot be estimated.
        on = block_model(params=1e9, per_sample=0.7e9, activation_checkpoint="full", activation_checkpoint_every=2)
        acts = self.plan(on, "--gpu", "H100-SXM")[0]["configurations"]["activations"]["bf16-mixed"]
        self.assertEqual(acts["full"]["per_sample_bytes"], 0.7e9)
        self.assertEqual(acts["full"]["every"], 2)
        self.assertFalse(acts["none"]["available"])
        self.assertIn("trains with full checkpointing", acts["none"]["why"])

    def test_graph_pool_doubles_every_mode(self):
        m = block_model(params=1e9, per_sample=2e9)
        plain = self.plan(m, "--gpu", "H100-SXM")[0]["configurations"]["activations"]["bf16-mixed"]
        graph = self.plan(dict(m, cuda_graph=True), "--gpu", "H100-SXM")[0]["configurations"]["activations"]
        for mode, a in graph["bf16-mixed"].items():
            self.assertAlmostEqual(a["per_sample_bytes"], 2 * plain[mode]["per_sample_bytes"], msg=mode)

    def test_without_blocks_nothing_is_estimated(self):
        result, text = self.plan(small_model())
        acts = result["configurations"]["activations"]["fp32"]
        self.assertFalse(acts["full"]["available"] or acts["light"]["available"])
        self.assertFalse(result["configurations"]["shown"])  # one GPU, nothing to compare: no section
        self.assertNotIn("Sharding and activation checkpointing", text)
        self.assertIn("(sharding: --world-size N", text)
        # Asking for a mode the measurement cannot give is bad input, naming what is missing.
        status, _, err = run_main([EXAMPLE, "--runs-dir", "", "--activation-checkpoint", "full"])
        self.assertEqual(status, 1)
        self.assertIn("--activation-checkpoint full", err)
        self.assertIn("names no blocks", err)
        # Blocks without their inputs: light is estimated, full is not.
        m = block_model()
        del m["memory"]["bf16-mixed"]["block_input_bytes_per_sample"]
        acts = self.plan(m, "--gpu", "H100-SXM")[0]["configurations"]["activations"]["bf16-mixed"]
        self.assertTrue(acts["light"]["available"])
        self.assertFalse(acts["full"]["available"])
        self.assertIn("block_input_bytes_per_sample", acts["full"]["why"])


class ConfigRecommendation(unittest.TestCase):
    """The recommendation at --world-size N: the cheapest configuration where the batch fits."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def recommend(self, m, *extra):
        path = write_json(self.dir, "m.json", m)
        status, out, err = run_main([path, "--json", "--runs-dir", "", "--gpu", "H100-SXM", *extra])
        self.assertEqual(status, 0, err)
        result = json.loads(out)
        status, text, err = run_main([path, "--runs-dir", "", "--gpu", "H100-SXM", *extra])
        self.assertEqual(status, 0, err)
        return result, result["recommendation"], text

    def fits(self, result):
        return {r["sharding"]: r["fits"] for r in result["configurations"]["rows"]}

    def test_plain_ddp_when_it_fits(self):
        # 3B parameters: 12 GB each of parameters, gradients and DDP's bucket copy, 24 GB of moments, 1 GB
        # other, 8 x 1 GB of activations, the context: 69.5 GB < 90% of 80 GiB (77.3 GB).
        for price in ([], ["--price", "H100-SXM=3"]):
            result, rec, text = self.recommend(block_model(params=3e9), "--world-size", "8",
                                               "--activation-checkpoint", "none", *price)
            self.assertTrue(self.fits(result)["none"])
            self.assertEqual((rec["sharding"], rec["activation_checkpoint"], rec["world_size"]), ("none", "none", 8))
            self.assertIn("plain DDP and no checkpointing fit", " ".join(rec["reasons"]))
            self.assertIn("sharding none (DDP)", rec["text"])
            self.assertRegex(text, r"bf16-mixed\s+none\s+none\s.*<- recommended")

    def test_least_sharding_that_fits_and_is_cheapest(self):
        # 4B parameters: DDP needs 16 x 5 + 1 + 8 + 0.5 GB = 89.5 GB, over 77.3; ZeRO-1 (16 + 18 + 4 + 0.03 +
        # 1 + 8 + 0.5 = 47.6 GB) and ZeRO-2 fit.
        m = block_model(params=4e9)
        result, rec, text = self.recommend(m, "--world-size", "8", "--activation-checkpoint", "none",
                                           "--price", "H100-SXM=3")
        self.assertEqual(self.fits(result), {"none": False, "optimizer": True, "gradients": True, "parameters": True})
        # Without accumulation ZeRO-1 and ZeRO-2 both send DDP's volume (a reduce-scatter and an all-gather):
        # the same cost, so the less sharded ZeRO-1.
        costs = {r["sharding"]: r["usd_per_run"] for r in result["configurations"]["rows"] if r["fits"]}
        self.assertAlmostEqual(costs["optimizer"], costs["gradients"])
        self.assertLess(costs["gradients"], costs["parameters"])
        self.assertEqual(rec["sharding"], "optimizer")
        reasons = " ".join(rec["reasons"])
        self.assertRegex(reasons, r"sharding none \(DDP\), activation checkpointing none needs [0-9.]+ GiB: more than")
        self.assertIn("set dist.sharding=optimizer", reasons)
        # With 4 micro-batches ZeRO-2 reduce-scatters 4 times: ZeRO-1, at the last one only, is cheaper.
        result, rec, _ = self.recommend(dict(m, accumulate_grad_batches=4), "--world-size", "8",
                                        "--activation-checkpoint", "none", "--price", "H100-SXM=3")
        self.assertEqual(rec["sharding"], "optimizer")
        costs = {r["sharding"]: r["usd_per_run"] for r in result["configurations"]["rows"] if r["fits"]}
        self.assertEqual(min(costs, key=costs.get), "optimizer")
        self.assertLess(costs["optimizer"], costs["gradients"])
        # 5 GB of activations a sample (40 GB at batch 8): ZeRO-1's whole gradients (79.6 GB in all) no longer
        # fit; ZeRO-2 (63.6 GB) does and is cheaper than ZeRO-3.
        result, rec, _ = self.recommend(block_model(params=4e9, per_sample=5e9), "--world-size", "8",
                                        "--activation-checkpoint", "none", "--price", "H100-SXM=3")
        self.assertEqual(self.fits(result), {"none": False, "optimizer": False, "gradients": True, "parameters": True})
        self.assertEqual(rec["sharding"], "gradients")
        self.assertIn("set dist.sharding=gradients", " ".join(rec["reasons"]))
        # 14B parameters: only ZeRO-3 fits.
        result, rec, _ = self.recommend(block_model(params=14e9), "--world-size", "8",
                                        "--activation-checkpoint", "none")
        self.assertEqual(self.fits(result), {"none": False, "optimizer": False, "gradients": False, "parameters": True})
        self.assertEqual(rec["sharding"], "parameters")

    def test_checkpointing_when_the_batch_does_not_fit_one_gpu(self):
        # 1B parameters, 13 GB of activations a sample: 59.8 GB of an H100's 77.3 are left for them,
        # so batch 8 fits only with full checkpointing (2.3 GB a sample); light (9.0 GB) does not.
        m = block_model(params=1e9, per_sample=13e9)
        result, rec, text = self.recommend(m)
        rows = {r["activation_checkpoint"]: r for r in result["configurations"]["rows"]}
        self.assertEqual({k: r["fits"] for k, r in rows.items()}, {"none": False, "full": True, "light": False})
        self.assertEqual((rec["activation_checkpoint"], rec["world_size"]), ("full", 1))
        self.assertIn("set model.activation_checkpoint_every=1", " ".join(rec["reasons"]))
        self.assertIn("to recompute activations", " ".join(rec["reasons"]))
        # At batch 5 light fits too (45 GB; none needs 65) and is cheaper (no FLOPs recomputed): it wins.
        result, rec, _ = self.recommend(block_model(params=1e9, per_sample=13e9, batch=5))
        fits = {r["activation_checkpoint"]: r["fits"] for r in result["configurations"]["rows"]}
        self.assertEqual(fits, {"none": False, "full": True, "light": True})
        self.assertEqual(rec["activation_checkpoint"], "light")
        # Where the plain batch fits one GPU, checkpointing only costs time: the usual recommendation.
        result, rec, _ = self.recommend(block_model(params=1e9, per_sample=1e9))
        self.assertEqual((rec["activation_checkpoint"], rec["sharding"]), ("none", "none"))

    def test_data_parallel_needs_room_for_ddp_buckets(self):
        """On one GPU the plan recommends data-parallel where it pays and runs an hour; DDP's bucket copy
        of the gradients must fit beside the batch too, else it says to plan sharding."""
        m = block_model(params=3e9, per_sample=1e9, batch=8)
        m["dataset"]["train_samples"] = 10_000_000  # a long run: several GPUs are worth it
        fits = self.recommend(m, "--activation-checkpoint", "none")[1]
        self.assertGreater(fits["world_size"], 1)  # 69.5 GB with the buckets: room for them
        # 77.3 GB usable less 0.5 context, 12 parameters, 37 F leave 27.8 GB for activations alone, 15.8 beside
        # the 12 GB of buckets: batch 20 fits one GPU, not DDP.
        tight = dict(m, batch_size=20)
        rec = self.recommend(tight, "--activation-checkpoint", "none")[1]
        self.assertEqual(rec["world_size"], 1)
        self.assertIn("DDP's buckets", " ".join(rec["reasons"]))
        self.assertIn("plan sharding with --world-size", " ".join(rec["reasons"]))
        # With gradient_as_bucket_view the buckets are the gradients: data-parallel again.
        view = self.recommend(dict(tight, gradient_as_bucket_view=True), "--activation-checkpoint", "none")[1]
        self.assertGreater(view["world_size"], 1)

    def test_nothing_fits(self):
        # 100B parameters on 2 GPUs: even ZeRO-3 holds 200 GB of moments a GPU.
        m = block_model(params=100e9, blocks=80)
        result, rec, text = self.recommend(m, "--world-size", "2")
        self.assertTrue(all(r["largest_batch"] == 0 for r in result["configurations"]["rows"]))
        self.assertIsNone(rec["gpu"])
        self.assertIn("no configuration at 2 GPUs fits even one sample", rec["text"])
        found = re.search(r"fit one sample at --world-size (\d+)", rec["text"])
        self.assertTrue(found, rec["text"])
        n = int(found.group(1))
        # It is the smallest power of two that does: ZeRO-3 with the least activations fits there, not at n/2.
        for size, fits in ((n, True), (n // 2, False)):
            r, _, _ = self.recommend(dict(m, batch_size=1), "--world-size", str(size), "--sharding", "parameters")
            self.assertEqual(any(x["fits"] for x in r["configurations"]["rows"]), fits, size)
        self.assertIn("Recommendation: no configuration at 2 GPUs", text)
        # Stages or modes left out: the plan names the one that would fit, not a larger world.
        m = block_model(params=3e9, per_sample=60e9, batch=2)
        _, rec, _ = self.recommend(m, "--world-size", "2", "--sharding", "none", "--activation-checkpoint", "none")
        self.assertIsNone(rec["gpu"])
        self.assertIn("among the stages and modes asked for", rec["text"])
        self.assertIn("(--sharding parameters --activation-checkpoint full)", rec["text"])
        self.assertNotIn("--world-size", rec["text"])

    def test_batch_too_big_everywhere_suggests_accumulation(self):
        m = block_model(params=1e9, per_sample=10e9, batch=64)
        result, rec, _ = self.recommend(m, "--world-size", "8")
        self.assertFalse(any(r["fits"] for r in result["configurations"]["rows"]))
        best = max(r["largest_batch"] for r in result["configurations"]["rows"])
        self.assertGreater(best, 0)
        accumulate = math.ceil(64 / best)
        self.assertIn(f"trainer.accumulate_grad_batches={accumulate}", " ".join(rec["reasons"]))


    def test_docs_example(self):
        """docs/planning.md's example is what the planner prints for gpt2_xl() at 8 H100s: every line of its
        excerpt, and the recommendation's start."""
        doc = (ROOT / "docs" / "planning.md").read_text()
        block = re.search(r"prints \(rows cut\):\n\n```\n(.*?)```", doc, re.S)
        self.assertTrue(block, "docs/planning.md: the example's code block")
        lines = block.group(1).splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("Recommendation:"))
        command = re.search(r"`python3 tools/plan/plan.py GPT2_XL.json ([^`]*)`", doc)
        self.assertTrue(command, "docs/planning.md: the example's command")
        _, _, text = self.recommend(gpt2_xl(), *command.group(1).split())
        printed = [line.rstrip() for line in text.splitlines()]
        for line in lines[:at]:
            if line.strip() != "...":
                self.assertIn(line.rstrip(), printed)
        said = " ".join(line.strip() for line in lines[at:]).removesuffix("...").strip()
        self.assertTrue(printed[-1].startswith(said), (printed[-1], said))


class RealBatch(unittest.TestCase):
    """A data.batch_size larger than the training set is planned at the batch the run really uses."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def check_plan(self, m):
        path = write_json(self.dir, "huge_batch.json", m)
        status, out, err = run_main([path, "--json", "--runs-dir", ""])
        self.assertEqual(status, 0, err)
        result = json.loads(out)
        sentence = "data.batch_size=16777216 is larger than the 2000 training samples: planned for batches of 2000"
        self.assertIn(sentence, result["notes"])
        self.assertEqual(result["measurement"]["batch_size"], 2000)
        self.assertEqual(result["measurement"]["steps_per_epoch"], 1)
        # 2000 x 612,000 B of activations: 1.2 GB, which a T4 holds (16,777,216 x 612,000 B would fit nothing).
        t4 = [r for r in result["rows"] if r["gpu"] == "T4" and r["precision"] == "fp32"][0]
        self.assertTrue(t4["fits"], t4)
        self.assertAlmostEqual(t4["memory_needed_bytes"],
                               0.5 * GIB + m["parameter_bytes"] + m["buffer_bytes"] + 2150000 + 2000 * 612000)
        self.assertNotIn("accumulation", result["recommendation"]["text"])
        status, out, _ = run_main([path, "--runs-dir", ""])
        self.assertEqual(status, 0)
        self.assertIn("note: " + sentence, out)
        self.assertIn("GPUs at batch 2000 per GPU", out)

    def test_older_file_with_the_nominal_batch(self):
        m = small_model(batch_size=16777216)
        m["dataset"]["train_samples"] = 2000
        self.check_plan(m)

    def test_measurement_of_the_real_batch(self):
        m = small_model(batch_size=2000, config_batch_size=16777216)
        m["dataset"]["train_samples"] = 2000
        self.check_plan(m)

    def test_a_batch_within_the_training_set_has_no_note(self):
        status, out, err = run_main([EXAMPLE, "--json", "--runs-dir", ""])
        self.assertEqual(status, 0, err)
        self.assertFalse(any("larger than" in n for n in json.loads(out)["notes"]))


class Options(unittest.TestCase):
    """Every option is range-checked before anything is read: exit 2 with the option named."""

    BAD = [(["--price", "H100=1e400"], "--price H100=1e400"), (["--price", "H100=-1"], "--price H100=-1"),
           (["--price", "H100=nan"], "--price H100=nan"), (["--price", "H100=inf"], "--price H100=inf"),
           (["--price", "H100=1e9"], "--price H100=1e9"), (["--price", "=2"], "--price =2"),
           (["--price", "A999=1"], "no GPU 'A999'"), (["--gpu", "A999"], "--gpu a999"),
           (["--margin", "nan"], "--margin nan"), (["--margin", "-0.1"], "--margin -0.1"),
           (["--mfu", "inf"], "--mfu inf"), (["--mfu", "0"], "--mfu 0"),
           (["--context-gib", "nan"], "--context-gib nan"), (["--context-gib", "1e400"], "--context-gib inf"),
           (["--context-gib", "-1"], "--context-gib -1"),
           (["--step-floor-ms", "nan"], "--step-floor-ms nan"), (["--step-floor-ms", "1e300"], "--step-floor-ms"),
           (["--launch-us", "nan"], "--launch-us nan"), (["--launch-us", "-5"], "--launch-us -5"),
           (["--graph-launch-us", "inf"], "--graph-launch-us inf"), (["--kernel-us", "1e20"], "--kernel-us"),
           (["--host-ram-gib", "0"], "--host-ram-gib 0"), (["--host-ram-gib", "nan"], "--host-ram-gib nan"),
           (["--host-ram-gib", "1e400"], "--host-ram-gib inf"), (["--precision", "fp8"], "--precision"),
           (["--world-size", "0"], "--world-size"), (["--world-size", "-8"], "--world-size"),
           (["--world-size", "1.5"], "--world-size"), (["--world-size", "eight"], "--world-size"),
           (["--world-size", "1e9"], "--world-size"), (["--world-size", "65537"], "--world-size"),
           (["--sharding", "zero4"], "--sharding"), (["--sharding", "ZeRO-1"], "--sharding"),
           (["--activation-checkpoint", "half"], "--activation-checkpoint"), (["--link", "wifi"], "--link"),
           (["--sharding", "optimizer"], "--world-size N with N > 1"),
           (["--world-size", "1", "--sharding", "parameters"], "--world-size N with N > 1")]

    def test_bad_values_are_usage_errors(self):
        for args, named in self.BAD:
            for first in ([EXAMPLE], ["--check"], [Path("/nonexistent/measure.json")]):
                status, out, err = run_main(first + args)
                self.assertEqual(status, 2, (first, args, err))
                self.assertIn(named, err, (first, args))
                self.assertEqual(out, "", args)

    def test_check_passes_good_options(self):
        status, out, err = run_main(["--check", "--price", "H100=2.5", "--gpu", "T4", "--margin", "0.2",
                                     "--host-ram-gib", "64", "--price", "T4=0"])
        self.assertEqual((status, out, err), (0, "", ""))
        status, _, err = run_main([])
        self.assertEqual(status, 2)
        self.assertIn("MEASURE.json", err)

    def test_scaling_options_accepted(self):
        for args in (["--world-size", "8", "--sharding", "optimizer", "--sharding", "gradients"],
                     ["--world-size", "65536", "--sharding", "all", "--link", "400g-ib"],
                     ["--sharding", "none", "--activation-checkpoint", "light", "--activation-checkpoint", "none"]):
            status, out, err = run_main(["--check"] + args)
            self.assertEqual((status, out, err), (0, "", ""), args)
        # The stages and modes asked for, in the order of least split first; all = every one.
        args = plan.parse_args(["m.json", "--world-size", "4", "--sharding", "parameters", "--sharding", "none"])
        self.assertEqual(args.sharding, ["none", "parameters"])
        self.assertEqual(plan.parse_args(["m.json", "--world-size", "4"]).sharding, list(constants.SHARDING))
        self.assertEqual(plan.parse_args(["m.json"]).sharding, ["none"])  # one GPU: nothing to split
        self.assertEqual(plan.parse_args(["m.json", "--activation-checkpoint", "all", "--activation-checkpoint",
                                          "full"]).activation_checkpoint, list(constants.CHECKPOINT_MODES))

    def test_ember_forwards_every_planner_option(self):
        source = (ROOT / "tools" / "plan" / "plan.py").read_text()
        options = set(re.findall(r'p\.add_argument\("(--[a-z-]+)"', source)) - {"--check"}  # ember runs --check
        self.assertIn("--world-size", options)
        text = (ROOT / "tools" / "ember").read_text()
        body = text[text.index("cmd_plan() {"):text.index("cmd_bs_find() {")]
        for option in options:
            self.assertRegex(body, rf"[|(\s]{re.escape(option)}[|)]", f"tools/ember plan does not forward {option}")
            if option not in ("--json", "--no-color"):
                self.assertIn(f"{option}=*", body, option)

    def test_ember_checks_before_measuring(self):
        # tools/ember plan refuses a bad planner option before it builds or measures anything.
        text = (ROOT / "tools" / "ember").read_text()
        body = text[text.index("cmd_plan() {"):text.index("cmd_bs_find() {")]
        self.assertLess(body.index("plan.py\" --check"), body.index("cmd_build"), "check before the build")


def hand_model(**fields):
    """A 250M-parameter block model with round numbers for hand computation: 1e9 bytes of fp32 gradients
    (39 DDP buckets of 25 MiB: 1e9 / 26,214,400 = 38.1), 4.945e12 training FLOPs a sample, batch 8: on an
    H100 in bf16 (989 TFLOP/s) at --mfu 0.5 a step is 8 x 4.945e12 / 494.5e12 = 0.08 s, its backward 2/3 of
    that (0.053333 s)."""
    return block_model(params=2.5e8, batch=8, train_flops_per_sample=4.945e12, **fields)


class Nodes(unittest.TestCase):
    """Several nodes: the hierarchical ring, its latency and overlap, and the verdict on a second node."""

    HAND = ["--gpu", "H100-SXM", "--precision", "bf16-mixed", "--sharding", "none", "--activation-checkpoint", "none",
            "--mfu", "0.5", "--step-floor-ms", "0"]

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def plan_json(self, m, *extra):
        status, out, err = run_main([write_json(self.dir, "m.json", m), "--json", "--runs-dir", "", *extra])
        self.assertEqual(status, 0, err)
        return json.loads(out)

    def test_ring_by_hand(self):
        # Bus bandwidth: the slowest hop. 2 nodes of 8 H100s (NVLink 450 GB/s) with one 100 GbE NIC each
        # (12.5 GB/s): the NIC; with 8 NICs of 400 Gb/s (8 x 50 = 400 GB/s): still the NICs, below NVLink.
        self.assertEqual(arithmetic.ring_bus_bandwidth(2, 8, 450e9, 12.5e9), 12.5e9)
        self.assertEqual(arithmetic.ring_bus_bandwidth(2, 8, 450e9, 400e9), 400e9)
        self.assertEqual(arithmetic.ring_bus_bandwidth(1, 8, 450e9, 12.5e9), 450e9)  # one node: no NIC in the ring
        self.assertEqual(arithmetic.ring_bus_bandwidth(4, 1, 450e9, 12.5e9), 12.5e9)  # a GPU a node: only NICs
        # NCCL's ring latency: 16 GPUs on 2 nodes, all-reduce: 2 x 15 = 30 steps, 2 x 1 = 2 across:
        # 8.4 + 28 x 3.4 + 2 x 9.6 = 8.4 + 95.2 + 19.2 = 122.8 us. Reduce-scatter: 15 steps, 1 across:
        # 8.4 + 14 x 3.4 + 9.6 = 65.6 us. One node of 8: 8.4 + 14 x 3.4 = 56.0 us. 4 nodes of 1 GPU: 6 steps,
        # all across: 8.4 + 6 x 9.6 = 66.0 us. One GPU: nothing.
        nv, net = 3.4e-6, 9.6e-6
        self.assertAlmostEqual(arithmetic.ring_latency_seconds("all-reduce", 16, 2, nv, net), 122.8e-6, places=12)
        self.assertAlmostEqual(arithmetic.ring_latency_seconds("reduce-scatter", 16, 2, nv, net), 65.6e-6, places=12)
        self.assertAlmostEqual(arithmetic.ring_latency_seconds("all-gather", 16, 2, nv, net), 65.6e-6, places=12)
        self.assertAlmostEqual(arithmetic.ring_latency_seconds("all-reduce", 8, 1, nv, net), 56.0e-6, places=12)
        self.assertAlmostEqual(arithmetic.ring_latency_seconds("all-reduce", 4, 4, nv, net), 66.0e-6, places=12)
        self.assertEqual(arithmetic.ring_latency_seconds("all-reduce", 1, 1, nv, net), 0.0)
        # 1 GB all-reduced over those 16 GPUs at 12.5 GB/s in one collective: 2 x 15/16 x 1e9 / 12.5e9 = 0.15 s
        # + 122.8 us; a reduce-scatter, half: 0.075 s + 65.6 us; in 39 buckets: 39 latencies.
        self.assertAlmostEqual(arithmetic.collective_seconds("all-reduce", 1e9, 16, 2, 12.5e9, nv, net), 0.1501228,
                               places=12)
        self.assertAlmostEqual(arithmetic.collective_seconds("reduce-scatter", 1e9, 16, 2, 12.5e9, nv, net), 0.0750656,
                               places=12)
        self.assertAlmostEqual(arithmetic.collective_seconds("all-reduce", 1e9, 16, 2, 12.5e9, nv, net, calls=39),
                               0.15 + 39 * 122.8e-6, places=12)
        # Overlap: 39 buckets of 0.1547892 s in all behind a 0.0533333 s backward: all but
        # 0.0533333 x 38/39 = 0.0519658 s shows (0.1028234 s); a reduction that fits behind backward shows
        # only its last bucket (6.0728889 ms / 39 = 0.1557151 ms); one bucket shows whole.
        backward = 0.08 * 2 / 3
        self.assertAlmostEqual(arithmetic.exposed_seconds(0.1547892, 39, backward), 0.1547892 - backward * 38 / 39,
                               places=12)
        self.assertAlmostEqual(arithmetic.exposed_seconds(0.1547892, 39, backward), 0.1028234, places=7)
        self.assertAlmostEqual(arithmetic.exposed_seconds(6.0728889e-3, 39, backward), 6.0728889e-3 / 39, places=12)
        self.assertEqual(arithmetic.exposed_seconds(0.01, 1, backward), 0.01)

    def test_one_and_two_nodes_by_hand(self):
        """hand_model() with DDP on 2 nodes of 8 H100s, each with one 100 GbE NIC, and with 8 NDR NICs."""
        plan_2x_eth = self.plan_json(hand_model(), *self.HAND, "--nodes", "2", "--inter-link", "eth-100")["nodes"]
        one, two = plan_2x_eth["counts"]
        self.assertEqual((one["nodes"], one["gpus"], two["nodes"], two["gpus"]), (1, 8, 2, 16))
        self.assertEqual(plan_nodes.collective_calls(hand_model(), "none", "gradients"), 39)
        # One node: 2 x 7/8 x 1e9 / 450e9 = 3.8888889 ms + 39 x 56 us = 2.184 ms: 6.0728889 ms, of which the
        # last bucket shows, 0.1557151 ms: step 0.0801557 s, 8 GPUs x 8 samples / step = 798.45 samples/s.
        self.assertEqual((one["link"], one["bus_gb_s"]), ("NVLink", 450.0))
        self.assertAlmostEqual(one["communication_seconds"], 1.75e9 / 450e9 + 39 * 56e-6, places=12)
        self.assertAlmostEqual(one["communication_seconds"], 6.0728889e-3, places=9)
        self.assertAlmostEqual(one["exposed_seconds"], 6.0728889e-3 / 39, places=9)
        self.assertAlmostEqual(one["step_seconds"], 0.0801557, places=7)
        self.assertAlmostEqual(one["samples_per_second"], 798.45, places=2)
        # Two nodes over 100 GbE: 2 x 15/16 x 1e9 / 12.5e9 = 0.15 s + 39 x 122.8 us = 4.7892 ms: 0.1547892 s;
        # exposed 0.1547892 - 0.0533333 x 38/39 = 0.1028234 s; step 0.1828234 s; 16 x 8 / step = 700.13
        # samples/s, 0.8769x one node's (efficiency 0.4384): it costs more than it saves.
        self.assertEqual((two["link"], two["bus_gb_s"]), ("100 GbE", 12.5))
        self.assertAlmostEqual(two["communication_seconds"], 0.1547892, places=9)
        self.assertAlmostEqual(two["exposed_seconds"], 0.1028234, places=7)
        self.assertAlmostEqual(two["step_seconds"], 0.1828234, places=7)
        self.assertAlmostEqual(two["samples_per_second"], 700.13, places=2)
        self.assertAlmostEqual(two["speedup"], 0.8769, places=4)
        self.assertAlmostEqual(two["efficiency"], 0.4384, places=4)
        self.assertEqual(plan_2x_eth["verdict"]["second_node"], "costs more than it saves")
        # The same global batch (64 a step) on 16 GPUs: batch 4 each, 0.04 s of compute, a 0.0266667 s
        # backward hides 0.0266667 x 38/39 = 0.0259829 s: 0.1547892 - 0.0259829 = 0.1288063 s shows;
        # step 0.1688063 s against 0.0801557 s: 0.4748x.
        strong = two["strong"]
        self.assertEqual((strong["batch"], strong["accumulate_grad_batches"]), (4, 1))
        self.assertAlmostEqual(strong["step_seconds"], 0.1688063, places=7)
        self.assertAlmostEqual(strong["speedup"], 0.0801557 / 0.1688063, places=4)
        # 8 NICs of 400 Gb/s a node: busbw min(450, 400) = 400 GB/s: 1.875e9 / 400e9 = 4.6875 ms + 4.7892 ms =
        # 9.4767 ms, of which the last bucket shows (0.2429923 ms): step 0.0802430 s, 1.99782x: it pays.
        dgx = self.plan_json(hand_model(), *self.HAND, "--nodes", "2", "--inter-link", "ib-ndr",
                             "--nics-per-node", "8")["nodes"]
        two = dgx["counts"][1]
        self.assertEqual((two["link"], two["bus_gb_s"]), ("8 x 400G IB", 400.0))
        self.assertAlmostEqual(two["communication_seconds"], 9.4767e-3, places=9)
        self.assertAlmostEqual(two["exposed_seconds"], 9.4767e-3 / 39, places=9)
        self.assertAlmostEqual(two["speedup"], 2 * 0.0801557 / 0.0802430, places=4)
        self.assertEqual(dgx["verdict"]["second_node"], "pays")

    def test_verdict_flips_with_a_slow_network(self):
        """Large gradients, little compute: over one 400G InfiniBand NIC a node a second node pays, over 10 GbE
        it costs more than it saves; in between (200 GbE) it is faster but does not pay."""
        verdicts = {}
        for link in ("ib-ndr", "eth-200", "eth-10"):
            result = self.plan_json(hand_model(), *self.HAND, "--nodes", "2", "--inter-link", link)
            verdicts[link] = result["nodes"]["verdict"]
            if link == "eth-10":
                self.assertIn("it costs more than it saves", " ".join(result["recommendation"]["reasons"]))
                self.assertIn("plan --nodes 1", " ".join(result["recommendation"]["reasons"]))
        # ib-ndr: 1.875e9 / 50e9 = 37.5 ms + 4.79 ms = 42.29 ms hides behind the 53.3 ms backward but for its
        # last bucket: ~2x. eth-200 (25 GB/s): 75 ms + 4.79 ms = 79.79 ms, 27.8 ms shows: step 107.8 ms,
        # 2 x 80.16 / 107.8 = 1.49x (efficiency 0.74 < 0.8). eth-10 (1.25 GB/s): 1.5 s: 0.1x.
        self.assertEqual(verdicts["ib-ndr"]["second_node"], "pays")
        self.assertEqual(verdicts["eth-200"]["second_node"], "does not pay")
        self.assertEqual(verdicts["eth-10"]["second_node"], "costs more than it saves")
        self.assertIn("it pays", verdicts["ib-ndr"]["text"])
        self.assertIn("faster, but it does not pay", verdicts["eth-200"]["text"])
        self.assertIn("1.49x the samples/s of one node (efficiency 0.74)", verdicts["eth-200"]["text"])
        self.assertIn("a second node adds", verdicts["eth-10"]["text"])
        status, text, err = run_main([write_json(self.dir, "m.json", hand_model()), "--runs-dir", "", *self.HAND,
                                      "--nodes", "2", "--inter-link", "eth-10"])
        self.assertEqual(status, 0, err)
        self.assertIn("Nodes: 1 to 2 nodes of 8 GPUs", text)
        self.assertIn("Verdict: a second node adds", text)
        self.assertIn(": it costs more than it saves, two nodes train slower than one node", text)

    def test_overlap_of_each_stage(self):
        """What shows of each stage's collectives: reductions behind backward, all-gathers whole."""
        m = hand_model()
        bus, hops = 50e9, (3.4e-6, 9.6e-6)
        # ZeRO-1: reduce-scatter (39 buckets, behind a long backward: its last bucket shows) + all-gather (whole).
        rs = arithmetic.collective_seconds("reduce-scatter", 1e9, 16, 2, bus, *hops, calls=39)
        ag = arithmetic.collective_seconds("all-gather", 1e9, 16, 2, bus, *hops, calls=39)
        got = plan_nodes.step_communication(m, "optimizer", 16, 2, bus, hops, 1, 10.0)
        self.assertAlmostEqual(got["seconds"], rs + ag, places=12)
        self.assertAlmostEqual(got["exposed_seconds"], rs / 39 + ag, places=12)
        # DDP with no backward to hide behind: all of it shows.
        ar = arithmetic.collective_seconds("all-reduce", 1e9, 16, 2, bus, *hops, calls=39)
        self.assertAlmostEqual(plan_nodes.step_communication(m, "none", 16, 2, bus, hops, 1, 0.0)["exposed_seconds"], ar)
        # ZeRO-3 with 4 micro-batches: per micro-batch two all-gathers of the 32 blocks (32 collectives each,
        # whole) and a reduce-scatter in 32 + 1 units; per step the parameters outside the blocks (one).
        z3 = plan_nodes.step_communication(m, "parameters", 16, 2, bus, hops, 4, 10.0)
        inside, outside = m["blocks"]["parameter_bytes"], m["parameter_bytes"] - m["blocks"]["parameter_bytes"]
        gather = arithmetic.collective_seconds("all-gather", inside, 16, 2, bus, *hops, calls=32)
        reduce = arithmetic.collective_seconds("reduce-scatter", 1e9, 16, 2, bus, *hops, calls=33)
        rest = arithmetic.collective_seconds("all-gather", outside, 16, 2, bus, *hops, calls=1)
        self.assertAlmostEqual(z3["seconds"], 4 * (2 * gather + reduce) + rest, places=12)
        self.assertAlmostEqual(z3["exposed_seconds"], 4 * (2 * gather + reduce / 33) + rest, places=12)

    def test_contradictions_are_usage_errors(self):
        bad = [(["--world-size", "12", "--nodes", "2", "--gpus-per-node", "8"],
                "--world-size 12 contradicts --nodes 2 x --gpus-per-node 8 = 16 GPUs"),
               (["--world-size", "12", "--nodes", "5"], "--world-size 12 does not split into --nodes 5 equal nodes"),
               (["--world-size", "12", "--gpus-per-node", "8"], "not a whole number of nodes of --gpus-per-node 8"),
               (["--link", "25gbe", "--nodes", "2"], "--link 25gbe is one link for every GPU"),
               (["--link", "nvlink", "--inter-link", "ib-ndr"], "--link nvlink is one link for every GPU"),
               (["--inter-link", "eth-10"], "--inter-link links nodes, but the plan has one node"),
               (["--world-size", "8", "--nics-per-node", "8"],
                "--nics-per-node links nodes, but the plan has one node"),
               (["--nodes", "4", "--gpus-per-node", "1", "--intra-link", "nvlink"], "each node has one GPU"),
               (["--nodes", "40000", "--gpus-per-node", "2"], "80000 GPUs: expected at most 65536"),
               (["--nodes", "0"], "--nodes"), (["--gpus-per-node", "1.5"], "--gpus-per-node"),
               (["--nics-per-node", "0"], "--nics-per-node"), (["--inter-link", "wifi"], "--inter-link"),
               (["--inter-link", "-5"], "--inter-link"), (["--inter-link", "nan"], "--inter-link"),
               (["--intra-link", "inf"], "--intra-link"), (["--intra-link", "token-ring"], "--intra-link")]
        for args, said in bad:
            for first in ([EXAMPLE], ["--check"]):
                status, out, err = run_main(first + args)
                self.assertEqual(status, 2, (args, err))
                self.assertIn(said, err, args)
                self.assertEqual(out, "", args)

    def test_world_size_from_nodes(self):
        def topology(*args):
            t = plan.parse_args(["m.json", *args]).topology
            return t["world_size"], t["nodes"], t["gpus_per_node"]
        self.assertEqual(topology(), (1, 1, 1))
        self.assertEqual(topology("--nodes", "2"), (16, 2, 8))  # nodes of 8 unless told
        self.assertEqual(topology("--nodes", "2", "--gpus-per-node", "4"), (8, 2, 4))
        self.assertEqual(topology("--world-size", "16", "--nodes", "4"), (16, 4, 4))
        self.assertEqual(topology("--world-size", "16", "--gpus-per-node", "2"), (16, 8, 2))
        self.assertEqual(topology("--world-size", "16", "--nodes", "2", "--gpus-per-node", "8"), (16, 2, 8))
        self.assertEqual(topology("--gpus-per-node", "4"), (4, 1, 4))
        self.assertEqual(topology("--world-size", "12"), (12, 2, 8))  # the last node holds the rest
        self.assertEqual(plan.parse_args(["m.json", "--nodes", "2"]).world_size, 16)
        # The options reach the plan: --nodes 2 is --world-size 16 in section 4.
        result = self.plan_json(hand_model(), *self.HAND, "--nodes", "2")
        self.assertEqual(result["configurations"]["world_size"], 16)
        self.assertEqual({r["world_size"] for r in result["configurations"]["rows"]}, {16})
        self.assertEqual((result["assumptions"]["nodes"], result["assumptions"]["gpus_per_node"]), (2, 8))
        self.assertEqual([c["nodes"] for c in result["nodes"]["counts"]], [1, 2])
        self.assertEqual(plan_nodes.node_counts(5), [1, 2, 4, 5])
        self.assertEqual(plan_nodes.node_counts(1), [1])

    def test_older_options_plan_as_before(self):
        """--world-size and --link without the topology flags plan what they did: nodes of 8 and one 400G IB NIC a
        node (50 GB/s for the ring), the same rows as the new spelling of that topology."""
        m = block_model(accumulate=2)
        base = ["--gpu", "H100-SXM", "--activation-checkpoint", "none"]

        def rows(*args):
            return [(r["sharding"], r["link"], r["link_gb_s"], r["communication_seconds"], r["step_seconds"])
                    for r in self.plan_json(m, *base, *args)["configurations"]["rows"]]

        old = rows("--world-size", "16")
        self.assertEqual({(link, gb_s) for _, link, gb_s, _, _ in old}, {("400G IB", 50.0)})
        self.assertEqual(old, rows("--nodes", "2", "--gpus-per-node", "8", "--inter-link", "ib-ndr",
                                   "--nics-per-node", "1"))
        self.assertEqual(old, rows("--nodes", "2", "--inter-link", "400g-ib"))  # --link's name, accepted
        # --link 25gbe at 8: each GPU a node of its own with one 25 GbE NIC.
        self.assertEqual(rows("--world-size", "8", "--link", "25gbe"),
                         rows("--nodes", "8", "--gpus-per-node", "1", "--inter-link", "eth-25"))
        # --link nvlink at 16: one node of 16 over NVLink; no nodes section.
        nvlink = self.plan_json(m, *base, "--world-size", "16", "--link", "nvlink")
        self.assertEqual({r["link"] for r in nvlink["configurations"]["rows"]}, {"NVLink"})
        self.assertFalse(nvlink["nodes"]["shown"])
        # Within a node nothing is added: no nodes section, and the same rows as a one-node topology.
        eight = self.plan_json(m, *base, "--world-size", "8")
        self.assertFalse(eight["nodes"]["shown"])
        self.assertEqual(rows("--world-size", "8"), rows("--gpus-per-node", "8"))
        status, text, err = run_main([write_json(self.dir, "m.json", m), "--runs-dir", "", *base, "--world-size", "8"])
        self.assertEqual(status, 0, err)
        self.assertNotIn("Nodes:", text)
        # More NICs raise section 4's link too: 8 x 400G IB = 400 GB/s, below NVLink's 450.
        dgx = rows("--nodes", "2", "--nics-per-node", "8")
        self.assertEqual({(link, gb_s) for _, link, gb_s, _, _ in dgx}, {("8 x 400G IB", 400.0)})
        for (_, _, _, slow, _), (_, _, _, fast, _) in zip(old, dgx):
            self.assertAlmostEqual(fast, slow * 50 / 400)

    def test_one_node_cannot_hold_it(self):
        """ZeRO's per-GPU state shrinks with more nodes: scaling is measured from the fewest that hold it."""
        result = self.plan_json(block_model(params=14e9), "--gpu", "H100-SXM", "--nodes", "4",
                                "--activation-checkpoint", "none", "--sharding", "gradients")
        nodes = result["nodes"]
        self.assertEqual([c["fits"] for c in nodes["counts"]], [False, True, True])
        self.assertIsNone(nodes["counts"][0]["speedup"])
        self.assertEqual(nodes["counts"][1]["speedup"], 1.0)
        self.assertIn("one node of 8 GPUs cannot hold this configuration", nodes["verdict"]["text"])
        self.assertIn("going from 2 to 4 nodes adds", nodes["verdict"]["text"])
        self.assertEqual(nodes["global_batch"], 16 * 8)
        # Nothing fits at all: the section says so.
        t4 = self.plan_json(block_model(params=14e9), "--gpu", "T4", "--nodes", "2")["nodes"]
        self.assertEqual((t4["shown"], t4["available"]), (True, False))
        self.assertIn("nothing to scale", t4["why"])

    def test_json_is_strict(self):
        status, out, err = run_main([write_json(self.dir, "m.json", hand_model()), "--json", "--runs-dir", "",
                                     "--nodes", "4"])
        self.assertEqual(status, 0, err)

        def no_constant(name):
            raise ValueError(f"{name} in the JSON")
        nodes = json.loads(out, parse_constant=no_constant)["nodes"]
        for key in ("gpu", "precision", "sharding", "activation_checkpoint", "links", "counts", "verdict",
                    "global_batch"):
            self.assertIn(key, nodes)
        self.assertEqual(set(nodes["verdict"]), {"second_node", "most_paying_nodes", "text", "strong_text"})

    def test_docs_example(self):
        """docs/planning.md's nodes example is what the planner prints for gpt2_xl() over 4 nodes of 25 GbE: every
        line, and the table of other networks."""
        doc = (ROOT / "docs" / "planning.md").read_text()
        section = doc[doc.index("## Several nodes in the plan"):]
        command = re.search(r"`python3 tools/plan/plan.py GPT2_XL.json ([^`]*)`", section)
        block = re.search(r"prints \(`tests/tools/plan_test.py` checks every line of it\):\n\n```\n(.*?)```", section,
                          re.S)
        self.assertTrue(command and block, "docs/planning.md: the nodes example's command and output")
        args = command.group(1).split()
        path = write_json(self.dir, "GPT2_XL.json", gpt2_xl())
        status, text, err = run_main([path, "--runs-dir", "", *args])
        self.assertEqual(status, 0, err)
        printed = [line.rstrip() for line in text.splitlines()]
        lines = block.group(1).splitlines()
        self.assertTrue(lines[0].startswith("Nodes:"))
        for line in lines:
            self.assertIn(line.rstrip(), printed)
        # The table of networks: each row's busbw, speed-up, efficiency and verdict at two nodes.
        rows = re.findall(r"^\| `([^`]+)` \| ([0-9.]+) GB/s \| ([^|]+) \| ([^|]+) \| ([0-9.]+)x \| ([0-9.]+) \| "
                          r"([a-z ]+) \|$", section, re.M)
        self.assertEqual(len(rows), 5)
        base = args[:args.index("--inter-link")]
        for link, gb_s, comm, exposed, speedup, efficiency, verdict in rows:
            nodes = self.plan_json(gpt2_xl(), *base, "--inter-link", *link.split())["nodes"]
            two = nodes["counts"][1]
            self.assertEqual(two["bus_gb_s"], float(gb_s), link)
            self.assertEqual(formats.fmt_seconds(two["communication_seconds"]), comm.strip(), link)
            self.assertEqual(formats.fmt_seconds(two["exposed_seconds"]), exposed.strip(), link)
            self.assertEqual(f"{two['speedup']:.2f}", speedup, link)
            self.assertEqual(f"{two['efficiency']:.2f}", efficiency, link)
            self.assertEqual(nodes["verdict"]["second_node"], verdict, link)


class GpuTable(unittest.TestCase):
    # gpus.toml row -> (model, variant) of kGpuPeaks in lib/src/core/flops.cpp.
    CPP_ROW = {"T4": ("T4", ""), "V100-16GB": ("V100", ""), "V100-32GB": ("V100", ""),
               "A100-40GB": ("A100", ""), "A100-80GB": ("A100", ""), "L4": ("L4", ""), "L40S": ("L40S", ""),
               "H100-SXM": ("H100", ""), "H100-PCIe": ("H100", "PCIe"), "H200": ("H200", "")}

    def test_peaks_match_ember_cpp_table(self):
        source = (ROOT / "lib" / "src" / "core" / "flops.cpp").read_text()
        number = r"\s*([0-9.]+e[0-9]+|0\.0|0)\s*"
        rows = re.findall(r'\{"(\w+)",\s*"(\w*)",' + ",".join([number] * 4) + r"\}", source)
        self.assertGreaterEqual(len(rows), 10, "kGpuPeaks not found in flops.cpp: update this parser")
        cpp = {(model, variant): [float(x) / 1e12 for x in peaks] for model, variant, *peaks in rows}
        gpus = plan_inputs.load_gpus(GPUS)
        self.assertEqual({g["name"] for g in gpus}, set(self.CPP_ROW))
        for gpu in gpus:
            expected = cpp[self.CPP_ROW[gpu["name"]]]
            got = [gpu["bf16_tflops"], gpu["fp16_tflops"], gpu["tf32_tflops"], gpu["fp32_tflops"]]
            for e, g in zip(expected, got):
                self.assertTrue(math.isclose(e, g, rel_tol=1e-9), f"{gpu['name']}: {got} != C++ {expected}")
            self.assertIn("datasheet", gpu["source"].lower())


if __name__ == "__main__":
    unittest.main()
