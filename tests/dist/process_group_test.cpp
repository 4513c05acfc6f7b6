// dist.backend: its names, and the library a group picks for its device.
#include <ember/core/config.h>
#include <ember/core/error.h>
#include <ember/dist/keys.h>
#include <ember/dist/process_group.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

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
    EXPECT_NE(std::string(e.what()).find("expected gloo, nccl or auto"), std::string::npos) << e.what();
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
  EXPECT_EQ(group->backend(), "gloo");
  torch::Tensor t = torch::ones({3});
  group->all_reduce_sum_(t);
  EXPECT_TRUE(torch::equal(t, torch::ones({3})));
}

}  // namespace
}  // namespace ember::dist
