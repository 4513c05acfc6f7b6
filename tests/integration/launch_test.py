#!/usr/bin/env python3
"""tools/launch.py (tools/ember run RECIPE --nproc N): the ranks' own exit
status and message come out, without torchrun's traceback.

- a config typo is refused once, before any rank starts: exit 2, the
  recipe's message, "no rank was started", no run folder;
- trainer.cuda_graph=true with 2 processes: exit 2 before any rank starts;
- a run that diverges (a huge learning rate): every rank stops at the same
  step with the divergence diagnosis (exit 3 each), the launcher exits 3 and
  no rank reports a peer failure;
- a short run that works exits 0 and writes its summary.

Skipped (77) without Fashion-MNIST.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys


def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--launch", required=True)
    ap.add_argument("--data-root", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    if not (pathlib.Path(a.data_root) / "train-images-idx3-ubyte.gz").is_file():
        print(f"SKIP: no Fashion-MNIST at {a.data_root}")
        return 77
    work = pathlib.Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    common = [f"data.root={a.data_root}", "data.train_subset=1000", "data.val_size=200",
              "data.test_subset=200", "trainer.device=cpu", "trainer.threads=1", "trainer.progress=false"]
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def launch(name, *args):
        run_dir = work / name
        done = subprocess.run([sys.executable, a.launch, "--nproc", "2", a.binary, *common,
                               f"run.dir={run_dir}", *args], env=env, capture_output=True, text=True,
                              timeout=300)
        (work / f"{name}.stderr").write_text(done.stderr)
        return done, run_dir

    # A typo: refused once by --check, no rank started, nothing written.
    done, run_dir = launch("typo", "optim.lrr=0.1")
    check(done.returncode == 2, f"typo: exit {done.returncode}\n{done.stderr}")
    check("optim.lrr" in done.stderr and "optim.lr" in done.stderr, done.stderr)
    check(done.stderr.count("error:") == 1, f"one message, not one per rank:\n{done.stderr}")
    check("no rank was started" in done.stderr, done.stderr)
    check("Traceback" not in done.stderr, done.stderr)
    check(not run_dir.exists(), f"{run_dir} was created")

    # A rule that depends on the number of processes, checked before the ranks start.
    done, run_dir = launch("graph", "trainer.cuda_graph=true")
    check(done.returncode == 2, f"cuda_graph: exit {done.returncode}\n{done.stderr}")
    check("trainer.cuda_graph=true" in done.stderr and "no rank was started" in done.stderr, done.stderr)
    check(not run_dir.exists(), f"{run_dir} was created")

    # Divergence: both ranks stop at the same step with the same diagnosis.
    done, run_dir = launch("diverged", "optim.lr=1e12", "trainer.nonfinite_patience=2", "trainer.epochs=3")
    check(done.returncode == 3, f"divergence: exit {done.returncode}\n{done.stderr}")
    check("Traceback" not in done.stderr, done.stderr)
    diagnoses = [l for l in done.stderr.splitlines() if "training diverged" in l]
    check(len(diagnoses) == 2, f"a diagnosis from each rank:\n{done.stderr}")
    check(diagnoses[0] == diagnoses[1], f"the same diagnosis on both ranks:\n{done.stderr}")
    check("another rank" not in done.stderr and "peer" not in done.stderr.lower(),
          f"no rank stopped on a peer failure:\n{done.stderr}")
    check("failed first (exit status 3)" in done.stderr, done.stderr)

    # A run that works.
    done, run_dir = launch("ok", "trainer.epochs=1")
    check(done.returncode == 0, f"ok: exit {done.returncode}\n{done.stderr}")
    summary = json.loads((run_dir / "summary.json").read_text())
    check(summary["epochs"] == 1, summary)
    print("launch OK: typo 2, cuda_graph 2, divergence 3 on both ranks, a good run 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
