// The actor runtime on the CUDA backend (bf16 storage, fp32 accumulation and master
// weights): several workers sharing one GPU (separate pools and streams) must reproduce
// the fp32 sequential loop within bf16 tolerance; frozen groups (also with nothing pinned,
// copies from pageable memory) match the CPU backend. Skips without a GPU.
#include <gtest/gtest.h>

#include <optional>

#include "actors/session_testing.hpp"
#include "tests/actors/runtime_reference.hpp"

namespace rp::test {
namespace {

TEST(RuntimeCuda, WorkersSharingOneGpuMatchSequentialFp32) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  ModelLayout m = make_layout(tiny_config(true, true));
  AdamWOptions adam;
  adam.beta2 = 0.99;
  adam.eps = 1e-6;
  const double lr = 1e-3;
  const int64_t M = 3, n_seq = 2, seq_len = 16, n = M * n_seq * seq_len;
  for (int workers : {1, 2, 3}) {
    for (bool async : {false, true}) {
      SessionOptions o;
      o.backend = "cuda";
      o.workers = workers;
      o.micro_batches = M;
      o.micro = {n_seq, seq_len};
      o.async = async;
      o.adam = adam;
      Session s(m, random_weights(m, 7), o);
      // reference (fp32, CPU, same staleness)
      auto w = random_weights(m, 7);
      std::vector<std::vector<std::vector<float>>> versions{w};
      std::vector<TextbookAdamW> opt(m.groups.size());
      for (int t = 0; t < 3; ++t) {
        std::vector<int32_t> ids, tg;
        random_tokens(m.config.vocab_size, n, 500 + t, ids, tg);
        s.forward_backward(ids, tg);
        s.step(lr);
        std::vector<std::vector<double>> g(m.groups.size());
        for (size_t k = 0; k < g.size(); ++k) g[k].assign(w[k].size(), 0.0);
        double loss = 0, count = 0;
        sequential_forward_backward(m, versions[std::max(0, t - (async ? 1 : 0))], ids, tg, M,
                                    {n_seq, seq_len}, g, loss, count);
        for (size_t k = 0; k < g.size(); ++k) {
          for (auto& x : g[k]) x /= count;
          opt[k].step(w[k], g[k], adam, lr);
        }
        versions.push_back(w);
        StepResult r = s.wait(t);
        EXPECT_NEAR(r.loss_sum / r.tokens, loss / count, 2e-2 * loss / count)
            << "workers " << workers << " async " << async << " step " << t;
      }
      s.synchronize();
      for (size_t k = 0; k < w.size(); ++k) {
        double num = 0, den = 0;
        for (size_t i = 0; i < w[k].size(); ++i) {
          double d = double(s.master_weights()[k][i]) - w[k][i];
          num += d * d;
          den += double(w[k][i]) * w[k][i];
        }
        EXPECT_LT(std::sqrt(num / den), 1e-2) << "group " << k << " workers " << workers;
      }
    }
  }
}

// Frozen groups on the GPU (storage uploads, Ops::dequantize on the device, no weight
// gradients): the same run on the CPU backend is the reference within bf16 tolerance, and the
// frozen groups read back bit-identical to the host's dequantization.
TEST(RuntimeCuda, FrozenGroupsMatchTheCpuBackend) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  ModelLayout m = make_layout(tiny_config(true, true));
  freeze_group(m, 0, WeightFormat::bf16);
  freeze_group(m, 2, WeightFormat::q8_0);
  freeze_group(m, 3, WeightFormat::q4_0);
  freeze_group(m, 4, WeightFormat::nf4);
  const int64_t M = 3, n_seq = 2, seq_len = 16, n = M * n_seq * seq_len;
  auto run = [&](const std::string& backend, std::optional<size_t> pin_budget = std::nullopt) {
    SessionOptions o;
    o.backend = backend;
    o.pin_budget_bytes = pin_budget;
    o.workers = 2;
    o.micro_batches = M;
    o.micro = {n_seq, seq_len};
    o.adam.beta2 = 0.99;
    Session s(m, random_weights(m, 7), o);
    if (pin_budget == size_t(0)) {
      EXPECT_EQ(s.host_pinning().pinned_bytes, 0u);
    }
    std::vector<double> losses;
    for (int t = 0; t < 3; ++t) {
      std::vector<int32_t> ids, tg;
      random_tokens(m.config.vocab_size, n, 700 + t, ids, tg);
      s.forward_backward(ids, tg);
      s.step(1e-3);
    }
    for (int t = 0; t < 3; ++t) {
      StepResult r = s.wait(t);
      losses.push_back(r.loss_sum / r.tokens);
    }
    s.synchronize();
    std::vector<std::vector<float>> w;
    for (int g = 0; g < int(m.groups.size()); ++g) w.push_back(s.group_weights_f32(g));
    return std::make_pair(losses, w);
  };
  const auto [gpu_losses, gpu_w] = run("cuda");
  const auto [cpu_losses, cpu_w] = run("cpu");
  // nothing pinned: every copy goes through the driver's staging (pageable host memory)
  const auto [pageable_losses, pageable_w] = run("cuda", size_t(0));
  for (const auto* gpu : {&gpu_losses, &pageable_losses})
    for (size_t t = 0; t < cpu_losses.size(); ++t)
      EXPECT_NEAR((*gpu)[t], cpu_losses[t], 2e-2 * cpu_losses[t]) << "step " << t;
  for (const auto* gw : {&gpu_w, &pageable_w})
    for (size_t g = 0; g < m.groups.size(); ++g) {
      if (m.groups[g].frozen) {
        EXPECT_EQ((*gw)[g], cpu_w[g]) << "frozen group " << g;
      } else {
        EXPECT_LT(rel_err((*gw)[g], cpu_w[g]), 1e-2) << "group " << g;
      }
    }
}

}  // namespace
}  // namespace rp::test
