#include <torch/torch.h>

#include <cmath>

#include "core/error.h"
#include "runtime/grad_sync.h"
#include "runtime/mpi_communicator.h"
#include "train/image_config.h"
#include "train/lr_schedule.h"
#include "test_support.h"

namespace mgbench {
namespace {

void expect_config_error(const train::ImageConfig& c, const std::string& option) {
  test::expect_error<ConfigError>([&] { c.validate(); }, {option});
}

TEST(ImageConfig, ValidationNamesTheOption) {
  train::ImageConfig ok;
  EXPECT_NO_THROW(ok.validate());
  auto c = ok;
  c.strategy = "dp";
  expect_config_error(c, "--strategy");
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
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 0, 4, 100, true), 0.25);
  EXPECT_DOUBLE_EQ(train::lr_at_step(1.0, 3, 4, 100, true), 1.0);
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
  torch::Tensor half = torch::zeros({4}, torch::kFloat16);
  EXPECT_THROW(comm.all_reduce(half, runtime::ReduceOp::kSum), CommError);
  torch::Tensor strided = torch::zeros({4, 4}).t();
  EXPECT_THROW(comm.all_reduce(strided, runtime::ReduceOp::kSum), CommError);
}

}  // namespace
}  // namespace mgbench
