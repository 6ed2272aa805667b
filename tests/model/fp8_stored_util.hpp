// Helpers of the tests of a LoRA decoder over a base stored as fp8 (model/fp8_linear.hpp,
// LayerArgs::fp8_stored_base): the tiny model with adapters on every linear, its base weights
// (rows of different magnitudes, as trained weights have) in their fp8 storage form, the values
// that storage dequantizes to, and the base group as the uploader leaves it for a layer that
// runs from the stored codes.
#pragma once
#include <cstring>
#include <vector>

#include "kernels/weight_format.hpp"
#include "tests/model/test_lora_util.hpp"

namespace rp::test {

inline LoraConfig fp8_base_lora() {
  LoraConfig l;
  l.r = 4;
  l.alpha = 8;
  l.target_modules = {"all-linear"};
  l.base_format = WeightFormat::fp8;
  return l;
}

struct Fp8StoredBase {
  LoraTiny t{TinyOpts{true, false, "default"}, fp8_base_lora()};
  static constexpr int kLayer = 1;
  int ag = t.lay.adapter_group(kLayer);
  std::vector<uint8_t> storage;  // group kLayer's storage form (TensorSpec::byte_offset, format)
  VecF deq;                      // what it dequantizes to: the weights of the fp32 reference

  Fp8StoredBase() {
    const ParamGroup& g = t.lay.groups[size_t(kLayer)];
    VecF& p = t.params[size_t(kLayer)];
    for (const TensorSpec& ts : g.tensors)  // row r of a matrix scaled by 2^(r % 5 - 2)
      if (ts.shape.size() == 2)
        for (int64_t r = 0; r < ts.shape[0]; ++r)
          for (int64_t c = 0; c < ts.shape[1]; ++c)
            p[size_t(ts.offset + r * ts.shape[1] + c)] *= std::ldexp(1.f, int(r % 5) - 2);
    storage.assign(size_t(g.storage_bytes), 0);
    deq.assign(p.size(), 0.f);
    for (const TensorSpec& ts : g.tensors) {
      const int64_t cols = weight_format_cols(ts.shape);
      quantize_weights(ts.format, p.data() + ts.offset, storage.data() + ts.byte_offset, ts.numel(), cols);
      dequantize_weights(ts.format, storage.data() + ts.byte_offset, deq.data() + ts.offset, ts.numel(),
                         cols);
    }
  }
  /// The base group's compute-dtype buffer (es bytes per element, `values` there already) with
  /// the tensors at `offsets` replaced by their storage bytes, as the uploader copies them.
  void put_stored(std::vector<uint8_t>& values, size_t es, const std::vector<int64_t>& offsets) const {
    for (const TensorSpec& ts : t.lay.groups[size_t(kLayer)].tensors)
      for (int64_t off : offsets)
        if (off == ts.offset) {
          const size_t n = weight_format_bytes(ts.format, ts.numel(), weight_format_cols(ts.shape));
          std::memcpy(values.data() + size_t(ts.offset) * es, storage.data() + ts.byte_offset, n);
        }
  }
};

}  // namespace rp::test
