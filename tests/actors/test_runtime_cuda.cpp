// The actor runtime on the CUDA backend (bf16 storage, fp32 accumulation and master
// weights): several workers sharing one GPU (separate pools and streams) must reproduce
// the fp32 sequential loop within bf16 tolerance. Skips without a GPU.
#include <gtest/gtest.h>

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
        sequential_forward_backward(m, versions[std::max(0, t - (async ? 1 : 0))], ids, tg, M, {n_seq, seq_len}, g,
                                    loss, count);
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

}  // namespace
}  // namespace rp::test
