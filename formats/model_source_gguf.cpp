// The GGUF side of rp::ModelSource (formats/model_source_impl.hpp): llama.cpp's tensor names and
// stacked experts mapped to Hugging Face tensors, read one at a time, and ggml blocks that
// already are a storage form copied as they are.
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "formats/format_fail.hpp"
#include "formats/model_source_impl.hpp"
#include "formats/tokenizer_export.hpp"
#include "model/error_text.hpp"

namespace rp {

using Loc = ModelSource::Impl::Loc;

namespace {

/// A stacked expert tensor of a sparse layer (row-major [num_experts, rows, cols] or, biases,
/// [num_experts, rows]; see gguf_expert_stack_name) as the num_experts Hugging Face tensors
/// prefix<e>suffix [rows, cols] / [rows]; a fused gate/up stack as prefix<e>.gate_proj.* (the
/// first rows / 2 rows of slice e) and prefix<e>.up_proj.* (the others).
void add_expert_stack(const GgufFile& f, const GgufTensorInfo& t, ModelSource::Impl& s,
                      const std::string& prefix, const std::string& suffix) {
  const std::vector<int64_t> shape = t.shape();
  const int64_t E = s.header.config.num_experts;
  const bool bias = suffix.size() >= 5 && suffix.compare(suffix.size() - 5, 5, ".bias") == 0;
  const bool fused = suffix.rfind(".gate_up_proj.", 0) == 0;
  if (E <= 0 || shape.size() != (bias ? 2u : 3u) || shape[0] != E || (fused && shape[1] % 2 != 0))
    format_fail(f.path(), fmt::format("tensor '{}': expected {} [num_experts = {}, {}{}], got [{}]", t.name,
                                      bias ? "2-D" : "3-D", E, fused ? "2 * " : "", bias ? "n" : "rows, cols",
                                      fmt::join(shape, ", ")));
  f.check_dequantizable(t);
  const std::string kind = bias ? ".bias" : ".weight";
  const std::vector<std::pair<std::string, int64_t>> parts =
      fused ? std::vector<std::pair<std::string, int64_t>>{{".gate_proj" + kind, 0},
                                                           {".up_proj" + kind, shape[1] / 2}}
            : std::vector<std::pair<std::string, int64_t>>{{suffix, 0}};
  for (int64_t e = 0; e < E; ++e)
    for (const auto& [suf, row0] : parts) {
      const std::string hf = prefix + std::to_string(e) + suf;
      if (s.tensors.count(hf)) format_fail(f.path(), fmt::format("tensor '{}' appears twice", t.name));
      Loc l;
      l.shape.assign(shape.begin() + 1, shape.end());
      if (fused) l.shape[0] /= 2;
      l.gguf = &t;
      l.expert = e;
      l.row0 = row0;
      s.tensors.emplace(hf, std::move(l));
    }
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

/// First element of slice `l` within its GGUF tensor (0 unless it is an expert's slice).
int64_t first_element(const Loc& l) {
  if (l.expert < 0) return 0;
  const int64_t per_expert = l.gguf->numel() / l.gguf->ne.back();  // the stack's outermost dim is E
  const int64_t cols = l.shape.size() == 2 ? l.shape[1] : 1;
  return l.expert * per_expert + l.row0 * cols;
}

/// True when slice `l` of its GGUF tensor (an expert's slice of its stack) starts and ends on
/// block boundaries of its type: `first` its first element, `be`/`bb` the type's block.
bool whole_blocks(const Loc& l, int64_t& first, int64_t& be, int64_t& bb) {
  if (!ggml_type_block(l.gguf->type, be, bb)) return false;
  first = first_element(l);
  return first % be == 0 && numel_of(l.shape) % be == 0;
}
}  // namespace

void open_gguf_source(const std::string& path, ModelSource::Impl& s) {
  s.gguf = std::make_unique<GgufFile>(path);
  const GgufFile& f = *s.gguf;
  s.header.config = config_from_gguf(f);  // checks the sizes against the file's size
  const std::string arch = f.get_string("general.architecture");
  for (const auto& t : f.tensors()) {
    if (t.name == "rope_freqs.weight") continue;  // folded into config.rope_scaling
    std::string prefix, suffix;
    if (gguf_expert_stack_name(t.name, prefix, suffix)) {
      add_expert_stack(f, t, s, prefix, suffix);
      continue;
    }
    const std::string hf = gguf_to_hf_name(t.name, arch);
    if (hf.empty())
      format_fail(path, fmt::format("unexpected tensor '{}' (no Hugging Face equivalent)", t.name));
    if (s.tensors.count(hf)) format_fail(path, fmt::format("tensor '{}' appears twice", t.name));
    f.check_dequantizable(t);
    Loc l;
    l.shape = t.shape();
    l.gguf = &t;
    s.tensors.emplace(hf, std::move(l));
  }
  if (f.has("tokenizer.ggml.model") && f.get("tokenizer.ggml.model") == "gpt2") {
    s.header.tokenizer_json = tokenizer_json_from_gguf(f);
    s.header.tokenizer_source = path + " (its tokenizer.ggml.* metadata)";
  }
  if (f.has("tokenizer.chat_template") && f.get("tokenizer.chat_template").is_string()) {
    s.header.chat_template = f.get_string("tokenizer.chat_template");
    s.header.chat_template_source =
        std::filesystem::path(path).filename().string() + " key 'tokenizer.chat_template'";
  }
}

std::vector<float> gguf_read_f32(const GgufFile& f, const Loc& l) {
  std::vector<float> out;
  int64_t first = 0, be = 0, bb = 0;
  if (l.expert < 0) {
    out = f.dequantize(*l.gguf);
  } else if (whole_blocks(l, first, be, bb)) {  // this expert's blocks alone
    out.resize(size_t(numel_of(l.shape)));
    f.dequantize_blocks(*l.gguf, first, int64_t(out.size()), out.data());
  } else {  // the slice splits a block: the whole stack, then the slice
    const std::vector<float> all = f.dequantize(*l.gguf);
    const ptrdiff_t n = ptrdiff_t(numel_of(l.shape));
    out.assign(all.begin() + ptrdiff_t(first_element(l)), all.begin() + ptrdiff_t(first_element(l)) + n);
  }
  if (l.permute_heads) unpermute_qk_rows(out.data(), l.shape[0], l.shape[1], l.permute_heads);
  return out;
}

bool gguf_read_stored(const GgufFile& f, const Loc& l, WeightFormat fmt, void* dst) {
  const GgmlType t = GgmlType(l.gguf->type);
  const bool same = (t == GgmlType::F32 && fmt == WeightFormat::f32) ||
                    (t == GgmlType::F16 && fmt == WeightFormat::f16) ||
                    (t == GgmlType::BF16 && fmt == WeightFormat::bf16) ||
                    (t == GgmlType::Q8_0 && fmt == WeightFormat::q8_0) ||
                    (t == GgmlType::Q4_0 && fmt == WeightFormat::q4_0) ||
                    (t == GgmlType::MXFP4 && fmt == WeightFormat::mxfp4);
  if (!same) return false;
  int64_t first = 0, be = 0, bb = 0;
  if (!whole_blocks(l, first, be, bb)) return false;
  const int64_t n = numel_of(l.shape);
  const int64_t cols = l.shape.size() == 2 ? l.shape[1] : n;
  if (l.permute_heads && cols % be != 0) return false;  // a row is not a whole number of blocks
  f.read_tensor_bytes(*l.gguf, uint64_t(first / be) * uint64_t(bb), uint64_t(n / be) * uint64_t(bb), dst);
  if (l.permute_heads)
    unpermute_qk_row_bytes(static_cast<uint8_t*>(dst), l.shape[0], size_t(cols / be) * size_t(bb),
                           l.permute_heads);
  return true;
}

}  // namespace rp
