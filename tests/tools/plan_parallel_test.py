#!/usr/bin/env python3
"""tools/plan/plan.py's layouts: pipeline P x tensor T x data D at --world-size GPUs, checked by hand.

1. The arithmetic: the bubble (P - 1)/(m + P - 1), 1F1B's min(P - s, m) and GPipe's m live microbatches,
   blocks per stage, the candidate layouts (T divides a node's GPUs and is at most the heads, P at most the
   pieces, P x T x D = world), the busiest tensor rank's share of a block, the tensor all-reduces of a stage.
2. GPT-2 124M (124,439,808 parameters, the head tied to the token embedding; 12 blocks of 12 x 768^2 +
   13 x 768, 12 heads): the busiest rank's memory at P = 2, T = 2 (D = 2) by hand, with and without ZeRO-1;
   its width estimated from a block's parameters is 768; P = T = 1 is section 4's configuration.
3. T never exceeds the GPUs of a node nor the heads, whatever the world size.
4. GPT-2 124M on one node of 8 H100s: plain data parallelism is recommended, and says why.
5. A 70B model (Llama 2 70B's shapes) on 4 nodes of 8 H100s: too big for ZeRO-3 data parallelism without
   checkpointing, and slower with it: a P x T layout is recommended.
6. The options: --pipeline/--tensor force a layout, --microbatches and --schedule change the memory and
   the bubble; impossible layouts are usage errors (exit 2); the text and the JSON.

    python3 tests/tools/plan_parallel_test.py [-v]
"""
import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_test import EXAMPLE, GIB, run_main, write_json  # noqa: E402 (the planner suite's helpers)
from embertools.plan import arithmetic, layouts  # noqa: E402 (plan_test put tools/ on sys.path)
from embertools.plan.constants import NCCL_BASE_US, NVLINK_HOP_US  # noqa: E402

GPT2_PARAMETERS = 124_439_808
GPT2_BLOCK = 12 * 768 * 768 + 13 * 768  # 7,087,872: q, k, v, projection, the 4C MLP, biases, two norms
GPT2_OUTSIDE = GPT2_PARAMETERS - 12 * GPT2_BLOCK  # 39,385,344: wte 50257 x 768, wpe 1024 x 768, ln_f


def gpt2_124m(batch=64, accumulate=8):
    """A hand-written measurement of GPT-2 124M as recipes/gpt2/gpu.toml trains it (micro-batch 64 x 1024
    tokens, 8 accumulated, AdamW, bf16-mixed with fp32 parameters): 4 bytes a parameter and a gradient, 8 of
    Adam's moments; training FLOPs as models::Gpt2 counts them (3 x (2 x Linear weights + 2 x 768 x 50257 for
    the tied head + 4 x 1024 x 768 a block for attention) a token); activations a sample: 12 blocks x 34 x
    1024 x 768 bytes (Korthikanti et al., attention without the 1024^2 scores) + the logits, bf16 and their
    fp32 copy (1024 x 50257 x 6 bytes); F: the gradients, the moments and 0.3 GB of workspaces."""
    m = json.loads(EXAMPLE.read_text())
    params, p_bytes = GPT2_PARAMETERS, 4 * GPT2_PARAMETERS
    forward = 2 * 12 * (768 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768) + 2 * 768 * 50257 + 12 * 4 * 1024 * 768
    blocks_saved = 12 * 34 * 1024 * 768
    m.update(recipe="gpt2", batch_size=batch, config_batch_size=batch, epochs=1, accumulate_grad_batches=accumulate,
             optimizer="adamw", precision="bf16-mixed", parameters=params, trainable_parameters=params,
             parameter_bytes=p_bytes, buffer_bytes=0, gradient_bytes=p_bytes, optimizer_state_bytes=2 * p_bytes,
             forward_macs_per_sample=forward * 1024 // 2, train_flops_per_sample=3 * forward * 1024,
             blocks={"count": 12, "parameter_bytes": 4 * 12 * GPT2_BLOCK, "largest_parameter_bytes": 4 * GPT2_BLOCK})
    m["memory"] = {"bf16-mixed": {"probes": [], "fixed_bytes": 3 * p_bytes + 3e8,
                                  "per_sample_bytes": blocks_saved + 1024 * 50257 * 6,
                                  "block_activation_bytes_per_sample": blocks_saved,
                                  "block_input_bytes_per_sample": 12 * 1024 * 768 * 4}}
    m["dataset"] = {"train_samples": 9_765_625, "eval_samples": 97_656, "sample_bytes": 16384.0,
                    "disk_bytes": 2e10, "disk_path": "fineweb10B", "resident_bytes": 0}
    del m["measured"]
    m.update(device_name="hand-written", memory_method="hand-written: tests/tools/plan_parallel_test.py")
    return m


LLAMA_BLOCK = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192  # 855,654,400
LLAMA_OUTSIDE = 2 * 32000 * 8192 + 8192  # untied embedding and head, the final norm
LLAMA_PARAMETERS = 80 * LLAMA_BLOCK + LLAMA_OUTSIDE  # 68,976,648,192


def llama_70b(batch=1, accumulate=32, checkpointing=True):
    """A hand-written measurement of Llama 2 70B's shapes (80 blocks of width 8192, 64 heads, 8 key-value
    heads, SwiGLU 28672; untied 32000-token embedding and head) at 4096 tokens a sample, AdamW, bf16-mixed
    with fp32 parameters: 16 bytes a parameter of state; FLOPs 6 N S + 12 L C S^2 a sample; activations a
    sample 34 S C bytes a block + the logits (S x 32000 x 6 bytes); `checkpointing`: with the blocks' inputs
    (fp32), so that full checkpointing can be estimated."""
    m = json.loads(EXAMPLE.read_text())
    params, p_bytes = LLAMA_PARAMETERS, 4 * LLAMA_PARAMETERS
    s, c = 4096, 8192
    flops = 6 * params * s + 12 * 80 * c * s * s
    blocks_saved = 80 * 34 * s * c
    m.update(recipe="llama70b", batch_size=batch, config_batch_size=batch, epochs=1, accumulate_grad_batches=accumulate,
             optimizer="adamw", precision="bf16-mixed", parameters=params, trainable_parameters=params,
             parameter_bytes=p_bytes, buffer_bytes=0, gradient_bytes=p_bytes, optimizer_state_bytes=2 * p_bytes,
             forward_macs_per_sample=flops // 6, train_flops_per_sample=flops,
             blocks={"count": 80, "parameter_bytes": 4 * 80 * LLAMA_BLOCK, "largest_parameter_bytes": 4 * LLAMA_BLOCK})
    entry = {"probes": [], "fixed_bytes": 3 * p_bytes + 2e9, "per_sample_bytes": blocks_saved + s * 32000 * 6,
             "block_activation_bytes_per_sample": blocks_saved}
    if checkpointing:
        entry["block_input_bytes_per_sample"] = 80 * s * c * 4
    m["memory"] = {"bf16-mixed": entry}
    m["dataset"] = {"train_samples": 4_882_812, "eval_samples": 10_000, "sample_bytes": 65536.0,
                    "disk_bytes": 4e10, "disk_path": "tokens", "resident_bytes": 0}
    del m["measured"]
    m.update(device_name="hand-written", memory_method="hand-written: tests/tools/plan_parallel_test.py")
    return m


class Arithmetic(unittest.TestCase):
    def test_bubble(self):
        self.assertEqual(arithmetic.pipeline_bubble(1, 8), 0.0)
        self.assertEqual(arithmetic.pipeline_bubble(4, 4), 3 / 7)  # m = P: three of seven slots idle
        self.assertEqual(arithmetic.pipeline_bubble(4, 1021), 3 / 1024)
        self.assertEqual(arithmetic.pipeline_bubble(8, 32), 7 / 39)

    def test_live_microbatches_and_stage_blocks(self):
        # 1F1B: stage s runs P - s forwards before its first backward; GPipe holds all m.
        self.assertEqual([arithmetic.live_microbatches(4, 8, s, "1f1b") for s in range(4)], [4, 3, 2, 1])
        self.assertEqual([arithmetic.live_microbatches(4, 2, s, "1f1b") for s in range(4)], [2, 2, 2, 1])
        self.assertEqual([arithmetic.live_microbatches(4, 8, s, "gpipe") for s in range(4)], [8, 8, 8, 8])
        self.assertEqual([arithmetic.stage_blocks(12, 5, s) for s in range(5)], [3, 3, 2, 2, 2])
        self.assertEqual(sum(arithmetic.stage_blocks(80, 7, s) for s in range(7)), 80)
        self.assertEqual([arithmetic.stage_blocks(2, 4, s) for s in range(4)], [1, 1, 0, 0])  # P > blocks

    def test_candidate_layouts(self):
        got = arithmetic.parallel_layouts(8, 8, heads=12, pieces=14)
        self.assertEqual(got, [(1, 1, 8), (2, 1, 4), (1, 2, 4), (4, 1, 2), (2, 2, 2), (1, 4, 2), (8, 1, 1),
                               (4, 2, 1), (2, 4, 1), (1, 8, 1)])  # T = 8 cuts 12 heads 2, 2, 2, 2, 1, 1, 1, 1
        self.assertEqual(arithmetic.parallel_layouts(8, 8, heads=3, pieces=14),
                         [(1, 1, 8), (2, 1, 4), (1, 2, 4), (4, 1, 2), (2, 2, 2), (8, 1, 1), (4, 2, 1)])  # T <= 3
        self.assertEqual(arithmetic.parallel_layouts(8, 8, heads=None, pieces=14),
                         [(1, 1, 8), (2, 1, 4), (4, 1, 2), (8, 1, 1)])  # no heads: no tensor parallelism
        self.assertEqual(arithmetic.parallel_layouts(16, 8, heads=16, pieces=3), [
            (1, 1, 16), (2, 1, 8), (1, 2, 8), (2, 2, 4), (1, 4, 4), (2, 4, 2), (1, 8, 2), (2, 8, 1)])  # P <= 3
        # Forced: only that P (and T), beside plain data parallelism.
        self.assertEqual(arithmetic.parallel_layouts(32, 8, 64, 82, pipeline=4, tensor=8), [(1, 1, 32), (4, 8, 1)])
        self.assertEqual(arithmetic.parallel_layouts(32, 8, 64, 82, tensor=8), [(1, 1, 32), (1, 8, 4), (2, 8, 2),
                                                                                 (4, 8, 1)])

    def test_tensor_never_exceeds_a_node(self):
        for world in (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 1024):
            for per_node in (1, 2, 4, 8, 16):
                if world % per_node and world > per_node:
                    continue
                for heads in (None, 1, 12, 16, 25, 64, 96):
                    for p, t, d in arithmetic.parallel_layouts(world, min(per_node, world), heads, 100):
                        self.assertLessEqual(t, per_node)
                        self.assertEqual(per_node % t, 0)
                        self.assertEqual(p * t * d, world)
                        self.assertTrue(t == 1 or t <= heads)
                        self.assertLessEqual(p, 100)

    def test_tensor_share(self):
        self.assertEqual(arithmetic.tensor_share(12, 1), 1.0)
        self.assertEqual(arithmetic.tensor_share(12, 4), 1 / 4)
        self.assertEqual(arithmetic.tensor_share(12, 8), 2 / 12)  # the busiest rank: 2 of 12 heads
        self.assertEqual(arithmetic.tensor_share(None, 8), 1 / 8)

    def test_tensor_all_reduces_by_hand(self):
        # 4 all-reduces a block of a 64-sample microbatch's 1024 x 768 bf16 output (100,663,296 bytes) over 2
        # ranks on NVLink (450 GB/s): 2 x 1/2 x bytes / 450e9 + 8.4 us + 2 steps x 3.4 us each; 6 blocks.
        nbytes = 64 * 1024 * 768 * 2
        one = nbytes / 450e9 + (NCCL_BASE_US + 2 * NVLINK_HOP_US) * 1e-6
        got = arithmetic.tensor_parallel_seconds(6, 64, 1024 * 768 * 2, 2, 450e9, NVLINK_HOP_US * 1e-6)
        self.assertAlmostEqual(got, 4 * 6 * one, places=12)
        self.assertEqual(arithmetic.tensor_parallel_seconds(6, 64, 1024 * 768 * 2, 1, 450e9, 1e-6), 0.0)


class Plans(unittest.TestCase):
    H100 = ["--gpu", "H100-SXM", "--runs-dir", ""]

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def plan(self, m, *extra):
        """(JSON plan, text plan) of measurement m on H100s."""
        path = write_json(self.dir, "m.json", m)
        status, out, err = run_main([path, "--json", *self.H100, *extra])
        self.assertEqual(status, 0, err)
        status, text, err = run_main([path, *self.H100, *extra])
        self.assertEqual(status, 0, err)
        return json.loads(out), text

    @staticmethod
    def row(result, p, t):
        return next(r for r in result["layouts"]["rows"] if (r["pipeline"], r["tensor"]) == (p, t))

    def test_gpt2_memory_at_p2_t2_by_hand(self):
        """GPT-2 124M on 8 GPUs at P = 2, T = 2, D = 2, 32 microbatches of 64 (the config's 64 x 8 a GPU on
        each of its P x T = 4 GPUs: 2,048 samples a pipeline). Each stage holds 6 blocks and the tied token
        embedding (everything outside the blocks: the embedding on stage 0, the head on stage 1), split 2 ways:
        (6 x 7,087,872 + 39,385,344) / 2 = 40,956,288 parameters, 4 bytes each for the parameters and the
        gradients, 8 for Adam; F's 0.3 GB of workspaces scaled by the same share; DDP's bucket copy of the
        gradients; the CUDA context. 1F1B keeps min(2 - 0, 32) = 2 microbatches of stage 0's blocks'
        activations (/ 2), and 1 of stage 1's with the logits (1024 x 50257 x 6 bytes a sample, / 2): GPT-2's
        large vocabulary makes the last stage the busiest."""
        m = gpt2_124m()
        result, _ = self.plan(m, "--world-size", "8", "--heads", "12", "--pipeline", "2", "--tensor", "2",
                              "--microbatches", "32", "--sharding", "none")
        r = self.row(result, 2, 2)
        self.assertEqual((r["data"], r["microbatches"], r["micro_batch"], r["sharding"]), (2, 32, 64, "none"))
        held = (6 * GPT2_BLOCK + GPT2_OUTSIDE) / 2
        self.assertEqual(held, 40_956_288)
        share = held / GPT2_PARAMETERS
        saved = 34 * 1024 * 768
        parts = r["memory_parts"]
        self.assertEqual(r["busiest_stage"], 1)
        self.assertAlmostEqual(parts["parameters"], 4 * held)
        self.assertAlmostEqual(parts["gradients"], 4 * held)
        self.assertAlmostEqual(parts["optimizer_state"], 8 * held)
        self.assertAlmostEqual(parts["communication_buffers"], 4 * held)  # DDP's buckets at D = 2
        self.assertAlmostEqual(parts["other_fixed"], 3e8 * share)
        last = 1 * 64 * (6 * saved + 1024 * 50257 * 6) / 2
        first = 2 * 64 * 6 * saved / 2
        self.assertLess(first, last)
        self.assertAlmostEqual(parts["activations"], last, delta=1)
        self.assertAlmostEqual(parts["context"], 0.5 * GIB)
        expected = 0.5 * GIB + 20 * held + 3e8 * share + last
        self.assertAlmostEqual(r["memory_needed_bytes"], expected, delta=1)
        self.assertAlmostEqual(expected / GIB, 15.34, places=2)  # 0.5 + 0.76 + 0.09 + 13.98 GiB
        self.assertAlmostEqual(r["bubble"], 1 / 33)
        # ZeRO-1 over D = 2: Adam's moments halved, + the kept half of the reduced gradient, one bucket in flight.
        result, _ = self.plan(m, "--world-size", "8", "--heads", "12", "--pipeline", "2", "--tensor", "2",
                              "--microbatches", "32", "--sharding", "optimizer")
        z = self.row(result, 2, 2)["memory_parts"]
        self.assertAlmostEqual(z["optimizer_state"], 4 * held)
        self.assertAlmostEqual(z["gradients"], 4 * held + 2 * held)
        self.assertAlmostEqual(z["communication_buffers"], 25 * 2**20)

    def test_uneven_heads_by_hand(self):
        """T = 8 over GPT-2's 12 heads: Ember cuts them 2, 2, 2, 2, 1, 1, 1, 1; the busiest rank holds 2/12 of
        each block (parameters, activations, math) and 1/8 of the vocabulary: 12 x 7,087,872 x 2/12 + 39,385,344
        / 8 = 19,098,912 parameters; one microbatch of 64 (P = 1): its blocks' activations x 2/12, the logits / 8."""
        result, _ = self.plan(gpt2_124m(), "--world-size", "8", "--heads", "12", "--pipeline", "1", "--tensor", "8",
                              "--microbatches", "8")
        r = self.row(result, 1, 8)
        self.assertEqual((r["data"], r["microbatches"], r["micro_batch"]), (1, 8, 512))
        held = 12 * GPT2_BLOCK * 2 / 12 + GPT2_OUTSIDE / 8
        self.assertEqual(held, 19_098_912)
        self.assertAlmostEqual(r["memory_parts"]["parameters"], 4 * held)
        self.assertAlmostEqual(r["memory_parts"]["optimizer_state"], 8 * held)
        saved = 12 * 34 * 1024 * 768
        self.assertAlmostEqual(r["memory_parts"]["activations"], 512 * (saved * 2 / 12 + 1024 * 50257 * 6 / 8),
                               delta=1)

    def test_width_from_the_blocks_and_pieces(self):
        shape = layouts.model_shape(gpt2_124m(), "bf16-mixed", 12, None, 1024)
        self.assertEqual(shape["width"], 768)  # 12 C^2 + 13 C = 7,087,872
        self.assertEqual((shape["blocks"], shape["pieces"]), (12, 14))
        self.assertEqual(shape["boundary_bytes_per_sample"], 1024 * 768 * 2)
        self.assertAlmostEqual(shape["outside_bytes"], 4 * GPT2_OUTSIDE)
        llama = layouts.model_shape(llama_70b(), "bf16-mixed", 64, 8192, 4096)
        self.assertEqual(llama["boundary_bytes_per_sample"], 4096 * 8192 * 2)

    def test_plain_data_parallel_is_section_4s_row(self):
        """P = T = 1 is the recommended configuration of section 4, timed as the nodes section times it."""
        m = gpt2_124m()
        result, _ = self.plan(m, "--nodes", "2", "--heads", "12", "--seq-len", "1024")
        dp = self.row(result, 1, 1)
        rec = result["recommendation"]
        config = next(r for r in result["configurations"]["rows"]
                      if (r["sharding"], r["activation_checkpoint"]) == (rec["sharding"], rec["activation_checkpoint"]))
        self.assertEqual((dp["sharding"], dp["activation_checkpoint"]), (config["sharding"],
                                                                         config["activation_checkpoint"]))
        self.assertAlmostEqual(dp["memory_needed_bytes"], config["memory_needed_bytes"])
        last = result["nodes"]["counts"][-1]
        self.assertAlmostEqual(dp["step_seconds"], last["step_seconds"])
        self.assertAlmostEqual(dp["exposed_seconds"], last["exposed_seconds"])

    def test_small_model_on_one_node_is_plain_data_parallel(self):
        result, text = self.plan(gpt2_124m(), "--world-size", "8", "--heads", "12", "--seq-len", "1024")
        ly = result["layouts"]
        self.assertTrue(ly["shown"])
        self.assertTrue(ly["verdict"]["plain_data_parallel"])
        self.assertEqual(self.row(result, 1, 1), ly["rows"][ly["verdict"]["recommended"]])
        rec = result["recommendation"]
        self.assertIsNone(rec["layout"])
        self.assertEqual((rec["world_size"], rec["gpu"]), (8, "H100-SXM"))
        said = " ".join(rec["reasons"])
        self.assertRegex(said, r"plain data parallelism with dist\.sharding=\w+ \(\S+\) is (better|as good) here")
        self.assertIn("because the model's state and batch fit each GPU", said)
        self.assertIn(f"dist.sharding={rec['sharding']}", said)
        # The layouts that split it: tensor ranks in the node, stages, all slower.
        tensor = [r for r in ly["rows"] if r["tensor"] > 1]
        self.assertTrue(tensor)
        self.assertEqual({r["tensor"] for r in ly["rows"]}, {1, 2, 4, 8})
        self.assertIn("Layouts: pipeline P x tensor T x data D = 8 GPUs", text)
        self.assertIn("<- recommended", text.split("Layouts:")[1])
        self.assertTrue(text.strip().splitlines()[-1].startswith("Recommendation: H100-SXM, bf16-mixed, 8 GPUs"))

    def test_70b_on_four_nodes_is_pipeline_by_tensor(self):
        args = ("--nodes", "4", "--heads", "64", "--width", "8192", "--seq-len", "4096")
        # Without checkpointing no data-parallel stage holds one sample (92 GB of activations).
        result, text = self.plan(llama_70b(checkpointing=False), *args)
        ly = result["layouts"]
        self.assertFalse(ly["verdict"]["plain_data_parallel"])
        dp = self.row(result, 1, 1)
        self.assertFalse(dp["fits"])
        rec = result["recommendation"]
        layout = rec["layout"]
        self.assertIsNotNone(layout)
        self.assertGreater(layout["pipeline"] * layout["tensor"], 1)
        self.assertLessEqual(layout["tensor"], 8)
        self.assertEqual(layout["pipeline"] * layout["tensor"] * layout["data"], 32)
        self.assertGreaterEqual(layout["microbatches"], layout["pipeline"])
        self.assertIn("plain data parallelism does not fit", " ".join(rec["reasons"]))
        self.assertIn("not measurements", " ".join(rec["reasons"]))
        self.assertIn("not yet a recipe's keys", " ".join(rec["reasons"]))
        self.assertIn(f"32 GPUs as pipeline {layout['pipeline']} x tensor {layout['tensor']} x data "
                      f"{layout['data']}", rec["text"])
        self.assertIn("Recommendation: H100-SXM, bf16-mixed, 32 GPUs as pipeline", text)
        picked = ly["rows"][ly["verdict"]["recommended"]]
        self.assertTrue(picked["fits"])
        self.assertEqual(picked["step_seconds"], min(r["step_seconds"] for r in ly["rows"] if r["fits"]))
        # With full checkpointing ZeRO-3 holds a sample, but gathers 274 GB of fp32 blocks twice a micro-batch
        # over one 400G NIC a node: the layout is far faster.
        result, _ = self.plan(llama_70b(), *args)
        dp = self.row(result, 1, 1)
        self.assertTrue(dp["fits"])
        self.assertEqual((dp["sharding"], dp["activation_checkpoint"]), ("parameters", "full"))
        self.assertFalse(result["layouts"]["verdict"]["plain_data_parallel"])
        best = result["layouts"]["rows"][result["layouts"]["verdict"]["recommended"]]
        self.assertLess(2 * best["step_seconds"], dp["step_seconds"])
        self.assertIsNotNone(result["recommendation"]["layout"])
        self.assertIn("with data parallelism alone (what Ember runs today), the plan was: H100-SXM",
                      " ".join(result["recommendation"]["reasons"]))

    def test_70b_stage_memory_by_hand(self):
        """P = 4, T = 8, D = 1: stage 0 holds 20 blocks and the embedding, stage 3 20 blocks and the head (both
        counted as everything outside the blocks), 16 bytes a parameter / 8; 1F1B keeps 4 microbatches of 1
        sample on stage 0: 4 x 20 blocks x 34 x 4096 x 8192 bytes / 8."""
        result, _ = self.plan(llama_70b(checkpointing=False), "--nodes", "4", "--heads", "64", "--width", "8192",
                              "--seq-len", "4096", "--pipeline", "4", "--tensor", "8", "--microbatches", "1024")
        r = self.row(result, 4, 8)
        held = (20 * LLAMA_BLOCK + LLAMA_OUTSIDE) / 8
        self.assertEqual((r["busiest_stage"], r["micro_batch"], r["data"]), (0, 1, 1))
        self.assertAlmostEqual(r["memory_parts"]["parameters"] + r["memory_parts"]["gradients"]
                               + r["memory_parts"]["optimizer_state"], 16 * held, delta=16)
        self.assertAlmostEqual(r["memory_parts"]["activations"], 4 * 20 * 34 * 4096 * 8192 / 8)
        self.assertEqual(r["memory_parts"]["communication_buffers"], 0.0)  # D = 1: no data-parallel buckets
        self.assertAlmostEqual(r["bubble"], 3 / 1027)
        # Under GPipe all 1024 microbatches are live on every stage, the last (its blocks and the logits) the
        # busiest: far past 80 GB.
        result, _ = self.plan(llama_70b(checkpointing=False), "--nodes", "4", "--heads", "64", "--width", "8192",
                              "--seq-len", "4096", "--pipeline", "4", "--tensor", "8", "--microbatches", "1024",
                              "--schedule", "gpipe")
        g = self.row(result, 4, 8)
        self.assertEqual(g["busiest_stage"], 3)
        self.assertAlmostEqual(g["memory_parts"]["activations"], 1024 * (20 * 34 * 4096 * 8192 + 4096 * 32000 * 6) / 8,
                               delta=1)
        self.assertFalse(g["fits"])

    def test_tensor_stays_in_a_node_of_the_plan(self):
        """Nodes of 4 GPUs (and of 2, on PCIe): no planned layout has T above a node's GPUs, though 64 heads
        would split 8 or 16 ways; the tensor all-reduces run on the node's link."""
        for args in (("--nodes", "8", "--gpus-per-node", "4"),
                     ("--nodes", "16", "--gpus-per-node", "2", "--intra-link", "pcie")):
            result, _ = self.plan(llama_70b(checkpointing=False), *args, "--heads", "64", "--width", "8192",
                                  "--seq-len", "4096")
            per_node = int(args[3])
            rows = result["layouts"]["rows"]
            self.assertEqual({r["tensor"] for r in rows}, {t for t in (1, 2, 4) if t <= per_node})
            for r in rows:
                self.assertEqual(r["pipeline"] * r["tensor"] * r["data"], 32)
                if r["tensor"] > 1:
                    self.assertEqual(r["tensor_link"], "NVLink" if per_node == 4 else "PCIe Gen5")
            layout = result["recommendation"]["layout"]
            if per_node == 4:  # P 8 x T 4: 55.6 GiB
                self.assertLessEqual(layout["tensor"], per_node)
            else:  # T <= 2 leaves at least 78.8 GiB (P 16 x T 2) a GPU: nothing fits, and the plan says so
                self.assertIsNone(layout)
                self.assertIn("no layout fits at 32 GPUs", result["layouts"]["verdict"]["text"])
                self.assertIn("no layout fits at 32 GPUs", " ".join(result["recommendation"]["reasons"]))

    def test_options(self):
        m = write_json(self.dir, "m.json", gpt2_124m())
        bad = [(["--world-size", "8", "--tensor", "16", "--heads", "16"], "must divide its 8 GPUs"),
               (["--world-size", "8", "--tensor", "8", "--heads", "4"], "at most the 4 attention heads"),
               (["--world-size", "8", "--tensor", "2"], "give --heads H"),
               (["--world-size", "8", "--pipeline", "3"], "does not divide the 8 GPUs"),
               (["--world-size", "8", "--pipeline", "4", "--microbatches", "2"], "1F1B needs at least one"),
               (["--pipeline", "2"], "give --world-size N"), (["--tensor", "0"], "--tensor"),
               (["--schedule", "zb"], "--schedule"), (["--heads", "-1"], "--heads"), (["--seq-len", "x"], "--seq-len"),
               (["--width", "1e9"], "--width"), (["--microbatches", "0"], "--microbatches")]
        for args, named in bad:
            for first in ([m], ["--check"]):
                status, out, err = run_main(first + args)
                self.assertEqual(status, 2, (args, err))
                self.assertIn(named, err, args)
                self.assertEqual(out, "")
        status, _, err = run_main(["--check", "--nodes", "4", "--pipeline", "4", "--tensor", "8", "--heads", "64",
                                   "--microbatches", "64", "--schedule", "gpipe", "--width", "8192",
                                   "--seq-len", "4096"])
        self.assertEqual(status, 0, err)
        # More stages than pieces is bad input for this model (exit 1): 12 blocks + embedding + head = 14.
        status, _, err = run_main([m, "--world-size", "16", "--pipeline", "16", "--runs-dir", ""])
        self.assertEqual(status, 1, err)
        self.assertIn("14 pieces", err)
        # A model without blocks has no layouts; forcing one is bad input.
        status, out, err = run_main([EXAMPLE, "--world-size", "8", "--json", "--runs-dir", ""])
        self.assertEqual(status, 0, err)
        self.assertFalse(json.loads(out)["layouts"]["shown"])
        status, _, err = run_main([EXAMPLE, "--world-size", "8", "--pipeline", "2", "--runs-dir", ""])
        self.assertEqual(status, 1)
        self.assertIn("names no blocks", err)

    def test_forced_layout_and_microbatches(self):
        result, text = self.plan(gpt2_124m(), "--world-size", "8", "--heads", "12", "--pipeline", "4",
                                 "--tensor", "2", "--microbatches", "16")
        rows = result["layouts"]["rows"]
        self.assertEqual([(r["pipeline"], r["tensor"], r["data"]) for r in rows], [(1, 1, 8), (4, 2, 1)])
        forced = rows[1]
        self.assertEqual((forced["microbatches"], forced["micro_batch"]), (16, 4096 // 16))
        self.assertAlmostEqual(forced["bubble"], 3 / 19)
        # More microbatches: a smaller bubble and fewer live activations (1F1B keeps P of them).
        more, _ = self.plan(gpt2_124m(), "--world-size", "8", "--heads", "12", "--pipeline", "4", "--tensor", "2",
                            "--microbatches", "256")
        r = more["layouts"]["rows"][1]
        self.assertAlmostEqual(r["bubble"], 3 / 259)
        self.assertLess(r["memory_parts"]["activations"], forced["memory_parts"]["activations"])
        self.assertAlmostEqual(r["memory_parts"]["activations"] * 16, forced["memory_parts"]["activations"])
        self.assertRegex(text, r"\n\s+4\s+2\s+1\s+none\s+16 x 256\s")

    def test_sharding_of_the_layouts(self):
        """P x T > 1 layouts use DDP or ZeRO-1 over their data group, never ZeRO-2/3; D = 1 none."""
        result, _ = self.plan(llama_70b(checkpointing=False), "--nodes", "4", "--heads", "64", "--width", "8192",
                              "--seq-len", "4096")
        for r in result["layouts"]["rows"]:
            if (r["pipeline"], r["tensor"]) != (1, 1):
                self.assertIn(r["sharding"], ("none", "optimizer"))
                self.assertEqual(r["activation_checkpoint"], "none")
                if r["data"] == 1:
                    self.assertEqual(r["sharding"], "none")
                self.assertEqual(r["pipeline"] * r["tensor"] * r["data"], 32)
        json.dumps(result, allow_nan=False)  # strict JSON


if __name__ == "__main__":
    unittest.main()
