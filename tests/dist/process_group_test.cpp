// dist.backend: its names, and the library a group picks for its device;
// the replica group (one process standing for N identical ranks).
#include <ember/core/config.h>
#include <ember/core/error.h>
#include <ember/dist/ddp.h>
#include <ember/dist/distribution.h>
#include <ember/dist/keys.h>
#include <ember/dist/process_group.h>
#include <ember/dist/sharding.h>
#include <ember/optim/optimizer.h>
#include <ember/train/trainer.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "dist/thread_ranks.h"
#include "tolerance.h"
#include "train/test_task.h"

namespace ember::dist {
namespace {

TEST(ProcessGroup, BackendNamesRoundTripAndOthersAreConfigErrors) {
  for (const Backend b : {Backend::kAuto, Backend::kGloo, Backend::kNccl})
    EXPECT_EQ(parse_backend(to_string(b)), b);
  EXPECT_STREQ(to_string(Backend::kAuto), "auto");
  EXPECT_STREQ(to_string(Backend::kGloo), "gloo");
  EXPECT_STREQ(to_string(Backend::kNccl), "nccl");
  core::Config c;
  declare_dist_keys(c);
  EXPECT_EQ(c.get_string("dist.backend"), "auto");
  EXPECT_EQ(process_group_options_from_config(c, torch::kCPU).backend(), Backend::kAuto);
  c.set_override("dist.backend=nccl");
  EXPECT_EQ(process_group_options_from_config(c, torch::kCPU).backend(), Backend::kNccl);
  c.set_override("dist.backend=mpi");
  try {
    c.validate();  // before any process group exists
    ADD_FAILURE() << "dist.backend=mpi was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("dist.backend=\"mpi\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("choose gloo, nccl or auto"), std::string::npos) << e.what();
  }
}

std::string create_error(Backend backend, torch::Device device) {
  return test_util::error_of([&] {
    ProcessGroup::create(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                         ProcessGroupOptions().backend(backend).device(device));
  });
}

TEST(ProcessGroup, AutoIsGlooOnTheCpuAndEachBackendItsDevice) {
  const std::string gloo_on_cuda = create_error(Backend::kGloo, torch::Device(torch::kCUDA, 0));
  EXPECT_NE(gloo_on_cuda.find("dist.backend=gloo reduces CPU tensors only, but this rank trains on cuda:0"),
            std::string::npos)
      << gloo_on_cuda;
  const std::string nccl_on_cpu = create_error(Backend::kNccl, torch::kCPU);
  EXPECT_NE(nccl_on_cpu.find("dist.backend=nccl needs a CUDA device, this rank trains on cpu"),
            std::string::npos)
      << nccl_on_cpu;
  // auto on the CPU: a Gloo group (of one process here).
  std::shared_ptr<ProcessGroup> group;
  try {
    group = ProcessGroup::create(c10::make_intrusive<c10d::HashStore>(), 0, 1,
                                 ProcessGroupOptions().backend(Backend::kAuto));
  } catch (const Error& e) {
    if (std::string(e.what()).find("Gloo route is verified for LibTorch 2.11 only") != std::string::npos)
      GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_EQ(group->backend(), dist::Backend::kGloo);
  torch::Tensor t = torch::ones({3});
  group->all_reduce_sum_(t);
  EXPECT_TRUE(torch::equal(t, torch::ones({3})));
}

// What N ranks holding this rank's tensors would get: a sum is N x, a maximum
// the value, a gather N copies, a reduce-scatter N x this rank's chunk.
// A rank whose rendezvous store is not there (rank 0's node never started) is
// told so with the address within dist.startup_timeout_s, without c10d's log:
// its TCPStore client retried to about 2.4 times the wait and logged each try
// with some 20 C++ stack frames.
TEST(ProcessGroup, ARankWhoseStoreIsNotThereIsToldWithoutStackFrames) {
  int64_t port = 0;  // a port nothing listens on: bound, then closed
  {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(a);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &size), 0);
    port = ntohs(a.sin_port);
    close(fd);
  }
  LaunchEnv e;
  e.rank = 1;
  e.world_size = 2;
  e.master_port = port;
  testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  ErrorKind kind = ErrorKind::kGeneral;
  try {
    ProcessGroup::create(e, ProcessGroupOptions().startup_timeout(std::chrono::seconds(2)));
  } catch (const Error& x) {
    error = x.what();
    kind = x.kind();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(kind, ErrorKind::kDistributed);
  EXPECT_NE(error.find("rank 1 could not reach the rendezvous store at 127.0.0.1:" + std::to_string(port) +
                       " within 2 s"),
            std::string::npos)
      << error;
  EXPECT_EQ(log.find("frame #"), std::string::npos) << log;
  EXPECT_LT(took, 2 + 20) << "a bound on a hang (20 s: a loaded machine), not a speed";
}

// Point-to-point as pipeline stages use it: sends posted before the matching
// receives, and receives posted in another order than the sends (matched by
// tag, not by order), around a ring of 3 ranks; misuse refused by name.
TEST(ProcessGroup, SendAndRecvMatchByPeerAndTagInAnyOrder) {
  const std::vector<std::string> errors =
      test_util::run_thread_ranks(3, [](const std::shared_ptr<ProcessGroup>& group) {
        ProcessGroup& g = *group;
        const int64_t r = g.rank(), next = (r + 1) % 3, prev = (r + 2) % 3;
        std::vector<torch::Tensor> out;
        std::vector<ProcessGroup::Pending> sends;
        for (int64_t tag = 0; tag < 3; ++tag) {  // tag k carries 100 r + k
          out.push_back(torch::full({2, 3}, static_cast<double>(100 * r + tag), torch::kFloat64));
          sends.push_back(g.start_send(out.back(), next, tag));
        }
        std::vector<torch::Tensor> in(3);
        std::vector<ProcessGroup::Pending> recvs;
        for (const int64_t tag : {2, 0, 1}) {
          in[static_cast<size_t>(tag)] = torch::empty({2, 3}, torch::kFloat64);
          recvs.push_back(g.start_recv(in[static_cast<size_t>(tag)], prev, tag));
        }
        for (auto& p : recvs) p.wait();
        for (auto& p : sends) p.wait();
        for (int64_t tag = 0; tag < 3; ++tag)
          if (!torch::equal(in[static_cast<size_t>(tag)],
                            torch::full({2, 3}, static_cast<double>(100 * prev + tag), torch::kFloat64)))
            throw Error("rank " + std::to_string(r) + " tag " + std::to_string(tag) +
                        ": received the wrong values");
        torch::Tensor t = torch::zeros({2});
        for (const int64_t bad : {r, int64_t{3}, int64_t{-1}}) {
          try {
            g.start_send(t, bad, 0);
            throw Error("a send to rank " + std::to_string(bad) + " was accepted");
          } catch (const Error& e) {
            if (std::string(e.what()).find("is not another rank of this group of 3") == std::string::npos)
              throw;
          }
        }
      });
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  const auto replicas = ProcessGroup::create_replicas(0, 2, {});
  torch::Tensor t = torch::zeros({2});
  try {
    replicas->start_recv(t, 1, 0);
    ADD_FAILURE() << "a replica group accepted a receive";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no peer to exchange with"), std::string::npos) << e.what();
  }
}

TEST(ReplicaGroup, CollectivesGiveWhatIdenticalRanksWould) {
  const auto group = ProcessGroup::create_replicas(1, 4, {});
  EXPECT_EQ(group->backend(), dist::Backend::kReplicas);
  EXPECT_EQ(group->rank(), 1);
  EXPECT_EQ(group->size(), 4);
  torch::Tensor t = torch::tensor({1.0f, -2.0f});
  group->all_reduce_sum_(t);
  EXPECT_TRUE(torch::equal(t, torch::tensor({4.0f, -8.0f})));
  group->all_reduce_max_(t);
  EXPECT_TRUE(torch::equal(t, torch::tensor({4.0f, -8.0f})));
  torch::Tensor in = torch::arange(8, torch::kFloat32), out = torch::empty({2});
  group->start_reduce_scatter(out, in).wait();
  EXPECT_TRUE(torch::equal(out, torch::tensor({8.0f, 12.0f})));  // chunk 1 = {2, 3}, x 4
  torch::Tensor gathered = torch::full({8}, -1.0f), piece = torch::tensor({5.0f, 6.0f});
  group->start_all_gather(gathered, piece).wait();
  EXPECT_TRUE(torch::equal(gathered, torch::tensor({5.0f, 6.0f, 5.0f, 6.0f, 5.0f, 6.0f, 5.0f, 6.0f})));
  torch::Tensor b = torch::tensor({3.0f});
  group->broadcast_(b, 0);
  EXPECT_TRUE(torch::equal(b, torch::tensor({3.0f})));
  group->check_same_everywhere("config", "anything");  // no other process to wait for
  EXPECT_THROW(ProcessGroup::create_replicas(4, 4, {}), Error);
}

std::vector<torch::Tensor> train_blobs(const std::shared_ptr<ProcessGroup>& group,
                                       const std::shared_ptr<train::Callback>& parallel, int64_t* state_bytes,
                                       optim::OptimizerKind kind = optim::OptimizerKind::kSgd,
                                       torch::ScalarType dtype = torch::kFloat32) {
  test_util::BlobTask::Options task_options;
  task_options.dropout = false;
  task_options.dtype = dtype;
  test_util::BlobTask task(task_options);
  train::TrainerOptions o;
  o.max_steps(6).epochs(100).val_every(0).checkpoint_every(0);
  o.optimizer(optim::OptimizerOptions().kind(kind).lr(1e-2));
  if (group) o.distribution(make_distribution(group));
  train::Trainer trainer(o);
  if (parallel) trainer.add_callback(parallel);
  struct StateBytes : train::Callback {
    explicit StateBytes(int64_t* bytes) : out(bytes) {}
    std::string name() const override { return "state_bytes"; }
    void on_step_end(train::Trainer& t, const train::StepInfo&) override {
      *out = optim::optimizer_state_bytes(*t.optimizer());
    }
    int64_t* out;
  };
  trainer.add_callback(std::make_shared<StateBytes>(state_bytes));
  trainer.fit(task);
  return test_util::snapshot(*task.model());
}

// DDP over N replicas trains as one process (the sum over identical ranks,
// divided by N, is this rank's gradient; SGD, whose step scales with the
// gradient: a sum that was not N x would show). The sharded stages keep 1/N
// of AdamW's state (what bs_find.world_size measures); their values are not a
// single process's (a gather repeats this rank's shard).
TEST(ReplicaGroup, DdpOnReplicasTrainsAsOneProcessAndShardingKeepsOneNth) {
  int64_t alone_state = 0, alone64_state = 0, ddp_state = 0, sharded_state = 0;
  (void)train_blobs(nullptr, nullptr, &alone_state);  // float32: the state the sharded run splits
  // Float64: the all-reduced mean of 4 equal gradients, (((g + g) + g) + g) / 4, rounds twice (3g,
  // 4g), so the runs are two computations (tolerance.h): 2 roundings of a gradient and 1 of the
  // weight a step; an SGD step at most doubles an earlier difference (lr |H| <= 1): 6 steps,
  // 3 x 6 x 2^6 roundings of the weights' magnitude.
  const auto f64 = torch::kFloat64;
  const std::vector<torch::Tensor> alone =
      train_blobs(nullptr, nullptr, &alone64_state, optim::OptimizerKind::kSgd, f64);
  const auto group = ProcessGroup::create_replicas(0, 4, {});
  const std::vector<torch::Tensor> ddp =
      train_blobs(group, std::make_shared<DistributedDataParallel>(group, DdpOptions()), &ddp_state,
                  optim::OptimizerKind::kSgd, f64);
  ASSERT_EQ(alone.size(), ddp.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(ddp[i].scalar_type(), f64);
    EXPECT_TRUE(test_util::near(ddp[i], alone[i],
                                test_util::rounding_bound(f64, 3 * 6 * 64, test_util::max_abs(alone[i]))))
        << i;
  }
  EXPECT_EQ(ddp_state, alone64_state);
  (void)train_blobs(
      group, std::make_shared<ShardedDataParallel>(group, ShardingOptions().stage(Sharding::kGradients)),
      &sharded_state);
  // AdamW's two moments (and step counts), split in 4 with padding to a multiple of 4 elements.
  EXPECT_GT(sharded_state, alone_state / 4 - 64);
  EXPECT_LT(sharded_state, alone_state / 4 + 256);
}

}  // namespace
}  // namespace ember::dist
