// Timing of one SmolLM2-135M decoder layer and the tail at 256 tokens on the CPU ops.
// Disabled by default (timing only); run with
//   test_model --gtest_also_run_disabled_tests --gtest_filter='*LayerSpeed*'
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

ModelConfig smollm2_135m() {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 49152;
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 9;
  c.num_key_value_heads = 3;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 100000;
  c.max_position_embeddings = 8192;
  c.tie_word_embeddings = true;
  return c;
}

template <class F>
double best_ms(F&& f, int reps) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

TEST(DISABLED_LayerSpeed, SmolLM2DecoderAndTail) {
  ModelLayout m = make_layout(smollm2_135m());
  const MicroBatchShape s{1, 256};
  const int64_t T = s.tokens(), H = 576, V = 49152;
  std::vector<ref::VecF> params, grads;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    params.push_back(ref::randn(size_t(m.groups[g].numel), uint32_t(g + 1), 0.02f));
    grads.emplace_back(params.back().size(), 0.0f);
  }
  for (int threads : {1, 2}) {
    auto ops = make_cpu_ops(threads);
    auto dec = make_layer(m, 1);
    ref::VecF x = ref::randn(size_t(T * H), 9), y(size_t(T * H)), dy = ref::randn(size_t(T * H), 10),
              dx(size_t(T * H));
    std::vector<char> scratch(dec->scratch_bytes(s));
    LayerArgs a;
    a.ops = ops.get();
    a.shape = s;
    a.params = {params[1].data()};
    a.grads = {grads[1].data()};
    a.x = x.data();
    a.y = y.data();
    a.dy = dy.data();
    a.dx = dx.data();
    a.scratch = scratch.data();
    a.scratch_bytes = scratch.size();
    double f = best_ms([&] { dec->forward(a); }, 5);
    double b = best_ms([&] { dec->backward(a); }, 5);
    std::printf(
        "threads %d  decoder fwd %.1f ms  bwd(+recompute) %.1f ms  fwd+bwd %.1f ms  (scratch %.1f MiB)\n",
        threads, f, b, f + b, double(scratch.size()) / (1 << 20));

    auto tail = make_layer(m, 2);
    std::vector<char> ts(tail->scratch_bytes(s));
    auto tg = test::random_ids(T, V, 3);
    float loss[2];
    LayerArgs t;
    t.ops = ops.get();
    t.shape = s;
    t.params = {params[2].data(), params[0].data()};
    t.grads = {grads[2].data(), grads[0].data()};
    t.x = x.data();
    t.targets = tg.data();
    t.loss = loss;
    t.dx = dx.data();
    t.scratch = ts.data();
    t.scratch_bytes = ts.size();
    double tf = best_ms([&] { tail->forward(t); }, 2);
    double tb = best_ms([&] { tail->backward(t); }, 2);
    std::printf("threads %d  tail fwd %.1f ms  fused fwd+bwd %.1f ms  (scratch %.1f MiB)\n", threads, tf, tb,
                double(ts.size()) / (1 << 20));
    // GEMM throughput of the biggest decoder linear (gate_proj: 256x576 -> 1536)
    ref::VecF gx = ref::randn(size_t(T * H), 4), gw = ref::randn(size_t(1536 * H), 5), gy(size_t(T * 1536));
    double g = best_ms([&] { ops->linear_fwd(gx.data(), gw.data(), gy.data(), T, H, 1536); }, 10);
    std::printf("threads %d  linear 256x576x1536: %.2f ms = %.1f GFLOP/s\n", threads, g,
                2.0 * T * H * 1536 / g / 1e6);
  }
}

}  // namespace
}  // namespace rp
