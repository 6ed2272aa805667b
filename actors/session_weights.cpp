// The parameter groups' host copies of rp::Session: checking the constructor's weights,
// filling the ParamStore (a frozen group's storage form, quantized here when it came as fp32),
// and reading any group back as fp32 (Session::group_weights_f32).
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "actors/session_impl.hpp"
#include "kernels/weight_format.hpp"

namespace rp {

void check_frozen_source(const std::optional<FrozenSource>& source) {
  if (source && (source->identity.empty() || !source->fill))
    throw std::invalid_argument(
        "frozen_source: expected a non-empty identity and a fill function (or no frozen_source)");
}

std::vector<char> groups_from_source(const ModelLayout& layout, const std::vector<std::vector<float>>& w,
                                     const std::vector<std::vector<uint8_t>>& frozen_storage, bool source) {
  std::vector<char> out(layout.groups.size(), 0);
  if (source)
    for (size_t g = 0; g < layout.groups.size(); ++g)
      out[g] = layout.groups[g].frozen && g < w.size() && w[g].empty() &&
               (frozen_storage.empty() || frozen_storage[g].empty());
  return out;
}

size_t held_weight_bytes(const ModelLayout& layout, const std::vector<std::vector<float>>& w,
                         const std::vector<std::vector<uint8_t>>& frozen_storage) {
  size_t held = 0;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    if (g < frozen_storage.size()) held += frozen_storage[g].size();
    if (!layout.groups[g].frozen && g < w.size()) held += w[g].size() * sizeof(float);
  }
  return held;
}

void check_session_weights(const ModelLayout& layout, const std::vector<std::vector<float>>& w,
                           const std::vector<std::vector<uint8_t>>& frozen_storage, bool source) {
  const size_t G = layout.groups.size();
  if (w.size() != G)
    throw std::invalid_argument(fmt::format("expected {} parameter groups, got {}", G, w.size()));
  if (!frozen_storage.empty() && frozen_storage.size() != G)
    throw std::invalid_argument(
        fmt::format("frozen_storage: expected {} entries (one per parameter group) or none, "
                    "got {}",
                    G, frozen_storage.size()));
  for (size_t g = 0; g < G; ++g) {
    const ParamGroup& grp = layout.groups[g];
    const bool stored = !frozen_storage.empty() && !frozen_storage[g].empty();
    if (stored && !grp.frozen)
      throw std::invalid_argument(
          fmt::format("frozen_storage: parameter group '{}' is trainable; give its fp32 "
                      "values in group_weights instead",
                      grp.name));
    if (stored) {
      if (int64_t(frozen_storage[g].size()) != grp.storage_bytes)
        throw std::invalid_argument(
            fmt::format("frozen_storage: frozen group '{}' has {} bytes, expected {} "
                        "(its storage form)",
                        grp.name, frozen_storage[g].size(), grp.storage_bytes));
      if (!w[g].empty())
        throw std::invalid_argument(
            fmt::format("parameter group '{}' is given both in storage form and as {} fp32 "
                        "values; leave group_weights[{}] empty",
                        grp.name, w[g].size(), g));
    } else if (grp.frozen && source && w[g].empty()) {
      continue;  // made by SessionOptions::frozen_source
    } else if (int64_t(w[g].size()) != grp.numel) {
      throw std::invalid_argument(
          fmt::format("parameter group '{}' has {} values, expected {}", grp.name, w[g].size(), grp.numel));
    }
  }
}

void fill_store(const ModelLayout& layout, std::vector<std::vector<float>>& w,
                std::vector<std::vector<uint8_t>>& frozen_storage, ParamStore& store,
                const FrozenSource* source, const std::vector<char>& streamed) {
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const ParamGroup& grp = layout.groups[g];
    if (!grp.frozen) {
      cast_f32_to(w[g].data(), store.lowp[g].data(), grp.numel, store.dtype);
      continue;
    }
    const bool stored = !frozen_storage.empty() && !frozen_storage[g].empty();
    const bool from_source = !stored && w[g].empty() && source;
    if (from_source && g < streamed.size() && streamed[g]) continue;  // the tier's cache build makes it
    if (store.lowp[g].size() != size_t(grp.storage_bytes))
      store.lowp[g] = HostBytes(size_t(grp.storage_bytes));
    char* dst = store.lowp[g].as<char>();
    if (from_source) {
      source->fill(int(g),
                   std::span<std::byte>(reinterpret_cast<std::byte*>(dst), size_t(grp.storage_bytes)));
    } else if (stored) {
      std::memcpy(dst, frozen_storage[g].data(), frozen_storage[g].size());
      std::vector<uint8_t>().swap(frozen_storage[g]);
    } else {
      for (const TensorSpec& t : grp.tensors) {
        try {
          quantize_weights(t.format, w[g].data() + t.offset, dst + t.byte_offset, t.numel(),
                           weight_format_cols(t.shape));
        } catch (const std::invalid_argument& e) {
          throw std::invalid_argument(fmt::format("frozen tensor '{}': {}", t.name, e.what()));
        }
      }
    }
    std::vector<float>().swap(w[g]);  // no fp32 master for a frozen group
  }
}

std::vector<float> dequantize_group(const ParamGroup& g, const void* storage) {
  std::vector<float> out(size_t(g.numel));
  const char* src = static_cast<const char*>(storage);
  for (const TensorSpec& t : g.tensors)
    dequantize_weights(t.format, src + t.byte_offset, out.data() + t.offset, t.numel(),
                       weight_format_cols(t.shape));
  return out;
}

std::vector<float> Session::Impl::group_f32(int g) const {
  if (g < 0 || size_t(g) >= layout.groups.size())
    throw std::out_of_range(
        fmt::format("group_weights_f32: group {} outside [0, {})", g, layout.groups.size()));
  const ParamGroup& grp = layout.groups[size_t(g)];
  if (grp.frozen && frozen_tier && frozen_tier->tiered(g))
    return dequantize_group(grp, frozen_tier->read_group(g).data());
  if (grp.frozen) return dequantize_group(grp, store->lowp[size_t(g)].data());
  return master[size_t(g)];
}

}  // namespace rp
