// Parity with Hugging Face PEFT: tiny LLaMA (untied, "all-linear", scaling alpha/r) and tiny
// Qwen3 (tied, q/k norm, the seven modules listed, rsLoRA) with random base weights and
// nonzero lora_B; golden logits, loss and every lora_A / lora_B gradient made by
// tests/fixtures/hf_lora/make_lora_golden.py (fp32, eager attention, dropout 0). The CPU
// backend must match at fp32 tolerance, the CUDA backend (bf16) at bf16 tolerance.
#include <gtest/gtest.h>

#include <cstdio>

#include <cmath>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "formats/safetensors.hpp"
#include "model/lora.hpp"
#include "tests/model/device_reference.hpp"

namespace rp::test {
namespace {

struct PeftGolden {
  ModelLayout layout;
  std::vector<std::vector<float>> weights;
  std::vector<int32_t> ids, targets;
  MicroBatchShape shape;
  std::unique_ptr<SafetensorsFile> file;
  HostTensor get(const std::string& n) const {
    auto* e = file->find(n);
    if (!e) throw std::runtime_error("golden tensor missing: " + n);
    return file->read_f32(*e);
  }
};

PeftGolden load_peft_golden(const std::string& name) {
  const std::string dir = std::string(RP_FIXTURES_DIR) + "/hf_lora/" + name;
  LoadedModel base = load_model(dir);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/lora.json"));
  LoraConfig lc;
  lc.r = j.at("r").get<int64_t>();
  lc.alpha = j.at("alpha").get<double>();
  lc.use_rslora = j.at("use_rslora").get<bool>();
  lc.target_modules = j.at("target_modules").is_string()
                          ? std::vector<std::string>{j.at("target_modules").get<std::string>()}
                          : j.at("target_modules").get<std::vector<std::string>>();
  PeftGolden g;
  g.file = std::make_unique<SafetensorsFile>(dir + "/golden.safetensors");
  g.layout = make_layout(base.config, lc);
  fill_groups(base, make_layout(base.config), g.weights);  // the base groups
  for (size_t gi = g.weights.size(); gi < g.layout.groups.size(); ++gi) {
    const ParamGroup& grp = g.layout.groups[gi];
    std::vector<float> w(size_t(grp.numel));
    for (auto& t : grp.tensors) {
      HostTensor v = g.get("lora." + t.name);
      EXPECT_EQ(v.shape, t.shape) << t.name;
      std::copy(v.data.begin(), v.data.end(), w.begin() + t.offset);
    }
    g.weights.push_back(std::move(w));
  }
  HostTensor ids = g.get("ids"), tg = g.get("targets");
  g.shape = {ids.shape[0], ids.shape[1]};
  for (float v : ids.data) g.ids.push_back(int32_t(v));
  for (float v : tg.data) g.targets.push_back(int32_t(v));
  return g;
}

double rel(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void check(Device& dev, const std::string& name, double tol_out, double tol_grad) {
  PeftGolden g = load_peft_golden(name);
  DeviceRun r = device_forward_backward(dev, g.layout, g.weights, g.ids, g.targets, g.shape);
  HostTensor loss = g.get("loss"), logits = g.get("logits");
  EXPECT_NEAR(r.count, loss.data[1], 0.5) << name;
  EXPECT_NEAR(r.loss_sum, loss.data[0], tol_out * std::abs(loss.data[0])) << name;
  ASSERT_EQ(r.logits.size(), logits.data.size());
  EXPECT_LT(rel(r.logits.data(), logits.data.data(), logits.data.size()), tol_out) << name << " logits";
  int checked = 0;
  const int L = int(g.layout.config.num_hidden_layers);
  for (int gi = L + 2; gi < int(g.layout.groups.size()); ++gi)
    for (auto& t : g.layout.groups[size_t(gi)].tensors) {
      HostTensor want = g.get("grad." + t.name);
      ASSERT_EQ(int64_t(want.data.size()), t.numel()) << t.name;
      EXPECT_LT(rel(r.grads[size_t(gi)].data() + t.offset, want.data.data(), want.data.size()), tol_grad)
          << name << " d/d " << t.name;
      ++checked;
    }
  EXPECT_EQ(checked, 2 * 7 * L) << name;
}

// The other families' decoders under the seven adapters (make_lora_golden.py says what each
// exercises): Mistral, Qwen2, OLMo 2, Granite 3, Gemma 2 and Gemma 3 text.
const char* const kFamilies[] = {"tiny_mistral_lora", "tiny_qwen2_lora",  "tiny_olmo2_lora",
                                 "tiny_granite_lora", "tiny_gemma2_lora", "tiny_gemma3_lora"};

TEST(LoraPeft, CpuBackendMatchesPeftFp32) {
  auto dev = make_cpu_device(0, {});
  check(*dev, "tiny_llama_lora", 1e-5, 1e-5);
  check(*dev, "tiny_qwen3_lora", 1e-5, 1e-5);
}

TEST(LoraPeft, CpuBackendMatchesPeftFp32OnTheOtherFamilies) {
  auto dev = make_cpu_device(0, {});
  for (const char* name : kFamilies) check(*dev, name, 1e-5, 1e-5);
}

// bf16 storage against PEFT in fp32. The adapter gradients carry more rounding than full
// fine-tuning's weight gradients (5e-2 in HfParity): each is a product through the [T, r]
// intermediates and a dy that crossed the bf16 base; on the H200 the largest was 6.0%
// (most under 5%), against errors of order 1 for a wrong gradient.
TEST(LoraPeft, CudaBackendMatchesPeftBf16) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto dev = make_cuda_device(0, {});
  check(*dev, "tiny_llama_lora", 2e-2, 8e-2);
  check(*dev, "tiny_qwen3_lora", 2e-2, 8e-2);
}

// The Gemmas' bf16 noise is larger: PEFT's own bf16 run against its fp32 one on these fixtures
// (bench/peft_bf16_noise.py, the same on the CPU and the H200) reaches 0.019 / 0.048 (Gemma 2) and 0.024 /
// 0.077 (Gemma 3) on logits / the largest adapter gradient, against 0.010-0.014 / 0.026-0.041 for the others;
// on the H200 ours reached 0.031 on Gemma 3's logits and 0.104 on one Gemma 2 gradient (the rest under
// 0.085), so the Gemmas are held to 4e-2 / 1.5e-1: a wrong gradient is off by order 1.
TEST(LoraPeft, CudaBackendMatchesPeftBf16OnTheOtherFamilies) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto dev = make_cuda_device(0, {});
  for (const char* name : kFamilies) {
    const bool gemma = std::string(name).rfind("tiny_gemma", 0) == 0;
    check(*dev, name, gemma ? 4e-2 : 2e-2, gemma ? 1.5e-1 : 8e-2);
  }
}

// With dropout the masks come from the same counter-based hash on both backends, so the CUDA
// run (bf16) follows the CPU run (fp32) of the same micro-batch's masks: its adapter gradients
// are much closer to that run than to a CPU run with other masks (another dropout id), and as
// close to it as bf16 allows without dropout (the CUDA run against the CPU run, both without;
// dropout 0.3 rescales the kept inputs by 1/0.7 and thins the sums, which about triples the
// rounding: measured on the H200, same masks 0.094 / 0.058, other masks 1.94 / 1.28, no
// dropout 0.031 / 0.028 for the two layers' adapters). The dropout changes the result (its CPU
// run differs from the one without dropout).
TEST(LoraPeft, DropoutRunsEqualAcrossBackends) {
  PeftGolden g = load_peft_golden("tiny_qwen3_lora");
  ModelLayout with_dropout = g.layout;
  with_dropout.lora->dropout = 0.3;
  auto cpu = make_cpu_device(0, {});
  const DeviceRun none = device_forward_backward(*cpu, g.layout, g.weights, g.ids, g.targets, g.shape);
  const DeviceRun ref = device_forward_backward(*cpu, with_dropout, g.weights, g.ids, g.targets, g.shape, 11);
  const DeviceRun other =
      device_forward_backward(*cpu, with_dropout, g.weights, g.ids, g.targets, g.shape, 12);
  EXPECT_GT(rel(ref.logits.data(), none.logits.data(), ref.logits.size()), 1e-3);
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto cuda = make_cuda_device(0, {});
  const DeviceRun r = device_forward_backward(*cuda, with_dropout, g.weights, g.ids, g.targets, g.shape, 11);
  const DeviceRun r_none = device_forward_backward(*cuda, g.layout, g.weights, g.ids, g.targets, g.shape);
  EXPECT_NEAR(r.loss_sum, ref.loss_sum, 2e-2 * std::abs(ref.loss_sum));
  EXPECT_LT(rel(r.logits.data(), ref.logits.data(), ref.logits.size()), 4e-2);  // 0.027 measured
  const int L = int(g.layout.config.num_hidden_layers);
  for (int gi = L + 2; gi < int(g.layout.groups.size()); ++gi) {
    const size_t n = ref.grads[size_t(gi)].size();
    const double same = rel(r.grads[size_t(gi)].data(), ref.grads[size_t(gi)].data(), n);
    const double masks_differ = rel(r.grads[size_t(gi)].data(), other.grads[size_t(gi)].data(), n);
    const double bf16 = rel(r_none.grads[size_t(gi)].data(), none.grads[size_t(gi)].data(), n);
    const std::string& name = g.layout.groups[size_t(gi)].name;
    EXPECT_LT(same, 0.5 * masks_differ) << name;
    EXPECT_LT(same, 4 * bf16) << name << ": bf16 alone gives " << bf16;
    std::printf("[dropout] %s: CUDA vs CPU, same masks %.4f, other masks %.4f, no dropout %.4f\n",
                name.c_str(), same, masks_differ, bf16);
  }
}

}  // namespace
}  // namespace rp::test
