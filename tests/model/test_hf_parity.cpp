// Parity with Hugging Face transformers: tiny LLaMA (untied, llama3 RoPE scaling), tiny
// Qwen3 (tied, q/k norm, head_dim != hidden/heads), tiny Mistral (head_dim != hidden/heads;
// and with a 5-token sliding window on every layer), tiny Qwen2 (tied, q/k/v biases), tiny
// OLMo 2 (post-norms, whole-q/k norms), tiny Granite (its four multipliers), tiny Phi-3
// (fused projections, sliding window), tiny Gemma 2 and Gemma 3 (1 + w norms before and after
// each branch, GeGLU, scaled embeddings, sliding and global layers; Gemma 3's q/k norms and
// per-layer RoPE base; Gemma 2's logit soft-capping), tiny Phi-3 with LongRoPE (its long and its
// short table) with
// random weights; golden logits, loss
// and every parameter gradient made by tests/fixtures/hf_golden/make_golden.py (fp32, eager
// attention). The CPU backend must match at fp32 tolerance, the CUDA backend (bf16
// storage, fp32 accumulation) at bf16 tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "formats/checkpoint.hpp"
#include "formats/phi3_hf.hpp"
#include "formats/safetensors.hpp"
#include "tests/model/device_reference.hpp"

namespace rp::test {
namespace {

struct Golden {
  LoadedModel model;
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

// `name`: a fixture folder under tests/fixtures ("hf_golden/tiny_llama", "hf_moe/..."); `file`:
// its golden file.
Golden load_golden(const std::string& name, const std::string& file) {
  const std::string dir = std::string(RP_FIXTURES_DIR) + "/" + name;
  Golden g{load_model(dir), {}, {}, {}, {}, {}, std::make_unique<SafetensorsFile>(dir + "/" + file)};
  g.layout = make_layout(g.model.config);
  fill_groups(g.model, g.layout, g.weights);
  HostTensor ids = g.get("ids"), tg = g.get("targets");
  g.shape = {ids.shape[0], ids.shape[1]};
  for (float v : ids.data) g.ids.push_back(int32_t(v));
  for (float v : tg.data) g.targets.push_back(int32_t(v));
  return g;
}

// transformers' gradient of layout tensor `name`: Phi-3's q/k/v and gate/up are row ranges of
// the fused qkv_proj / gate_up_proj's
HostTensor golden_grad(const Golden& g, const std::string& name) {
  for (const FusedProjection& f : fused_projections(g.model.config)) {
    int64_t row0 = 0;
    for (size_t k = 0; k < f.parts.size(); ++k) {
      if (f.parts[k] == name) {
        const HostTensor all = g.get("grad." + f.name);
        return {{f.rows[k], f.cols},
                std::vector<float>(all.data.begin() + row0 * f.cols,
                                   all.data.begin() + (row0 + f.rows[k]) * f.cols)};
      }
      row0 += f.rows[k];
    }
  }
  return g.get("grad." + name);
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

void check(Device& dev, const std::string& name, double tol_out, double tol_grad,
           const std::string& file = "golden.safetensors") {
  Golden g = load_golden(name, file);
  DeviceRun r = device_forward_backward(dev, g.layout, g.weights, g.ids, g.targets, g.shape);
  HostTensor loss = g.get("loss"), logits = g.get("logits");
  EXPECT_NEAR(r.count, loss.data[1], 0.5) << name << " " << file;
  EXPECT_NEAR(r.loss_sum, loss.data[0], tol_out * std::abs(loss.data[0])) << name;
  if (g.layout.config.num_experts > 0) {  // the load-balancing loss of the same forward pass
    const float aux = g.get("aux_loss").data[0];
    EXPECT_NEAR(r.aux_loss, aux, tol_out * aux) << name << " load-balancing loss";
  }
  ASSERT_EQ(r.logits.size(), logits.data.size());
  EXPECT_LT(rel(r.logits.data(), logits.data.data(), logits.data.size()), tol_out) << name << " logits";
  int checked = 0;
  for (size_t gi = 0; gi < g.layout.groups.size(); ++gi)
    for (auto& t : g.layout.groups[gi].tensors) {
      HostTensor ref = golden_grad(g, t.name);
      ASSERT_EQ(int64_t(ref.data.size()), t.numel()) << t.name;
      EXPECT_LT(rel(r.grads[gi].data() + t.offset, ref.data.data(), ref.data.size()), tol_grad)
          << name << " d/d " << t.name;
      ++checked;
    }
  EXPECT_GT(checked, 10);
}

const char* const kDense[] = {"hf_golden/tiny_llama", "hf_golden/tiny_qwen3", "hf_golden/tiny_mistral",
                              "hf_golden/tiny_mistral_swa", "hf_golden/tiny_qwen2"};
// tiny Qwen3-MoE: a dense layer between two sparse ones, renormalised top-2 of 8, the
// load-balancing loss on, untied; and every second layer sparse, raw top-3 of 6, no
// load-balancing loss, tied embeddings (tests/fixtures/hf_moe/make_moe_golden.py)
const char* const kMoe[] = {"hf_moe/tiny_qwen3_moe", "hf_moe/tiny_qwen3_moe_tied"};
// tiny GPT-OSS: sliding window 3 (shorter than the 12-token sequences) / full / sliding
// layers, sinks, attention, router and expert biases, clamped SwiGLU, top-2 of 4, YaRN
// (untruncated), load-balancing loss on (tests/fixtures/hf_gpt_oss/make_gpt_oss_golden.py;
// its MXFP4 twin loads to the same weights: IoGptOss.Mxfp4CheckpointLoadsToTheBf16Weights)
const char* const kGptOss = "hf_gpt_oss/tiny_gpt_oss";
// tiny OLMo 2 (post-norms, q/k norms over all heads, untied), tiny Granite (embedding,
// residual, attention and logit multipliers far from 1; tied) and tiny Phi-3 (fused qkv_proj /
// gate_up_proj split as loaded, a 7-token window on every layer), at the fp32 tolerance on the
// gradients too; tiny Gemma 2 and Gemma 3 (query_pre_attn_scalar != head_dim, head_dim * heads
// != hidden, a 7-token window on layer 0, layer 1 global; Gemma 3's on another RoPE base with
// linear scaling); tiny Phi-4-mini (Phi-3 with RoPE on 12 of 16 features, tied); tiny Gemma 2
// with logit soft-capping on (attention scores capped at 0.5, final logits at 1.5: both bite,
// each changes the logits by about 60%); tiny Phi-3 with LongRoPE over a 16-token original
// context: its 24-token golden passes take long_factor, the 12-token ones of kLongropeShort
// short_factor
const char* const kFamilies[] = {"hf_golden/tiny_olmo2",          "hf_golden/tiny_granite",
                                 "hf_golden/tiny_phi3",           "hf_golden/tiny_gemma2",
                                 "hf_golden/tiny_gemma3",         "hf_golden/tiny_phi4",
                                 "hf_golden/tiny_gemma2_softcap", "hf_golden/tiny_phi3_longrope"};
const char* const kLongrope = "hf_golden/tiny_phi3_longrope";
const char* const kLongropeShort = "golden_short.safetensors";

TEST(HfParity, CpuBackendMatchesTransformersFp32) {
  auto dev = make_cpu_device(0, {});
  for (const char* n : kDense) check(*dev, n, 1e-5, 1e-4);
}

TEST(HfParity, CpuBackendMatchesTransformersMoeFp32) {
  auto dev = make_cpu_device(0, {});
  for (const char* n : kMoe) check(*dev, n, 1e-5, 1e-4);
}

TEST(HfParity, CudaBackendMatchesTransformersBf16) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto dev = make_cuda_device(0, {});
  for (const char* n : kDense) check(*dev, n, 2e-2, 5e-2);
}

TEST(HfParity, CudaBackendMatchesTransformersMoeBf16) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto dev = make_cuda_device(0, {});
  for (const char* n : kMoe) check(*dev, n, 2e-2, 5e-2);
}

TEST(HfParity, CpuBackendMatchesTransformersGptOssFp32) {
  auto dev = make_cpu_device(0, {});
  check(*dev, kGptOss, 1e-5, 1e-5);
}

TEST(HfParity, CudaBackendMatchesTransformersGptOssBf16) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto dev = make_cuda_device(0, {});
  check(*dev, kGptOss, 2e-2, 5e-2);
}

TEST(HfParity, CpuBackendMatchesTransformersFamiliesFp32) {
  auto dev = make_cpu_device(0, {});
  for (const char* n : kFamilies) check(*dev, n, 1e-5, 1e-5);
  check(*dev, kLongrope, 1e-5, 1e-5, kLongropeShort);
}

// The bf16 bounds are bf16's own noise: transformers itself in bf16 against its fp32 result on
// the same fixtures (measured on the H200, eager attention, relative L2 of the logits / the
// largest of every gradient's) is at 0.010 / 0.016 for Phi-3 and 0.012 / 0.031 for Gemma 2
// (0.012 / 0.039 with soft-capping, transformers' bf16 on the CPU),
// but 0.025 / 0.086 for Gemma 3 (its q/k norms per head, four (1 + w) norms per layer and
// sqrt(hidden)-scaled embeddings round more), so Gemma 3 is held to that measured floor and
// the others to 2e-2 / 5e-2. A wrong formula errs by O(1) (the CPU fp32 parity above holds
// every family to 1e-5).
TEST(HfParity, CudaBackendMatchesTransformersFamiliesBf16) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto dev = make_cuda_device(0, {});
  for (const char* n : kFamilies) {
    const bool gemma3 = std::string(n) == "hf_golden/tiny_gemma3";
    check(*dev, n, gemma3 ? 3e-2 : 2e-2, gemma3 ? 1e-1 : 5e-2);
  }
  check(*dev, kLongrope, 2e-2, 5e-2, kLongropeShort);
}

}  // namespace
}  // namespace rp::test
