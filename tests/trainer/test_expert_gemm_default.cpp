// Bucketed expert GEMMs are the default at every level that carries the choice: the spec, the
// session options a spec without "expert_gemm" gives, the device options, the ops a device
// opens with and a bare Ops object; "grouped" stays a choice all the way down, and a dense
// model takes the default as well.
#include <gtest/gtest.h>

#include <string>

#include "kernels/device.hpp"
#include "kernels/ops.hpp"
#include "model/config.hpp"
#include "trainer/run_setup.hpp"

namespace rp {
namespace {

ModelLayout two_layers_of(const std::string& config) {
  ModelConfig c = load_config_file(std::string(RP_SOURCE_DIR) + "/examples/configs/" + config);
  c.num_hidden_layers = 2;  // the layout's shapes only: nothing is allocated
  return make_layout(c);
}

TEST(ExpertGemmDefault, IsBucketedFromTheSpecToTheOps) {
  const TrainSpec spec;
  EXPECT_EQ(spec.expert_gemm, "bucketed");
  TrainSpec grouped = spec;
  grouped.expert_gemm = "grouped";
  for (const char* config : {"qwen3-30b-a3b.json", "llama-3.1-8b.json"}) {  // sparse, then dense
    SCOPED_TRACE(config);
    const ModelLayout layout = two_layers_of(config);
    EXPECT_TRUE(session_options_of(spec, layout).device.expert_gemm_bucketed);
    EXPECT_FALSE(session_options_of(grouped, layout).device.expert_gemm_bucketed);
  }
  EXPECT_TRUE(DeviceOptions{}.expert_gemm_bucketed);
  EXPECT_EQ(make_cpu_device(0, DeviceOptions{})->ops().expert_gemm(), ExpertGemm::bucketed);
  DeviceOptions o;
  o.expert_gemm_bucketed = false;
  EXPECT_EQ(make_cpu_device(0, o)->ops().expert_gemm(), ExpertGemm::grouped);
  EXPECT_EQ(make_cpu_ops()->expert_gemm(), ExpertGemm::bucketed);
}

}  // namespace
}  // namespace rp
