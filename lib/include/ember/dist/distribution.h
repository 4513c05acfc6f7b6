#pragma once
// The Trainer's view of a process group (train::Distribution): sums of the
// epoch metrics, the writing rank, agreement on stops and on the resume
// position. Failures are ember::Error (ErrorKind::kDistributed) naming the
// rank at fault.
//
//   auto group = ember::dist::ProcessGroup::create(ember::dist::launch_env(), {});
//   ember::train::Trainer
//   trainer(ember::train::TrainerOptions().distribution(ember::dist::make_distribution(group)));
//   trainer.add_callback(std::make_shared<ember::dist::DistributedDataParallel>(group));

#include <memory>

#include "ember/dist/process_group.h"
#include "ember/train/distribution.h"

namespace ember::dist {

/// `sample_copies`: the ranks that train on each sample (a model-parallel
/// layout's pipeline x tensor degrees; 1 under data parallelism).
std::shared_ptr<train::Distribution> make_distribution(std::shared_ptr<ProcessGroup> group,
                                                       int64_t sample_copies = 1);

}  // namespace ember::dist
