#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "runtime/grad_sync.h"
#include "runtime/mpi_communicator.h"
#include "test_support.h"
#include "train/image_config.h"
#include "train/lr_schedule.h"

namespace mgbench {
namespace {

void expect_config_error(const train::ImageConfig& c, const std::string& option) {
  test::expect_error<ConfigError>([&] { c.validate(); }, {option});
}

TEST(ImageConfig, ValidationNamesTheOption) {
  train::ImageConfig ok;
  EXPECT_NO_THROW(ok.validate());
  auto c = ok;
  c.strategy = "fsdp";
  expect_config_error(c, "--strategy");
  c = ok;
  c.device = "tpu";
  expect_config_error(c, "--device");
  c = ok;
  c.backend = "gloo";
  expect_config_error(c, "--backend");
  c = ok;
  c.upscale = "gpu";
  expect_config_error(c, "--upscale");
  c = ok;
  c.profile_window = "720";
  expect_config_error(c, "--profile-window");
  c = ok;
  c.profile_window = "steps:x:3";
  expect_config_error(c, "--profile-window");
  c = ok;
  c.precision = "fp8";
  expect_config_error(c, "--precision");
  c = ok;
  c.batch_size = 0;
  expect_config_error(c, "--batch-size");
  c = ok;
  c.image_size = -3;
  expect_config_error(c, "--image-size");
  c = ok;
  c.epochs = 0;
  expect_config_error(c, "--epochs");
  c = ok;
  c.lr = 0;
  expect_config_error(c, "--lr");
  c = ok;
  c.optimizer = "lion";
  expect_config_error(c, "--optimizer");
}

TEST(LrSchedule, WarmupThenCosine) {
  // torchtune's LambdaLR: the first optimizer step runs with lambda(0) = 0.
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 0, 4, 100, true), 0.0);
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 1, 4, 100, true), 0.25);
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 3, 4, 100, true), 0.75);
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 4, 4, 100, true), 1.0);
  EXPECT_NEAR(train::lr_at_step(1.0, 52, 4, 100, true), 0.5, 1e-12);
  EXPECT_NEAR(train::lr_at_step(1.0, 100, 4, 100, true), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(train::lr_at_step(0.1, 50, 0, 100, false), 0.1);
}

TEST(GradSync, HooksLaunchBucketsDuringBackward) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(64, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256),
                            torch::nn::ReLU(), torch::nn::Linear(256, 10));
  runtime::GradSyncOptions options;
  options.first_bucket_bytes = 4096;
  options.bucket_bytes = 64 * 1024;
  runtime::GradSync sync(net->parameters(), comm, options);
  ASSERT_GE(sync.num_buckets(), 3u);
  const torch::Tensor x = torch::randn({8, 64});
  sync.prepare();
  net->forward(x).pow(2).mean().backward();
  std::vector<torch::Tensor> expected;
  for (const auto& p : net->parameters()) expected.push_back(p.grad().clone());
  // Every bucket completes inside backward, all launched before finish().
  EXPECT_EQ(sync.buckets_launched_in_backward(), sync.num_buckets());
  sync.finish();
  const auto params = net->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].grad(), expected[i]));
}

TEST(MpiCommunicator, RejectsWhatMpiCannotReduce) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::Tensor flags = torch::zeros({4}, torch::kBool);
  EXPECT_THROW(comm.all_reduce(flags, runtime::ReduceOp::kSum), CommError);
  torch::Tensor strided = torch::zeros({4, 4}).t();
  EXPECT_THROW(comm.all_reduce(strided, runtime::ReduceOp::kSum), CommError);
}

TEST(MpiCommunicator, StagesHalfTypesThroughFloat32) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  for (auto dtype : {torch::kFloat16, torch::kBFloat16}) {
    torch::Tensor t = torch::tensor({1.5, -2.0, 3.25}).to(dtype);
    const torch::Tensor before = t.clone();
    auto work = comm.all_reduce(t, runtime::ReduceOp::kSum);
    work->wait();
    EXPECT_EQ(t.scalar_type(), dtype);
    EXPECT_TRUE(torch::equal(t, before));                 // one rank: the sum is the tensor itself
    EXPECT_GT(work->seconds_since_start_of(*work), 0.0);  // launch to the completion wait() saw
  }
}

TEST(GradSync, ReportsTheAllReduceWindow) {
  runtime::MpiCommunicator comm(MPI_COMM_SELF);
  torch::nn::Linear net(16, 4);
  runtime::GradSync sync(net->parameters(), comm);
  EXPECT_EQ(sync.window_s(), 0.0);  // nothing launched yet
  sync.prepare();
  net->forward(torch::randn({2, 16})).sum().backward();
  sync.finish();
  const double window = sync.window_s();
  EXPECT_GT(window, 0.0);
  EXPECT_LT(window, 5.0);
}

}  // namespace
}  // namespace mgbench
