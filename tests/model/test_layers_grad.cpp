// Layer backward vs finite differences (fp32 central differences through
// f = sum(y * r), or the summed loss for the tail and the whole model), gradient
// accumulation, scratch sizing.
#include <gtest/gtest.h>

#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

constexpr double kTol = 2e-2;  // fp32 finite differences, h = 1e-2
const MicroBatchShape kShape{2, 5};

class LayerGrad : public ::testing::TestWithParam<TinyOpts> {};

TEST_P(LayerGrad, Decoder) {
  TinyModel m(GetParam());
  const int64_t T = kShape.tokens(), H = m.layout.config.hidden_size;
  VecF x = ref::randn(size_t(T * H), 5), r = ref::randn(size_t(T * H), 6);
  for (int layer : {1, 2}) {
    std::vector<float> scratch;
    auto grads = m.zero_grads();
    VecF dx = ref::nan_vec(size_t(T * H));
    LayerArgs b = m.args(layer, kShape, &grads, scratch);
    b.x = x.data();
    b.dy = r.data();
    b.dx = dx.data();
    m.layers[size_t(layer)]->backward(b);

    VecF y(size_t(T * H));
    std::vector<float> fscratch;
    LayerArgs fa = m.args(layer, kShape, nullptr, fscratch);
    fa.x = x.data();
    fa.y = y.data();
    auto f = [&] {
      m.layers[size_t(layer)]->forward(fa);
      return dotf(y, r);
    };
    fd_check(f, x.data(), T * H, dx.data(), 40, kTol, "decoder dx");
    for (auto& t : m.layout.groups[size_t(layer)].tensors)
      fd_check(f, m.params[size_t(layer)].data() + t.offset, t.numel(),
               grads[size_t(layer)].data() + t.offset, 30, kTol, t.name);
  }
}

TEST_P(LayerGrad, Embedding) {
  TinyModel m(GetParam());
  const int64_t T = kShape.tokens(), H = m.layout.config.hidden_size;
  auto ids = random_ids(T, m.layout.config.vocab_size, 7);
  ids[3] = ids[1];  // a repeated id accumulates
  VecF r = ref::randn(size_t(T * H), 8), y(size_t(T * H));
  std::vector<float> scratch;
  auto grads = m.zero_grads();
  LayerArgs b = m.args(0, kShape, &grads, scratch);
  b.ids = ids.data();
  b.dy = r.data();
  m.layers[0]->backward(b);
  LayerArgs fa = m.args(0, kShape, nullptr, scratch);
  fa.ids = ids.data();
  fa.y = y.data();
  auto f = [&] {
    m.layers[0]->forward(fa);
    return dotf(y, r);
  };
  // sample only rows that are used, plus the whole table at a few random points
  for (int64_t t = 0; t < T; ++t)
    fd_check(f, m.params[0].data() + ids[size_t(t)] * H, H, grads[0].data() + ids[size_t(t)] * H, 4, kTol,
             "embedding row");
  fd_check(f, m.params[0].data(), int64_t(m.params[0].size()), grads[0].data(), 30, kTol, "embedding table");
}

TEST_P(LayerGrad, Tail) {
  TinyModel m(GetParam());
  const int64_t T = kShape.tokens(), H = m.layout.config.hidden_size;
  const int tl = m.tail();
  VecF x = ref::randn(size_t(T * H), 9);
  auto tg = random_ids(T, m.layout.config.vocab_size, 10);
  tg[4] = -100;
  tg[9] = -1;
  std::vector<float> scratch;
  auto grads = m.zero_grads();
  VecF dx = ref::nan_vec(size_t(T * H));
  float loss_b[2] = {NAN, NAN}, loss_f[2] = {NAN, NAN};
  LayerArgs b = m.args(tl, kShape, &grads, scratch);
  b.x = x.data();
  b.targets = tg.data();
  b.dx = dx.data();
  b.loss = loss_b;
  m.layers[size_t(tl)]->backward(b);
  EXPECT_EQ(loss_b[1], 8.0f);
  std::vector<float> fscratch;
  LayerArgs fa = m.args(tl, kShape, nullptr, fscratch);
  fa.x = x.data();
  fa.targets = tg.data();
  fa.loss = loss_f;
  auto f = [&] {
    m.layers[size_t(tl)]->forward(fa);
    return double(loss_f[0]);
  };
  f();
  EXPECT_NEAR(loss_f[0], loss_b[0], 1e-5 * std::abs(loss_b[0]));
  EXPECT_EQ(loss_f[1], 8.0f);
  fd_check(f, x.data(), T * H, dx.data(), 40, kTol, "tail dx");
  for (int gi : m.layout.groups_of(tl))
    for (auto& t : m.layout.groups[size_t(gi)].tensors)
      fd_check(f, m.params[size_t(gi)].data() + t.offset, t.numel(), grads[size_t(gi)].data() + t.offset, 30,
               kTol, t.name);
}

// Whole model: embedding -> decoders -> tail (fused loss + backward) -> decoders
// backward -> embedding backward, vs finite differences of the summed loss.
struct FullRun {
  TinyModel& m;
  MicroBatchShape s;
  std::vector<int32_t> ids, tg;

  double loss() {
    const int64_t T = s.tokens(), H = m.layout.config.hidden_size;
    VecF a(size_t(T * H)), b(size_t(T * H));
    std::vector<float> scratch;
    LayerArgs e = m.args(0, s, nullptr, scratch);
    e.ids = ids.data();
    e.y = a.data();
    m.layers[0]->forward(e);
    for (int l = 1; l < m.tail(); ++l) {
      LayerArgs d = m.args(l, s, nullptr, scratch);
      d.x = a.data();
      d.y = b.data();
      m.layers[size_t(l)]->forward(d);
      std::swap(a, b);
    }
    float lo[2];
    LayerArgs t = m.args(m.tail(), s, nullptr, scratch);
    t.x = a.data();
    t.targets = tg.data();
    t.loss = lo;
    m.layers[size_t(m.tail())]->forward(t);
    return lo[0];
  }

  float backward(std::vector<VecF>& grads) { return m.backward(s, ids, tg, grads); }
};

TEST_P(LayerGrad, FullModelLoss) {
  TinyModel m(GetParam());
  const MicroBatchShape s{2, 6};
  FullRun run{m, s, random_ids(s.tokens(), m.layout.config.vocab_size, 11),
              random_ids(s.tokens(), m.layout.config.vocab_size, 12)};
  run.tg[0] = -100;
  auto grads = m.zero_grads();
  float lb = run.backward(grads);
  EXPECT_NEAR(run.loss(), lb, 1e-5 * std::abs(lb));
  for (size_t gi = 0; gi < m.layout.groups.size(); ++gi)
    for (auto& t : m.layout.groups[gi].tensors) {
      if (gi == 0) {  // embeddings: sample the used rows (and the LM-head use when tied)
        const int64_t H = m.layout.config.hidden_size;
        for (int k = 0; k < 4; ++k) {
          int64_t row = run.ids[size_t(k * 3)];
          fd_check([&] { return run.loss(); }, m.params[0].data() + row * H, H, grads[0].data() + row * H, 8,
                   kTol, "embed row");
        }
      }
      fd_check([&] { return run.loss(); }, m.params[gi].data() + t.offset, t.numel(),
               grads[gi].data() + t.offset, 12, kTol, t.name);
    }
}

TEST_P(LayerGrad, BackwardAccumulatesGradients) {
  TinyModel m(GetParam());
  const MicroBatchShape s{2, 4};
  FullRun run{m, s, random_ids(s.tokens(), m.layout.config.vocab_size, 13),
              random_ids(s.tokens(), m.layout.config.vocab_size, 14)};
  auto once = m.zero_grads(), twice = m.zero_grads();
  run.backward(once);
  run.backward(twice);
  run.backward(twice);
  for (size_t gi = 0; gi < once.size(); ++gi) {
    double nz = 0;
    for (size_t i = 0; i < once[gi].size(); ++i) {
      ASSERT_NEAR(twice[gi][i], 2 * once[gi][i], 1e-5 * (1 + std::abs(once[gi][i])))
          << "group " << gi << " element " << i;
      nz += std::abs(once[gi][i]);
    }
    EXPECT_GT(nz, 0) << "group " << gi << " got no gradient";
  }
}

// A frozen group (null gradient pointer): the layer still produces the same dx (and loss),
// bit for bit, and the gradients of its other groups, and computes nothing for the frozen one.
TEST_P(LayerGrad, FrozenGroupHasNoGradientAndTheSameDx) {
  TinyModel m(GetParam());
  const int64_t T = kShape.tokens(), H = m.layout.config.hidden_size;
  const int tl = m.tail();
  VecF x = ref::randn(size_t(T * H), 21), r = ref::randn(size_t(T * H), 22);
  auto ids = random_ids(T, m.layout.config.vocab_size, 23);
  auto tg = random_ids(T, m.layout.config.vocab_size, 24);
  // one scratch for every call: the CPU backend's reductions (Eigen) sum in an order that
  // depends on the alignment of their operands, so bit-for-bit comparisons need the same buffers
  std::vector<float> scratch;
  for (int layer = 0; layer <= tl; ++layer) {
    auto run = [&](int frozen_slot, std::vector<VecF>& grads, VecF& dx, float* loss) {
      LayerArgs a = m.args(layer, kShape, &grads, scratch);
      if (frozen_slot >= 0) a.grads[size_t(frozen_slot)] = nullptr;
      a.ids = ids.data();
      a.x = layer > 0 ? x.data() : nullptr;
      a.dy = layer < tl ? r.data() : nullptr;
      a.dx = layer > 0 ? dx.data() : nullptr;
      a.targets = tg.data();
      a.loss = loss;
      m.layers[size_t(layer)]->backward(a);
    };
    auto ref_grads = m.zero_grads();
    VecF ref_dx(size_t(T * H), 0.f);
    float ref_loss[2] = {0, 0};
    run(-1, ref_grads, ref_dx, ref_loss);
    const std::vector<int> groups = m.layout.groups_of(layer);
    for (size_t slot = 0; slot < groups.size(); ++slot) {
      SCOPED_TRACE("layer " + std::to_string(layer) + ", frozen group " + std::to_string(groups[slot]));
      auto grads = m.zero_grads();
      VecF dx(size_t(T * H), 0.f);
      float loss[2] = {0, 0};
      run(int(slot), grads, dx, loss);
      EXPECT_EQ(loss[0], ref_loss[0]);
      for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(dx[i], ref_dx[i]) << "dx " << i;
      for (size_t k = 0; k < groups.size(); ++k) {
        const auto& got = grads[size_t(groups[k])];
        const auto& want = ref_grads[size_t(groups[k])];
        double nz = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          if (k == slot) nz += std::abs(got[i]);  // never written
          else ASSERT_EQ(got[i], want[i]) << "group " << groups[k] << " element " << i;
        }
        EXPECT_EQ(nz, 0);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, LayerGrad,
                         ::testing::Values(TinyOpts{false, false, "default"}, TinyOpts{false, true, "llama3"},
                                           TinyOpts{true, false, "yarn"}, TinyOpts{true, true, "default"}),
                         [](const auto& info) { return opts_name(info.param); });

TEST(LayerScratch, TooSmallScratchThrows) {
  TinyModel m(TinyOpts{});
  const int64_t T = kShape.tokens(), H = m.layout.config.hidden_size;
  VecF x = ref::randn(size_t(T * H), 1), y(size_t(T * H));
  std::vector<float> scratch;
  LayerArgs a = m.args(1, kShape, nullptr, scratch);
  a.x = x.data();
  a.y = y.data();
  a.scratch_bytes =
      m.layers[1]->scratch_bytes(kShape, DType::f32, false) - 1;  // forward needs less than backward
  EXPECT_THROW(m.layers[1]->forward(a), std::invalid_argument);
  a.scratch_bytes += 1;
  EXPECT_NO_THROW(m.layers[1]->forward(a));
  a.ops = nullptr;
  EXPECT_THROW(m.layers[1]->forward(a), std::invalid_argument);
  // scratch grows with the micro-batch; tail scratch independent of T beyond the CE chunk
  EXPECT_GT(m.layers[1]->scratch_bytes({4, 64}), m.layers[1]->scratch_bytes({1, 64}));
  EXPECT_EQ(m.layers[0]->scratch_bytes({4, 64}), 0u);
  EXPECT_THROW(make_layer(m.layout, m.layout.num_layers()), std::out_of_range);
  EXPECT_EQ(make_layer(m.layout, 0)->kind(), LayerKind::embedding);
  EXPECT_EQ(make_layer(m.layout, 2)->kind(), LayerKind::decoder);
  EXPECT_EQ(make_layer(m.layout, 3)->kind(), LayerKind::tail);
}

}  // namespace
}  // namespace rp
