#!/usr/bin/env bash
# The gpt2 recipe with tensor parallelism (dist.tensor) and pipeline stages
# (dist.pipeline) under torchrun, Gloo ranks on the CPU, a 2-layer GPT-2 whose
# vocabulary (257) the degree does not divide, with accumulation and clipping:
#   - 2 ranks at dist.tensor=2, 4 ranks at tensor 2 x data 2 with sequence
#     parallelism, 2 ranks at dist.pipeline=2 (1F1B, 4 microbatches) and 4
#     ranks at pipeline 2 x data 2 (GPipe) end within a float32 bound of one
#     process on the same samples per step (their exports, which
#     from_pretrained loads);
#   - stopped at trainer.max_steps, a tensor-parallel checkpoint (whole
#     tensors) resumes in ONE process, and a pipeline one at dist.tensor=2,
#     and end within the same bound of one process;
#   - with dropout on, a tensor-parallel run and a pipeline run, each
#     SIGKILLed after its first checkpoint, resume and end bit-identical to
#     the same run straight through;
#   - degrees that do not divide the ranks, both at once, sharding, or a
#     recipe that does not cut its model are refused before any work.
set -euo pipefail
bin="$1"; py="$2"; out="$3"; shards="$4"; char_gpt="$5"
torchrun="$(dirname "$py")/torchrun"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"

"$py" - "$out/text.txt" <<'PY'
import random
import sys
rng = random.Random(0)
subjects, verbs, objects = ["the cat", "a dog", "my friend", "the old man"], ["sees", "likes", "finds"], \
    ["the ball.", "a red hat.", "the small house.", "some bread."]
open(sys.argv[1], "w").write(" ".join(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}"
                                      for _ in range(500)))
PY
"$shards" write "$out/text.txt" "$out" --from text --tokenizer bytes --tokens-per-shard 1000000 \
  --val-fraction 0.1 >"$out/shards.out" 2>"$out/shards.err" || { cat "$out/shards.err"; fail "ember_shards failed"; }

common=(model.preset= model.n_layer=2 model.n_head=4 model.n_embd=64 model.n_positions=64 data.block_size=32
        data.vocab_size=257 data.eval_batch_size=8 trainer.threads=1 trainer.progress=false
        trainer.accumulate_grad_batches=2 trainer.clip_grad_norm=1 optim.lr=3e-3 sched.name=constant
        sched.warmup_epochs=0 data.tokens="$out/train-000000.bin" data.val_tokens="$out/val-000000.bin")
run_tp() {  # run_tp NPROC NAME ARGS...: the recipe under torchrun, its output in $out/NAME.{out,err}
  local n="$1" name="$2"; shift 2
  "$torchrun" --standalone --nproc-per-node "$n" --no-python "$bin" "${common[@]}" "$@" run.dir="$out/$name" \
    >"$out/$name.out" 2>"$out/$name.err" || { cat "$out/$name.out" "$out/$name.err"; fail "$name failed"; }
}

# Refusals, before any work (exit 2, nothing trained).
set +e
ranks() {  # ranks N COMMAND...: COMMAND as rank 0 of N (--check starts no process group)
  local n="$1"; shift
  WORLD_SIZE="$n" RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29999 "$@"
}
ranks 3 "$bin" "${common[@]}" dist.tensor=2 --check >"$out/r1.out" 2>"$out/r1.err"; rc1=$?
ranks 2 "$bin" "${common[@]}" dist.tensor=2 dist.sharding=optimizer --check >"$out/r2.out" 2>"$out/r2.err"; rc2=$?
ranks 2 "$char_gpt" data.path="$out/text.txt" dist.tensor=2 --check >"$out/r3.out" 2>"$out/r3.err"; rc3=$?
ranks 4 "$bin" "${common[@]}" dist.tensor=2 dist.pipeline=2 --check >"$out/r4.out" 2>"$out/r4.err"; rc4=$?
ranks 2 "$bin" "${common[@]}" dist.pipeline=2 data.batch_size=3 --check >"$out/r5.out" 2>"$out/r5.err"; rc5=$?
set -e
expect_rc 2 "$rc1" "dist.tensor=2 on 3 ranks"
expect_in "$out/r1.err" "dist.tensor=2 must divide the 3 rank(s)"
expect_rc 2 "$rc2" "dist.tensor=2 with dist.sharding=optimizer"
expect_in "$out/r2.err" "dist.tensor=2 with dist.sharding=optimizer"
expect_rc 2 "$rc3" "char_gpt with dist.tensor=2"
expect_in "$out/r3.err" "does not cut its model for tensor parallelism"
expect_rc 2 "$rc4" "dist.tensor=2 with dist.pipeline=2"
expect_in "$out/r4.err" "3D layouts) are not supported yet"
expect_rc 2 "$rc5" "data.batch_size=3 at 4 microbatches"
expect_in "$out/r5.err" "data.batch_size=3 leaves some empty"

# One process, 16 sequences a batch, 2 epochs.
"$bin" "${common[@]}" data.batch_size=16 trainer.epochs=2 run.dir="$out/one" >"$out/one.out" 2>"$out/one.err" ||
  { cat "$out/one.err"; fail "the one-process run failed"; }
run_tp 2 tensor data.batch_size=16 trainer.epochs=2 dist.tensor=2
expect_in "$out/tensor.err" "x 2 ranks (gloo, pipeline 1 x data 1 x tensor 2"
run_tp 4 tensor_data data.batch_size=8 trainer.epochs=2 dist.tensor=2 dist.sequence_parallel=true
expect_in "$out/tensor_data.err" "x 4 ranks (gloo, pipeline 1 x data 2 x tensor 2"
run_tp 2 pipeline data.batch_size=16 trainer.epochs=2 dist.pipeline=2 dist.microbatches=4
expect_in "$out/pipeline.err" "x 2 ranks (gloo, pipeline 2 x data 1 x tensor 1"
run_tp 4 pipeline_data data.batch_size=8 trainer.epochs=2 dist.pipeline=2 dist.schedule=gpipe
expect_in "$out/pipeline_data.err" "x 4 ranks (gloo, pipeline 2 x data 2 x tensor 1"
# Stopped at step 5 at dist.tensor=2, resumed and finished in one process.
run_tp 2 moved data.batch_size=16 trainer.epochs=2 trainer.max_steps=5 dist.tensor=2
"$bin" "${common[@]}" data.batch_size=16 trainer.epochs=2 trainer.resume=auto run.dir="$out/moved" \
  >"$out/moved_one.out" 2>"$out/moved_one.err" || { cat "$out/moved_one.err"; fail "the resume in one process failed"; }
expect_in "$out/moved_one.err" "resuming from $out/moved/checkpoints/last.pt: .*step 5"
# Stopped at step 5 in 2 stages, resumed and finished at dist.tensor=2.
run_tp 2 staged data.batch_size=16 trainer.epochs=2 trainer.max_steps=5 dist.pipeline=2
run_tp 2 staged data.batch_size=16 trainer.epochs=2 trainer.resume=auto dist.tensor=2
expect_in "$out/staged.err" "resuming from $out/staged/checkpoints/last.pt: .*step 5"

# Dropout on: straight through, and SIGKILLed after the first epoch's checkpoint then resumed.
tree() { echo "$1"; local c; for c in $(pgrep -P "$1"); do tree "$c"; done; }  # a process and its descendants
killed_and_resumed() {  # NAME ARGS...: $out/NAME straight through, $out/NAME_killed killed and resumed
  local name="$1"; shift
  run_tp 2 "$name" "$@"
  "$torchrun" --standalone --nproc-per-node 2 --no-python "$bin" "${common[@]}" "$@" \
    run.dir="$out/${name}_killed" >"$out/${name}_killed.out" 2>"$out/${name}_killed.err" &
  local pid=$! victims v
  for _ in $(seq 1 1200); do
    if [[ -f "$out/${name}_killed/checkpoints/last.pt" ]]; then break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  victims=$(tree "$pid")
  kill -9 $victims 2>/dev/null || true  # torchrun starts its ranks in sessions of their own
  set +e; wait "$pid" 2>/dev/null; set -e
  for v in $victims; do while kill -0 "$v" 2>/dev/null; do sleep 0.05; done; done
  [[ -f "$out/${name}_killed/checkpoints/last.pt" ]] || { cat "$out/${name}_killed.err"; fail "$name: no checkpoint before the kill"; }
  [[ ! -f "$out/${name}_killed/summary.json" ]] || fail "$name: the run finished before it was killed: the test saw no kill"
  run_tp 2 "${name}_killed" "$@" trainer.resume=auto
  expect_in "$out/${name}_killed.err" "resuming from $out/${name}_killed/checkpoints/last.pt"
}
drop=(data.batch_size=16 trainer.epochs=4 trainer.checkpoint_every=1 model.dropout=0.1)
killed_and_resumed tensor_drop "${drop[@]}" dist.tensor=2
killed_and_resumed pipeline_drop "${drop[@]}" dist.pipeline=2

"$py" - "$out" "$here/../tolerance.py" <<'PY'
import importlib.util
import json
import sys
import torch
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel
def check(ok, what):  # an assert that PYTHONOPTIMIZE cannot remove
    if not ok:
        raise AssertionError(what)
spec = importlib.util.spec_from_file_location("tolerance", sys.argv[2])
tol = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tol)
out = sys.argv[1]
def weights(name):
    return load_file(f"{out}/{name}/hf/model.safetensors")
one = weights("one")
steps = json.load(open(f"{out}/one/summary.json"))["steps"]
# Not one computation: the row-parallel layers add each rank's partial sums, the vocabulary-parallel
# cross-entropy sums its exponentials per rank, the clip's squared norm adds per part then over ranks (in
# float64) against per tensor in float32: the longest float32 reduction whose order differs is that norm
# over all P parameters; AdamW (lr 3e-3, betas 0.9 and 0.95, weight decay 0.1) carries it through the steps.
P = sum(t.numel() for t in one.values())
limit = tol.adamw_bound(tol.EPS32, n=P, steps=steps, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1,
                        max_weight=max(t.abs().max().item() for t in one.values()))
start_moved = None
for name in ("tensor", "tensor_data", "moved", "pipeline", "pipeline_data", "staged"):
    d, at = tol.max_abs(weights(name), one)
    check(d <= limit, f"{name}: {at} differs by {d:.2e} from one process (bound {limit:.1e})")
    print(f"{name}: {steps} steps, weights within {d:.1e} of one process (bound {limit:.1e})")
    GPT2LMHeadModel.from_pretrained(f"{out}/{name}/hf")
s = json.load(open(f"{out}/tensor_data/summary.json"))
check(s["world_size"] == 4 and s["tensor_parallel"] == 2, s)
s = json.load(open(f"{out}/pipeline_data/summary.json"))
check(s["world_size"] == 4 and s["pipeline_parallel"] == 2, s)
for name in ("tensor_drop", "pipeline_drop"):
    a, b = weights(f"{name}_killed"), weights(name)
    check(a.keys() == b.keys(), f"{name}: the killed run's export has other tensors")
    for k in a:
        check(torch.equal(a[k], b[k]), f"{name}, killed and resumed: {k} differs from the run straight through")
    d, _ = tol.max_abs(b, one)
    check(d > 10 * limit, f"{name}: dropout changed the weights by {d:.1e} only: the test would not see a mask "
                          "replayed")
    print(f"{name}: dropout 0.1, SIGKILLed after epoch 1 and resumed: every weight bit-identical to the run "
          "straight through")
PY
echo "model_parallel_recipe: OK"
