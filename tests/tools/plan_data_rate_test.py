#!/usr/bin/env python3
"""tools/plan/plan.py with MEASURE.json's data_rate (a recipe streaming data.shards): the CPU cores
each GPU needs to be kept fed, and tools/doctor.py reading them from the plan.

1. The formula: every row's, configuration row's and node count's cpu_cores_per_gpu is its own
   predicted samples/s per GPU over data_rate.images_per_core_second; feeding.fastest's is the
   largest; the top-level data_rate is MEASURE.json's.
2. The text: a cores/GPU column (rounded up) in the GPU, configuration and node tables, the CPU line
   of the feeding section, a reason of the recommendation.
3. Without data_rate nothing changes: the plan with it, its additions taken out, is the plan without.
4. A bad data_rate is bad input (exit 1, the key named).
5. The doctor's --plan reads the fastest GPU's need; none from a plan without data_rate.

    python3 tests/tools/plan_data_rate_test.py [-v]
"""
import copy
import importlib.util
import json
import math
import re
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "tools" / "plan_measure_example.json"

_spec = importlib.util.spec_from_file_location("plan", ROOT / "tools" / "plan" / "plan.py")
plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan)  # it put tools/ on sys.path: the planner's parts, below
from embertools.plan import arithmetic, formats  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_test import run_main  # noqa: E402 (the planner suite's helper, one copy)

_spec = importlib.util.spec_from_file_location("doctor", ROOT / "tools" / "doctor.py")
doctor = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doctor)

# What `RECIPE --measure` writes for streamed shards (lib/src/recipe/tools/measure.cpp).
RATE = {"images_per_core_second": 812.5, "samples": 2438, "seconds": 3.0006, "decode_threads": 1}


def image_model(data_rate=RATE):
    """The example measurement made compute-bound as an ImageNet classifier is (4.1 GMACs forward, 6x to
    train: every GPU and precision at its own speed, none at the step floor), on 1.28M training images,
    with `data_rate` (None: without it, as an in-memory dataset or an older file)."""
    m = json.loads(EXAMPLE.read_text())
    m.update(recipe="image_folder", forward_macs_per_sample=4.1e9, train_flops_per_sample=6 * 4.1e9)
    m["dataset"].update(train_samples=1_281_167, eval_samples=50_000)
    if data_rate is not None:
        m["data_rate"] = dict(data_rate)
    return m


def keys_named(obj, name):
    """Every value under key `name` anywhere in a JSON object, with its path."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == name:
                found.append(k)
            found.extend(f"{k}.{p}" for p in keys_named(v, name))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found.extend(f"[{i}].{p}" for p in keys_named(v, name))
    return found


class DataRate(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, m, name="m.json"):
        path = self.dir / name
        path.write_text(json.dumps(m))
        return path

    def plan(self, m, *extra, as_json=True):
        status, out, err = run_main([self.write(m), "--runs-dir", "", *(["--json"] if as_json else []), *extra])
        self.assertEqual(status, 0, err)
        if not as_json:
            return out

        def no_constants(name):
            raise AssertionError(f"--json printed {name}: not JSON")
        return json.loads(out, parse_constant=no_constants)

    def test_formula_by_hand(self):
        # 9,000 samples/s on a GPU, one core decoding 812.5: 9000 / 812.5 = 11.0769... cores, 12 to have.
        cores = arithmetic.cpu_cores_per_gpu(9000.0, 812.5)
        self.assertAlmostEqual(cores, 11.076923076923077, places=12)
        self.assertEqual(formats.fmt_cores(cores), "12")
        self.assertEqual(formats.fmt_cores(12.0), "12")  # whole: not one more
        self.assertEqual(formats.fmt_cores(0.2), "1")

    def test_each_row_is_its_speed_over_the_rate(self):
        result = self.plan(image_model())
        per_core = RATE["images_per_core_second"]
        self.assertEqual(result["data_rate"], RATE)
        speeds = {round(r["samples_per_second"]) for r in result["rows"]}
        self.assertGreater(len(speeds), 5, "compute-bound: the GPUs differ")
        for r in result["rows"]:
            self.assertAlmostEqual(r["cpu_cores_per_gpu"], r["samples_per_second"] / per_core, places=9, msg=r["gpu"])
        fastest = result["feeding"]["fastest"]
        self.assertAlmostEqual(fastest["cpu_cores_per_gpu"], fastest["samples_per_second"] / per_core, places=9)
        most = max(r["cpu_cores_per_gpu"] for r in result["rows"] if r["fits"])
        self.assertAlmostEqual(fastest["cpu_cores_per_gpu"], most, places=9)  # the doctor's figure: the largest

    def test_configurations_and_nodes(self):
        result = self.plan(image_model(), "--nodes", "2", "--gpus-per-node", "4", "--gpu", "H100-SXM", "--gpu", "L4")
        per_core = RATE["images_per_core_second"]
        train = result["measurement"]["train_samples"]
        rows = result["configurations"]["rows"]
        self.assertTrue(rows and all(r["world_size"] == 8 for r in rows))
        for r in rows:  # samples/s per GPU: the training set over the GPUs and the epoch
            self.assertAlmostEqual(r["cpu_cores_per_gpu"], train / (8 * r["epoch_seconds"]) / per_core, places=9)
        counts = result["nodes"]["counts"]
        self.assertEqual([c["gpus"] for c in counts], [4, 8])
        for c in counts:
            self.assertAlmostEqual(c["cpu_cores_per_gpu"], c["samples_per_second"] / c["gpus"] / per_core, places=9)
        # One GPU's configuration is its plain row: the same speed, the same cores.
        one = self.plan(image_model(), "--activation-checkpoint", "none", "--precision", "bf16-mixed")
        singles = {r["gpu"]: r for r in one["rows"]}
        for c in one["configurations"]["rows"]:
            self.assertAlmostEqual(c["cpu_cores_per_gpu"], singles[c["gpu"]]["cpu_cores_per_gpu"], places=6)

    def test_text(self):
        m = image_model()
        result = self.plan(m, "--gpu", "H100-SXM", "--precision", "bf16-mixed")
        row = result["rows"][0]
        text = self.plan(m, "--gpu", "H100-SXM", "--precision", "bf16-mixed", as_json=False)
        lines = text.splitlines()
        head = next(i for i, line in enumerate(lines) if line.startswith("GPU ") and "cores/GPU" in line)
        start = lines[head].index("cores/GPU")  # right-aligned under its heading, no wider than it
        cell = lines[head + 2][start:start + len("cores/GPU")].strip()
        self.assertEqual(cell, str(math.ceil(row["cpu_cores_per_gpu"])), lines[head:head + 3])
        feeding = text[text.index("\nFeeding"):text.index("\nData-parallel")]
        self.assertIn(f"one core decodes {RATE['images_per_core_second']:,.1f} samples/s (measured: "
                      f"{RATE['samples']:,} samples in 3.0 s, one decoder thread)", feeding)
        self.assertIn(f"H100-SXM bf16-mixed needs {math.ceil(row['cpu_cores_per_gpu'])} cores per GPU", feeding)
        self.assertIn(f"= {row['cpu_cores_per_gpu']:.1f}", feeding)
        rec = lines[-1]
        self.assertTrue(rec.startswith("Recommendation: H100-SXM"), rec)
        self.assertIn(f"feeding it takes {math.ceil(row['cpu_cores_per_gpu'])} CPU cores per GPU", rec)
        nodes = self.plan(m, "--gpu", "H100-SXM", "--nodes", "2", "--gpus-per-node", "8", as_json=False)
        for heading in (["nodes", "GPUs"], ["GPU", "GiB", "precision", "sharding"]):  # nodes, configurations
            header = next(line for line in nodes.splitlines() if line.split()[:len(heading)] == heading)
            self.assertIn("cores/GPU", header)

    def test_nothing_changes_without_it(self):
        for extra in ([], ["--nodes", "2", "--gpus-per-node", "4"], ["--world-size", "4", "--price", "H100=2.5"]):
            without = self.plan(image_model(data_rate=None), *extra)
            self.assertNotIn("data_rate", without)
            self.assertEqual(keys_named(without, "cpu_cores_per_gpu"), [], extra)
            text = self.plan(image_model(data_rate=None), *extra, as_json=False)
            self.assertNotIn("cores/GPU", text)
            self.assertNotIn("CPU cores", text)
            # With it, its additions taken out, the plan is the same.
            added = self.plan(image_model(), *extra)
            self.assertGreater(len(keys_named(added, "cpu_cores_per_gpu")), len(added["rows"]))
            stripped = copy.deepcopy(added)
            del stripped["data_rate"]
            strip(stripped)
            reasons = stripped["recommendation"]["reasons"]
            self.assertTrue(reasons[-1].startswith("feeding it takes "), reasons)
            reasons.pop()
            self.assertEqual(stripped, without, extra)

    def test_bad_data_rate(self):
        for rate, word in (([812.5], "data_rate: expected an object"),
                           ({"samples": 10}, "'images_per_core_second': expected a number"),
                           ({"images_per_core_second": "fast"}, "'images_per_core_second': expected a number"),
                           ({"images_per_core_second": 0}, "must be positive"),
                           ({"images_per_core_second": -3.0}, "-3.0 must be positive"),
                           ({"images_per_core_second": 10, "decode_threads": 0}, "'decode_threads': 0 is below 1")):
            m = image_model()
            m["data_rate"] = rate
            status, out, err = run_main([self.write(m), "--runs-dir", ""])
            self.assertEqual(status, 1, (rate, err))
            self.assertIn("data_rate", err, rate)
            self.assertIn(word, err, rate)
            self.assertEqual(out, "")

    def test_doctor_reads_the_fastest_need(self):
        result = self.plan(image_model())
        path = self.dir / "plan.json"
        path.write_text(json.dumps(result))
        ram, rate, note, cores = doctor.read_plan(path)
        fastest = result["feeding"]["fastest"]
        self.assertEqual(cores, fastest["cpu_cores_per_gpu"])
        self.assertIsNone(rate)  # the example's data fit in host RAM: nothing streams from storage
        self.assertRegex(note, rf"^plan plan\.json: {re.escape(fastest['gpu'])} {fastest['precision']} at "
                               rf"{fastest['samples_per_second']:.0f} samples/s$")
        path.write_text(json.dumps(self.plan(image_model(data_rate=None))))
        self.assertIsNone(doctor.read_plan(path)[3])
        self.assertEqual(doctor.read_plan(path)[2], "plan plan.json")


def strip(obj):
    """Remove every cpu_cores_per_gpu key, in place."""
    if isinstance(obj, dict):
        obj.pop("cpu_cores_per_gpu", None)
        for v in obj.values():
            strip(v)
    elif isinstance(obj, list):
        for v in obj:
            strip(v)


if __name__ == "__main__":
    unittest.main()
