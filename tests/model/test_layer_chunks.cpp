// Decoders run their MLP over chunks of tokens (LayerOptions::mlp_chunk_tokens): any chunk
// size gives the whole-micro-batch result (forward output, dx and every weight gradient) up to
// fp32 rounding, and the scratch holds no [tokens, ffn] buffer.
#include <gtest/gtest.h>

#include "model/layer_memory.hpp"
#include "tests/model/test_layer_util.hpp"

namespace rp {
namespace {

using namespace rp::test;

class LayerChunks : public ::testing::TestWithParam<TinyOpts> {};

TEST_P(LayerChunks, AnyChunkSizeMatchesTheWholeMicroBatch) {
  TinyModel m(GetParam());
  const MicroBatchShape s{2, 5};
  const int64_t T = s.tokens(), H = m.layout.config.hidden_size;
  VecF x = ref::randn(size_t(T * H), 21), dy = ref::randn(size_t(T * H), 22);
  struct Out {
    VecF y, dx;
    std::vector<VecF> grads;
  };
  auto run = [&](const Layer& layer) {
    Out o;
    o.y = ref::nan_vec(size_t(T * H));
    o.dx = ref::nan_vec(size_t(T * H));
    o.grads = m.zero_grads();
    std::vector<float> scratch(layer.scratch_bytes(s) / 4 + 1, std::nanf(""));
    LayerArgs a;
    a.ops = m.ops.get();
    a.shape = s;
    a.params = {m.params[1].data()};
    a.scratch = scratch.data();
    a.scratch_bytes = layer.scratch_bytes(s);
    a.x = x.data();
    a.y = o.y.data();
    layer.forward(a);
    std::fill(scratch.begin(), scratch.end(), std::nanf(""));
    a.y = nullptr;
    a.grads = {o.grads[1].data()};
    a.dy = dy.data();
    a.dx = o.dx.data();
    layer.backward(a);
    return o;
  };
  const Out whole = run(*make_layer(m.layout, 1));
  for (int64_t chunk : {1, 3, 4, 7, 9}) {
    LayerOptions lo;
    lo.mlp_chunk_tokens = chunk;
    auto layer = make_layer(m.layout, 1, lo);
    const Out c = run(*layer);
    EXPECT_LT(ref::rel_err(c.y, whole.y), 1e-6) << "chunk " << chunk << ": y";
    EXPECT_LT(ref::rel_err(c.dx, whole.dx), 1e-5) << "chunk " << chunk << ": dx";
    for (auto& t : m.layout.groups[1].tensors) {
      VecF a(c.grads[1].begin() + t.offset, c.grads[1].begin() + t.offset + t.numel());
      VecF b(whole.grads[1].begin() + t.offset, whole.grads[1].begin() + t.offset + t.numel());
      EXPECT_LT(ref::rel_err(a, b), 1e-5) << "chunk " << chunk << ": " << t.name;
    }
    // smaller chunks need less scratch; a forward call less than a backward one
    EXPECT_LT(layer->scratch_bytes(s), make_layer(m.layout, 1)->scratch_bytes(s));
    EXPECT_LT(layer->scratch_bytes(s, DType::f32, false), layer->scratch_bytes(s, DType::f32, true));
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, LayerChunks,
                         ::testing::Values(TinyOpts{false, false, "default"},
                                           TinyOpts{true, true, "default"}),
                         [](const auto& info) { return opts_name(info.param); });

// Beyond one chunk, the scratch grows with the sequence by the same bytes per token whatever
// the MLP width: no buffer of [tokens, ffn] exists (Qwen3-1.7B and -4B shapes, bf16).
TEST(LayerMemory, DecoderScratchPerTokenDoesNotDependOnTheFfnWidth) {
  for (bool backward : {false, true}) {
    auto growth = [&](int64_t ffn) {
      DecoderDims d{2048, ffn, 16, 8, 128, true};
      const int64_t c = kDefaultMlpChunkTokens;
      return int64_t(decoder_scratch_bytes(d, 1, 8 * c, 2, backward, 0)) -
             int64_t(decoder_scratch_bytes(d, 1, 4 * c, 2, backward, 0));
    };
    EXPECT_EQ(growth(6144), growth(9728)) << (backward ? "backward" : "forward");
    EXPECT_GT(growth(6144), 0);
  }
  // and the [tokens, ffn] buffers of one chunk do depend on it
  DecoderDims a{2048, 6144, 16, 8, 128, true}, b{2048, 9728, 16, 8, 128, true};
  EXPECT_LT(decoder_scratch_bytes(a, 1, 65536, 2, true, 0), decoder_scratch_bytes(b, 1, 65536, 2, true, 0));
}

}  // namespace
}  // namespace rp
