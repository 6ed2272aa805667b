// Phi-3's fused q/k/v and gate/up projections (formats/phi3_hf.hpp).
#include "formats/phi3_hf.hpp"

#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/error_text.hpp"

namespace rp {

std::vector<HfTensorPlace> hf_tensor_places(const ModelLayout& layout) {
  std::map<std::string, const FusedProjection*> first_part;
  std::set<std::string> parts;
  const std::vector<FusedProjection> fused = fused_projections(layout.config);
  for (const FusedProjection& f : fused) {
    first_part[f.parts.front()] = &f;
    parts.insert(f.parts.begin(), f.parts.end());
  }
  std::vector<HfTensorPlace> places;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const ParamGroup& grp = layout.groups[g];
    for (size_t i = 0; i < grp.tensors.size(); ++i) {
      const TensorSpec& t = grp.tensors[i];
      const auto f = first_part.find(t.name);
      if (f == first_part.end()) {
        if (!parts.count(t.name)) places.push_back({t.name, t.shape, g, t.offset});
        continue;
      }
      // the parts follow each other in the group (make_layout): the fused tensor is their memory
      int64_t rows = 0;
      for (size_t k = 0; k < f->second->parts.size(); ++k) {
        const TensorSpec& p = grp.tensors.at(i + k);
        if (p.name != f->second->parts[k] || p.offset != t.offset + rows * f->second->cols)
          throw std::logic_error(fmt::format("hf_tensor_places: '{}' does not follow '{}' in group '{}'",
                                             p.name, t.name, grp.name));
        rows += p.shape[0];
      }
      places.push_back({f->second->name, {rows, f->second->cols}, g, t.offset});
    }
  }
  return places;
}

std::string peft_module_name(const ModelConfig& c, const std::string& m) {
  if (!hf_fuses_projections(c)) return m;
  if (m == "q_proj" || m == "k_proj" || m == "v_proj") return "qkv_proj";
  if (m == "gate_proj" || m == "up_proj") return "gate_up_proj";
  return m;
}

namespace {
// "model.layers.N.self_attn.q_proj.weight" -> "model.layers.N.self_attn.q_proj"
std::string stem(const std::string& weight) {
  return weight.substr(0, weight.size() - std::string(".weight").size());
}
}  // namespace

FusedAdapters fused_adapters(const ModelLayout& layout, const std::vector<const float*>& group_data) {
  FusedAdapters out;
  if (!layout.lora) return out;
  const LoraConfig& lora = *layout.lora;
  const int64_t r = lora.r;
  const bool with_data = !group_data.empty();  // empty: the patterns only
  for (const FusedProjection& f : fused_projections(layout.config)) {
    std::vector<std::pair<int, const TensorSpec*>> a, b;  // the adapted parts' lora_A / lora_B
    for (const std::string& part : f.parts) {
      for (size_t g = 0; g < layout.groups.size(); ++g) {
        const ParamGroup& grp = layout.groups[g];
        const int ia = grp.find(stem(part) + ".lora_A.weight"), ib = grp.find(stem(part) + ".lora_B.weight");
        if (ia < 0 || ib < 0) continue;
        if (with_data && !group_data[g])
          throw std::invalid_argument(fmt::format("fused_adapters: no data for group '{}'", grp.name));
        a.push_back({int(g), &grp.tensors[size_t(ia)]});
        b.push_back({int(g), &grp.tensors[size_t(ib)]});
      }
    }
    if (a.empty()) continue;
    if (a.size() != f.parts.size())
      throw std::invalid_argument(fmt::format("fused_adapters: {} of {} parts of {} adapted (all or none)",
                                              a.size(), f.parts.size(), f.name));
    const int64_t n = int64_t(a.size()), R = n * r, H = f.cols;
    // PEFT's scaling alpha' / r' (or / sqrt(r') with rsLoRA) at r' = n r equals ours
    out.rank_pattern[f.module] = R;
    out.alpha_pattern[f.module] = lora.alpha * (lora.use_rslora ? std::sqrt(double(n)) : double(n));
    if (!with_data) continue;
    int64_t rows = 0;
    for (int64_t k : f.rows) rows += k;
    HostTensor A{{R, H}, std::vector<float>(size_t(R * H))},
        B{{rows, R}, std::vector<float>(size_t(rows * R), 0.0f)};
    int64_t row0 = 0;
    for (int64_t k = 0; k < n; ++k) {
      const float* pa = group_data[size_t(a[size_t(k)].first)] + a[size_t(k)].second->offset;
      std::memcpy(A.data.data() + k * r * H, pa, size_t(r * H) * sizeof(float));
      const float* pb = group_data[size_t(b[size_t(k)].first)] + b[size_t(k)].second->offset;
      for (int64_t o = 0; o < f.rows[size_t(k)]; ++o)
        std::memcpy(B.data.data() + (row0 + o) * R + k * r, pb + o * r, size_t(r) * sizeof(float));
      row0 += f.rows[size_t(k)];
      out.replaced.push_back(stem(f.parts[size_t(k)]) + ".lora_A.weight");
      out.replaced.push_back(stem(f.parts[size_t(k)]) + ".lora_B.weight");
    }
    out.tensors[stem(f.name) + ".lora_A.weight"] = std::move(A);
    out.tensors[stem(f.name) + ".lora_B.weight"] = std::move(B);
  }
  return out;
}

std::map<std::string, HostTensor> split_fused_adapters(const std::map<std::string, HostTensor>& tensors,
                                                       const ModelConfig& c, int64_t r,
                                                       const std::string& where) {
  std::map<std::string, HostTensor> out = tensors;
  for (const FusedProjection& f : fused_projections(c)) {
    const std::string ka = stem(f.name) + ".lora_A.weight", kb = stem(f.name) + ".lora_B.weight";
    const auto ia = tensors.find(ka), ib = tensors.find(kb);
    if (ia == tensors.end() && ib == tensors.end()) continue;
    if (ia == tensors.end() || ib == tensors.end())
      throw std::runtime_error(
          one_line(fmt::format("{}: key 'base_model.model.{}': missing (its lora_{} is there)", where,
                               ia == tensors.end() ? ka : kb, ia == tensors.end() ? "B" : "A")));
    const HostTensor &A = ia->second, &B = ib->second;
    const int64_t n = int64_t(f.parts.size()), H = f.cols;
    int64_t rows = 0;
    for (int64_t k : f.rows) rows += k;
    const int64_t R = A.shape.size() == 2 ? A.shape[0] : -1;
    if (A.shape.size() != 2 || A.shape[1] != H || (R != r && R != n * r))
      throw std::runtime_error(
          one_line(fmt::format("{}: key 'base_model.model.{}': expected shape [{}, {}] (PEFT's, lora_A "
                               "shared by the {} parts) or [{}, {}] "
                               "(roundpipe's, one block per part), got [{}]",
                               where, ka, r, H, n, n * r, H, fmt::join(A.shape, ", "))));
    if (B.shape != std::vector<int64_t>{rows, R})
      throw std::runtime_error(
          one_line(fmt::format("{}: key 'base_model.model.{}': expected shape [{}, {}], got [{}]", where, kb,
                               rows, R, fmt::join(B.shape, ", "))));
    const bool blocks = R == n * r && n * r != r;
    int64_t row0 = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t out_rows = f.rows[size_t(k)], c0 = blocks ? k * r : 0;
      HostTensor a{{r, H}, std::vector<float>(A.data.begin() + c0 * H, A.data.begin() + (c0 + r) * H)};
      HostTensor b{{out_rows, r}, std::vector<float>(size_t(out_rows * r))};
      for (int64_t o = 0; o < out_rows; ++o)
        for (int64_t q = 0; q < R; ++q) {
          const float v = B.data[size_t((row0 + o) * R + q)];
          if (q >= c0 && q < c0 + r) b.data[size_t(o * r + q - c0)] = v;
          else if (v != 0.0f)  // an off-block value: not an adapter per part
            throw std::runtime_error(
                one_line(fmt::format("{}: key 'base_model.model.{}': rank {} = {} x lora.r but not block "
                                     "diagonal (row {}, column {} is "
                                     "{}); expected one block of {} columns per part ({})",
                                     where, kb, R, n, row0 + o, q, v, r, fmt::join(f.part_modules, ", "))));
        }
      out[stem(f.parts[size_t(k)]) + ".lora_A.weight"] = std::move(a);
      out[stem(f.parts[size_t(k)]) + ".lora_B.weight"] = std::move(b);
      row0 += out_rows;
    }
    out.erase(ka);
    out.erase(kb);
  }
  return out;
}

}  // namespace rp
