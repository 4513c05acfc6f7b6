#pragma once
// A c10d backend for one process that stands for `size` identical ranks
// (ProcessGroup::create_replicas): no communication; every collective returns
// what `size` ranks holding this rank's tensors would get. A sum is `size` x
// the tensor, a maximum the tensor, a gather `size` copies, a reduce-scatter
// `size` x this rank's chunk, a broadcast nothing. Its outputs are written in
// place into the tensors the caller allocated, as NCCL's are, so a DDP or
// sharded step over it holds the memory one rank of `size` holds (less the
// communication library's own buffers). Not for training.
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace ember::dist {

c10::intrusive_ptr<c10d::Backend> make_replica_backend(int rank, int size);

}  // namespace ember::dist
