#!/usr/bin/env bash
# End to end: the finetune recipe on generated PNG folders (3 classes), from
# checkpoints PyTorch saved (torchvision resnet18 and timm vit_tiny, random
# weights: nothing is downloaded) and from its own export:
#   - a 1000-class checkpoint with the recipe's own 3 classes is refused,
#     naming fc.weight's shapes and model.new_head=true, and the corrected
#     command then runs in the same run.dir;
#   - with model.new_head=true it trains (every other tensor read), and the
#     export at the end loads into torchvision's resnet18(num_classes=3)
#     with load_state_dict(strict=True);
#   (fine-tuning on real data, against training from scratch, and pruning
#   after it: finetune_transfer.sh);
#   - a ViT at another image size (32 px from a 224 px checkpoint: the
#     position table resampled) trains and its export loads into timm strict;
#   - the planner's measurement (--measure) of a ResNet-50 counts its
#     parameters and MACs as torchvision's module does;
#   - a ViT whose image size is not augment.size, and model.new_head=true
#     without model.pretrained, are refused under --check.
set -euo pipefail
bin="$1"; py="$2"; out="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/checks.sh"
rm -rf "$out"; mkdir -p "$out"
"$py" "$here/make_image_folder.py" "$out/images" 30 10 >/dev/null
"$py" - "$out" <<'EOF'
import sys
import timm
import torch
import torchvision
from safetensors.torch import save_file
out = sys.argv[1]
torch.manual_seed(0)
save_file({k: v.contiguous() for k, v in torchvision.models.resnet18().state_dict().items()}, f"{out}/rn18.safetensors")
save_file({k: v.contiguous() for k, v in timm.create_model("vit_tiny_patch16_224").state_dict().items()},
          f"{out}/vit.safetensors")
EOF

common=(data.root="$out/images" data.size=[36,36] augment.size=[32,32] augment.scale=[0.35,1.0]
        data.batch_size=30 data.eval_batch_size=30 trainer.threads=1 optim.lr=0.02 sched.warmup_epochs=0)
run() {  # run NAME ARGS...: the recipe into $out/NAME, its stdout and stderr beside it
  local name="$1"; shift
  "$bin" "${common[@]}" run.dir="$out/$name" "$@" >"$out/$name.out" 2>"$out/$name.err"
}

# A 1000-class head into 3 classes: refused by name, with the key to set.
set +e
run refused model.arch=resnet18 model.pretrained="$out/rn18.safetensors" trainer.epochs=1; rc=$?
set -e
if grep -q "built without OpenCV" "$out/refused.err"; then skip "Ember built without OpenCV"; fi
[[ $rc -ne 0 ]] || fail "a 1000-class checkpoint loaded into a 3-class model without model.new_head"
expect_in "$out/refused.err" "fc.weight"
expect_in "$out/refused.err" "model.new_head=true"
# The refusal left nothing in the way: the same run.dir takes the corrected command.
run refused model.arch=resnet18 model.pretrained="$out/rn18.safetensors" model.new_head=true trainer.epochs=1 ||
  { cat "$out/refused.err"; fail "the corrected command was refused in the refused run's folder"; }

# The head new, every other tensor read; the export back into torchvision.
run rn18 model.arch=resnet18 model.pretrained="$out/rn18.safetensors" model.new_head=true trainer.epochs=2 ||
  { cat "$out/rn18.err"; fail "the resnet18 fine-tuning failed (its stderr above)"; }
expect_in "$out/rn18.err" "model.pretrained: 120 tensors from 1 file(s) of .*; new head: fc.weight, fc.bias"
expect_in "$out/rn18.err" "wrote .*rn18/model.safetensors"
"$py" - "$out" "$here/../../tools/pytorch" <<'EOF'
import sys
import torch
import torchvision
from safetensors.torch import load_file
out = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import ember_pruned
built = ember_pruned.load(f"{out}/rn18")  # from model.json: torchvision.models.resnet18(num_classes=3)
assert isinstance(built, torchvision.models.ResNet) and built.fc.out_features == 3, built.fc
model = torchvision.models.resnet18(num_classes=3)
model.load_state_dict(load_file(f"{out}/rn18/model.safetensors"), strict=True)
before = load_file(f"{out}/rn18.safetensors")
moved = [k for k, v in model.state_dict().items() if k.endswith(".weight") and not k.startswith("fc.")
         and not torch.equal(v, before[k])]
assert len(moved) > 10, f"fine-tuning changed only {moved}"
print(f"finetune: the resnet18 export loads into torchvision strict (and through its model.json); "
      f"{len(moved)} weights moved by fine-tuning")
EOF

# A ViT at 32 px from a 224 px checkpoint: the position table resampled; the export back into timm.
run vit model.arch=vit_tiny_patch16_224 model.img_size=32 model.pretrained="$out/vit.safetensors" \
  model.new_head=true trainer.epochs=1 optim.name=adamw optim.lr=1e-3 ||
  { cat "$out/vit.err"; fail "the ViT fine-tuning failed (its stderr above)"; }
expect_in "$out/vit.err" "resampled: pos_embed"
"$py" - "$out" "$here/../../tools/pytorch" <<'EOF'
import sys
import timm
from safetensors.torch import load_file
out = sys.argv[1]
model = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=3)
model.load_state_dict(load_file(f"{out}/vit/model.safetensors"), strict=True)
sys.path.insert(0, sys.argv[2])
import ember_pruned
assert ember_pruned.load(f"{out}/vit").patch_embed.img_size == (32, 32)  # timm.create_model(img_size=32)
print("finetune: the ViT export (32 px) loads into timm strict (and through its model.json)")
EOF

# The planner sizes the real model: --measure of a torchvision ResNet-50 (64 px) counts its
# parameters and forward MACs as torchvision's own module does (hooks on every Conv2d and Linear).
"$bin" --measure "$out/measure.json" model.arch=resnet50 data.root="$out/images" data.size=[72,72] \
  augment.size=[64,64] data.batch_size=8 trainer.threads=1 plan.precisions=fp32 plan.timed_steps=2 \
  >"$out/measure.out" 2>"$out/measure.err" || { cat "$out/measure.err"; fail "finetune --measure failed"; }
"$py" - "$out/measure.json" <<'EOF'
import json
import sys
import torch
import torchvision
m = json.load(open(sys.argv[1]))
model = torchvision.models.resnet50(num_classes=3).eval()
macs = 0
def conv(mod, inputs, out):
    global macs
    macs += out.numel() * (mod.in_channels // mod.groups) * mod.kernel_size[0] * mod.kernel_size[1]
def linear(mod, inputs, out):
    global macs
    macs += out.numel() * mod.in_features
for mod in model.modules():
    if isinstance(mod, torch.nn.Conv2d):
        mod.register_forward_hook(conv)
    elif isinstance(mod, torch.nn.Linear):
        mod.register_forward_hook(linear)
with torch.no_grad():
    model(torch.zeros(1, 3, 64, 64))
params = sum(p.numel() for p in model.parameters())
if (m["parameters"], m["forward_macs_per_sample"]) != (params, macs):
    sys.exit(f"FAILED: --measure counts {m['parameters']} parameters and {m['forward_macs_per_sample']} MACs, "
             f"torchvision's resnet50 {params} and {macs}")
if m["train_flops_per_sample"] != 6 * macs:
    sys.exit(f"FAILED: training FLOPs {m['train_flops_per_sample']} are not 6 x {macs} MACs")
print(f"finetune --measure: resnet50 at 64 px, {params} parameters and {macs} MACs per image, as torchvision's")
EOF

# A ViT whose images are not augment.size: refused before any work.
set +e
"$bin" "${common[@]}" model.arch=vit_tiny_patch16_224 --check >"$out/check.out" 2>"$out/check.err"; rc=$?
set -e
[[ $rc -ne 0 ]] || fail "--check accepted a 224 px ViT with augment.size=[32,32]"
expect_in "$out/check.err" "set augment.size=\[224, 224\]"
set +e
"$bin" "${common[@]}" model.new_head=true --check >"$out/check2.out" 2>"$out/check2.err"; rc=$?
set -e
[[ $rc -ne 0 ]] || fail "--check accepted model.new_head=true without model.pretrained"
expect_in "$out/check2.err" "model.pretrained is \"\""
echo "finetune_subset: OK"
