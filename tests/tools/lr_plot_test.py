#!/usr/bin/env python3
"""tools/lr_plot.py: an 800 x 450 PNG of a curve with nulls and both points; errors on bad input.

    python3 tests/tools/lr_plot_test.py [-v]
"""
import contextlib
import importlib.util
import io
import json
import tempfile
import unittest
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lr_plot", ROOT / "tools" / "lr_plot.py")
lr_plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lr_plot)


def curve(n=40):
    lrs = [1e-4 * 10 ** (5 * i / (n - 1)) for i in range(n)]
    losses = [2.3 - 0.04 * i if i < 30 else 1.1 + 0.3 * (i - 30) for i in range(n)]
    losses[-1] = None  # a non-finite loss, written as null
    smoothed = [v if v is None else v + 0.05 for v in losses]
    return {"lrs": lrs, "losses": losses, "smoothed": smoothed,
            "suggestion": {"rule": "steepest", "lr": lrs[20], "index": 20},
            "valley": {"rule": "valley", "lr": lrs[25], "index": 25}, "stop_reason": "completed 40 steps"}


class LrPlot(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def run_main(self, data, name="lr.json"):
        path = self.dir / name
        path.write_text(json.dumps(data) if not isinstance(data, str) else data)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = lr_plot.main([str(path), "--out", str(self.dir / "lr.png")])
        return status, err.getvalue()

    def test_png(self):
        status, err = self.run_main(curve())
        self.assertEqual(status, 0, err)
        image = matplotlib.image.imread(self.dir / "lr.png")
        self.assertEqual(image.shape[:2], (450, 800))
        self.assertGreater(image[..., :3].std(), 0.05)  # not a blank canvas
        lrs, _, smoothed, points, _ = lr_plot.load_curve(self.dir / "lr.json")
        self.assertEqual([p[0] for p in points], [f"steepest: lr {lrs[20]:.3g}", f"valley: lr {lrs[25]:.3g}"])
        self.assertEqual(points[0][2], smoothed[20])  # marked on the smoothed curve
        data = curve()
        data["suggestion"] = data["valley"] = None  # too few points for a suggestion: still a plot
        self.assertEqual(self.run_main(data)[0], 0)

    def test_bad_input(self):
        data = curve()
        data["smoothed"] = data["smoothed"][:-1]
        status, err = self.run_main(data)
        self.assertEqual(status, 1)
        self.assertIn("'smoothed'", err)
        data = curve()
        data["suggestion"]["index"] = 99
        self.assertIn("'suggestion.index'", self.run_main(data)[1])
        self.assertIn("'lrs'", self.run_main(dict(curve(), lrs=[]))[1])
        self.assertIn("not readable as JSON", self.run_main("{", "broken.json")[1])
        # Overflowing, infinite and non-numeric values: a message with the key, never a traceback.
        text = json.dumps(curve()).replace(str(curve()["lrs"][3]), "1e400", 1)
        status, err = self.run_main(text, "inf.json")
        self.assertEqual((status, "'lrs'" in err), (1, True), err)
        for key, value in (("lr", "fast"), ("lr", -1.0), ("lr", True)):
            data = curve()
            data["suggestion"][key] = value
            status, err = self.run_main(data)
            self.assertEqual((status, "'suggestion.lr'" in err), (1, True), (value, err))
        status, err = self.run_main(json.dumps(curve()).replace('"lr": ' + str(curve()["lrs"][25]), '"lr": 1e999'))
        self.assertEqual((status, "'valley.lr'" in err), (1, True), err)


if __name__ == "__main__":
    unittest.main()
