// fill_groups (roundpipe/checkpoint.hpp): a loaded model's tensors copied into the layout's
// group buffers. In memory only, so the generator can take a LoadedModel without the formats.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "model/error_text.hpp"
#include "roundpipe/checkpoint.hpp"

namespace rp {

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(one_line(fmt::format("{}: {}", where, what)));
}

}  // namespace

void fill_group(const LoadedModel& m, const ModelLayout& layout, size_t g, std::span<float> out) {
  const auto& grp = layout.groups.at(g);
  if (int64_t(out.size()) != grp.numel)
    throw std::invalid_argument(
        fmt::format("fill_group: group '{}' has {} values, the buffer {}", grp.name, grp.numel, out.size()));
  std::fill(out.begin(), out.end(), 0.0f);
  for (const auto& t : grp.tensors) {
    auto it = m.tensors.find(t.name);
    if (it == m.tensors.end()) fail(m.source, fmt::format("missing tensor '{}'", t.name));
    if (int64_t(it->second.data.size()) != t.numel())
      fail(m.source, fmt::format("tensor '{}': {} values, the layout expects {}", t.name,
                                 it->second.data.size(), t.numel()));
    std::memcpy(out.data() + t.offset, it->second.data.data(), size_t(t.numel()) * sizeof(float));
  }
}

void fill_groups(const LoadedModel& m, const ModelLayout& layout,
                 std::vector<std::vector<float>>& group_data) {
  group_data.resize(layout.groups.size());
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    group_data[g].assign(size_t(layout.groups[g].numel), 0.0f);
    fill_group(m, layout, g, group_data[g]);
  }
}

}  // namespace rp
