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

std::shared_ptr<train::Distribution> make_distribution(std::shared_ptr<ProcessGroup> group);

}  // namespace ember::dist
