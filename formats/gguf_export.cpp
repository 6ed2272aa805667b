// roundpipe export-gguf: a Hugging Face folder as a GGUF file (formats/gguf_export.hpp).
#include "formats/gguf_export.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/atomic_file.hpp"
#include "base/host_resources.hpp"
#include "base/output_folder.hpp"
#include "formats/gguf.hpp"
#include "formats/tokenizer_export.hpp"
#include "kernels/dtype.hpp"
#include "kernels/weight_format.hpp"
#include "model/error_text.hpp"
#include "roundpipe/adapter.hpp"
#include "roundpipe/model_source.hpp"

namespace rp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr uint64_t kAlignment = 32;  // GGUF's default general.alignment
constexpr const char* kWrittenBy = "roundpipe export-gguf";

// GGUF metadata value types
enum : uint32_t { kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7, kString = 8, kArray = 9 };

/// The bytes of a GGUF header: metadata key/values and tensor infos, little-endian.
class GgufHeader {
 public:
  template <class T>
  void put(T v) {
    const size_t at = b_.size();
    b_.resize(at + sizeof(T));
    std::memcpy(b_.data() + at, &v, sizeof(T));
  }
  void put_str(const std::string& s) {
    put<uint64_t>(s.size());
    b_.insert(b_.end(), s.begin(), s.end());
  }
  void key(const std::string& k, uint32_t type) {
    put_str(k);
    put<uint32_t>(type);
    ++n_kv_;
  }
  void u32(const std::string& k, int64_t v) {
    if (v < 0 || v > int64_t(UINT32_MAX))
      throw std::invalid_argument(fmt::format("metadata '{}': {} is out of range", k, v));
    key(k, kU32), put<uint32_t>(uint32_t(v));
  }
  void f32(const std::string& k, double v) { key(k, kF32), put<float>(float(v)); }
  void boolean(const std::string& k, bool v) { key(k, kBool), put<uint8_t>(v ? 1 : 0); }
  void str(const std::string& k, const std::string& v) { key(k, kString), put_str(v); }
  void str_array(const std::string& k, const std::vector<std::string>& v) {
    key(k, kArray), put<uint32_t>(kString), put<uint64_t>(v.size());
    for (const auto& s : v) put_str(s);
  }
  void i32_array(const std::string& k, const std::vector<int32_t>& v) {
    key(k, kArray), put<uint32_t>(kI32), put<uint64_t>(v.size());
    for (int32_t x : v) put<int32_t>(x);
  }
  const std::vector<uint8_t>& bytes() const { return b_; }
  uint64_t n_kv() const { return n_kv_; }

 private:
  std::vector<uint8_t> b_;
  uint64_t n_kv_ = 0;
};

/// One tensor to write: its GGUF name, shape (row-major), type and fp32 source.
struct OutTensor {
  std::string name;
  std::vector<int64_t> shape;
  GgmlType type = GgmlType::F32;
  std::string hf;             ///< the model's tensor it is read from when written ("": `own`)
  int64_t permute_heads = 0;  ///< LLaMA q/k: convert_hf_to_gguf.py's row permutation over that many heads
  std::vector<float> own;     ///< the values when computed here (rope_freqs)
  uint64_t offset = 0, nbytes = 0;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

WeightFormat format_of(GgmlType t) {
  switch (t) {
    case GgmlType::F16: return WeightFormat::f16;
    case GgmlType::BF16: return WeightFormat::bf16;
    case GgmlType::Q8_0: return WeightFormat::q8_0;
    default: return WeightFormat::f32;
  }
}

/// llama.cpp's ftype of a file whose matrices are `t` (LLAMA_FTYPE_MOSTLY_*).
int64_t file_type_of(GgufExportType t) {
  return t == GgufExportType::f16 ? 1 : t == GgufExportType::q8_0 ? 7 : 32;
}

/// convert_hf_to_gguf.py's permute(): GGUF row h*hd + 2i + j = Hugging Face row h*hd + j*hd/2 + i.
std::vector<float> permute_qk_rows(const float* w, int64_t rows, int64_t cols, int64_t n_head) {
  if (n_head <= 0 || rows % (2 * n_head) != 0)
    throw std::invalid_argument(
        fmt::format("q/k permutation: {} rows is not a multiple of 2*n_head ({})", rows, 2 * n_head));
  const int64_t hd = rows / n_head, half = hd / 2;
  std::vector<float> out(size_t(rows * cols));
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(out.data() + size_t((h * hd + 2 * i + j) * cols),
                    w + size_t((h * hd + j * half + i) * cols), size_t(cols) * sizeof(float));
  return out;
}

/// llama.cpp's rope_freqs of llama3 RoPE scaling (convert_hf_to_gguf.py, LlamaModel).
std::vector<float> llama3_rope_factors(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  const double pi = 3.14159265358979323846;
  const double old_ctx = double(rs.original_max_position_embeddings);
  const double low_wl = old_ctx / rs.low_freq_factor, high_wl = old_ctx / rs.high_freq_factor;
  std::vector<float> out;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.head_dim));
    const double wl = 2 * pi / freq;
    double f = 1.0;
    if (wl > low_wl) {
      f = rs.factor;
    } else if (wl >= high_wl) {
      const double smooth = (old_ctx / wl - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      f = 1.0 / ((1 - smooth) / rs.factor + smooth);
    }
    out.push_back(float(f));
  }
  return out;
}

/// general.architecture of `c`, or a one-line refusal naming what is not exported.
std::string gguf_architecture(const ModelConfig& c, const std::string& in) {
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument(
        one_line(fmt::format("{}: {}; export-gguf writes dense llama, qwen2 and qwen3 models", in, why)));
  };
  if (c.num_experts > 0)
    refuse(fmt::format("a mixture-of-experts model ({}) is not exported", c.architecture));
  if (c.architecture != "llama" && c.architecture != "qwen2" && c.architecture != "qwen3")
    refuse(fmt::format("model_type '{}' is not exported", c.architecture));
  if (c.attention_bias || c.sliding_window > 0 || c.attention_sinks)
    refuse("attention biases / sliding windows / sinks");
  if (c.qk_norm != (c.architecture == "qwen3")) refuse("q/k norms only in qwen3");
  if (c.qkv_bias != (c.architecture == "qwen2")) refuse("q/k/v biases only in qwen2");
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "llama3" && (c.architecture != "llama" || rs.low_freq_factor != 1.0 ||
                              rs.high_freq_factor != 4.0 || rs.original_max_position_embeddings != 8192))
    refuse(
        "llama3 RoPE scaling other than LLaMA 3.1's (low/high frequency factors 1/4, original context 8192)");
  if (rs.type == "longrope")  // llama.cpp keeps them as rope_factors_long / rope_factors_short tensors
    refuse("LongRoPE scaling (its short and long factor tensors are not written)");
  if (rs.type != "default" && rs.type != "linear" && rs.type != "yarn" && rs.type != "llama3")
    refuse(fmt::format("rope_scaling type '{}'", rs.type));
  return c.architecture;
}

void model_metadata(GgufHeader& h, const ModelConfig& c, const std::string& arch, const std::string& name,
                    GgufExportType type) {
  const std::string p = arch + ".";
  h.str("general.architecture", arch);
  h.str("general.type", "model");
  h.str("general.name", name);
  h.u32("general.file_type", file_type_of(type));
  h.u32("general.quantization_version", 2);
  h.str("roundpipe.written_by", kWrittenBy);
  h.u32(p + "context_length", c.max_position_embeddings);
  h.u32(p + "embedding_length", c.hidden_size);
  h.u32(p + "block_count", c.num_hidden_layers);
  h.u32(p + "feed_forward_length", c.intermediate_size);
  h.u32(p + "attention.head_count", c.num_attention_heads);
  h.u32(p + "attention.head_count_kv", c.num_key_value_heads);
  h.u32(p + "attention.key_length", c.head_dim);
  h.u32(p + "attention.value_length", c.head_dim);
  h.f32(p + "attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  h.f32(p + "rope.freq_base", c.rope_theta);
  h.u32(p + "rope.dimension_count", c.rotary_dim());
  h.u32(p + "vocab_size", c.vocab_size);
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == "linear" || rs.type == "yarn") {
    h.str(p + "rope.scaling.type", rs.type);
    h.f32(p + "rope.scaling.factor", rs.factor);
    if (rs.original_max_position_embeddings > 0)
      h.u32(p + "rope.scaling.original_context_length", rs.original_max_position_embeddings);
    if (rs.type == "yarn") {
      h.f32(p + "rope.scaling.yarn_beta_fast", rs.beta_fast);
      h.f32(p + "rope.scaling.yarn_beta_slow", rs.beta_slow);
      if (rs.attention_factor > 0) h.f32(p + "rope.scaling.yarn_attn_factor", rs.attention_factor);
    }
  }
}

/// tokenizer.ggml.* from a byte-level BPE tokenizer.json (see the header).
void tokenizer_metadata(GgufHeader& h, const LoadedModel& m, const std::string& in) {
  const ModelConfig& c = m.config;
  const json& tj = m.tokenizer_json;
  auto refuse = [&](const std::string& what) {
    throw std::invalid_argument(one_line(fmt::format("{}/tokenizer.json: {}", in, what)));
  };
  if (!tj.is_object()) refuse("missing (export-gguf needs the model's tokenizer)");
  const json& model = tj.value("model", json::object());
  if (!model.is_object() || model.value("type", "") != "BPE" || !model.contains("vocab") ||
      !model["vocab"].is_object())
    refuse("key 'model': expected a byte-level BPE model with a vocab");
  const std::string pre = gguf_pre_of_tokenizer_json(tj);
  if (pre.empty())
    refuse(
        "key 'pre_tokenizer': expected the byte-level pre-tokenizer of GPT-2, SmolLM2, Qwen2/Qwen3 or LLaMA "
        "3");
  std::vector<std::string> tokens(size_t(c.vocab_size));
  std::vector<int32_t> types(size_t(c.vocab_size), 5);  // unused until a token names the id
  auto place = [&](int64_t id, const std::string& text, int32_t type) {
    if (id < 0 || id >= c.vocab_size)
      refuse(fmt::format("token '{}' has id {}, outside the model's vocab_size {}", one_line(text), id,
                         c.vocab_size));
    tokens[size_t(id)] = text;
    types[size_t(id)] = type;
  };
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it->is_number_integer())
      refuse(fmt::format("model.vocab['{}']: expected an integer id", one_line(it.key())));
    const int64_t id = it->get<int64_t>();
    // convert_hf_to_gguf.py's filler of ids the vocabulary lacks (a GGUF read back keeps them)
    place(id, it.key(), it.key() == fmt::format("[PAD{}]", id) ? 5 : 1);
  }
  for (const json& a : tj.value("added_tokens", json::array())) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string())
      refuse("key 'added_tokens': expected objects with an integer id and a content string");
    place(a["id"].get<int64_t>(), a["content"].get<std::string>(), a.value("special", false) ? 3 : 4);
  }
  for (int64_t id = 0; id < c.vocab_size; ++id)
    if (types[size_t(id)] == 5) tokens[size_t(id)] = fmt::format("[PAD{}]", id);  // as convert_hf_to_gguf.py
  std::vector<std::string> merges;
  for (const json& mg : model.value("merges", json::array())) {
    if (mg.is_string()) merges.push_back(mg.get<std::string>());
    else if (mg.is_array() && mg.size() == 2 && mg[0].is_string() && mg[1].is_string())
      merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
    else refuse("key 'model.merges': expected \"left right\" strings or [left, right] pairs");
  }
  h.str("tokenizer.ggml.model", "gpt2");
  h.str("tokenizer.ggml.pre", pre);
  h.str_array("tokenizer.ggml.tokens", tokens);
  h.i32_array("tokenizer.ggml.token_type", types);
  h.str_array("tokenizer.ggml.merges", merges);
  if (c.bos_token_id >= 0) h.u32("tokenizer.ggml.bos_token_id", c.bos_token_id);
  if (c.eos_token_id >= 0) h.u32("tokenizer.ggml.eos_token_id", c.eos_token_id);
  if (c.pad_token_id >= 0) h.u32("tokenizer.ggml.padding_token_id", c.pad_token_id);
  const json& post = tj.value("post_processor", json(nullptr));
  bool add_bos = false;  // the post-processor puts the BOS token first
  if (post.is_object() && post.value("type", "") == "TemplateProcessing" && post.contains("single") &&
      post["single"].is_array() && !post["single"].empty() && post["single"][0].contains("SpecialToken"))
    add_bos = c.bos_token_id >= 0 &&
              post["single"][0]["SpecialToken"].value("id", "") == tokens[size_t(c.bos_token_id)];
  h.boolean("tokenizer.ggml.add_bos_token", add_bos);
  if (!m.chat_template.empty()) h.str("tokenizer.chat_template", m.chat_template);
}

/// The tensors of `src` under their GGUF names, in llama.cpp's order (their shapes; the values
/// are read when written).
std::vector<OutTensor> plan_tensors(const ModelSource& src, const std::string& arch, GgufExportType type) {
  const ModelConfig& c = src.config();
  const GgmlType matrix = type == GgufExportType::f16    ? GgmlType::F16
                          : type == GgufExportType::bf16 ? GgmlType::BF16
                                                         : GgmlType::Q8_0;
  std::vector<OutTensor> out;
  auto add = [&](const std::string& hf) {
    OutTensor t;
    t.name = hf_to_gguf_name(hf, arch);
    t.shape = src.shape(hf);  // throws naming the source and the tensor when it has none
    t.hf = hf;
    t.type = t.shape.size() == 2 ? matrix : GgmlType::F32;
    // llama.cpp falls back to F16 for rows that are not whole Q8_0 blocks
    if (t.type == GgmlType::Q8_0 && t.shape[1] % 32 != 0) t.type = GgmlType::F16;
    out.push_back(std::move(t));
  };
  add("model.embed_tokens.weight");
  if (c.rope_scaling.type == "llama3") {
    OutTensor t;
    t.name = "rope_freqs.weight";
    t.own = llama3_rope_factors(c);
    t.shape = {int64_t(t.own.size())};
    out.push_back(std::move(t));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight");
    for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
      add(p + "self_attn." + proj + ".weight");
      if (arch == "llama" && std::string(proj) != "v_proj")  // convert_hf_to_gguf.py's permute()
        out.back().permute_heads =
            std::string(proj) == "q_proj" ? c.num_attention_heads : c.num_key_value_heads;
      if (c.qkv_bias) add(p + "self_attn." + proj + ".bias");
    }
    add(p + "self_attn.o_proj.weight");
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight");
      add(p + "self_attn.k_norm.weight");
    }
    add(p + "post_attention_layernorm.weight");
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) add(p + "mlp." + proj + ".weight");
  }
  add("model.norm.weight");
  if (!c.tie_word_embeddings) add("lm_head.weight");
  uint64_t off = 0;
  for (OutTensor& t : out) {
    if (t.name.empty()) throw std::logic_error("export-gguf: a tensor without a GGUF name");
    t.offset = off;
    t.nbytes = weight_format_bytes(format_of(t.type), t.numel());
    off += (t.nbytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  return out;
}

/// Refuses values `t`'s GGML type would write as infinity: beyond f16's range (F16), bf16's
/// (BF16), or, for Q8_0, beyond what a block's f16 scale (the block's largest |x| / 127) holds.
void check_range(const std::vector<float>& values, const OutTensor& t, const std::string& source) {
  Overflows o;
  const char* range = "";
  const char* instead = "";
  if (t.type == GgmlType::F16 || t.type == GgmlType::BF16) {
    const DType d = t.type == GgmlType::F16 ? DType::f16 : DType::bf16;
    o = narrowing_overflows(values.data(), t.numel(), d);
    range = t.type == GgmlType::F16 ? "f16's range" : "bf16's range";
    instead =
        t.type == GgmlType::F16 ? "export with --type bf16 instead" : "no GGUF type written here holds them";
  } else if (t.type == GgmlType::Q8_0) {
    for (size_t i = 0; i < values.size(); ++i)
      if (std::isfinite(values[i]) && std::fabs(values[i]) / 127.0f >= 65520.0f && o.count++ == 0)
        o.first = int64_t(i);
    range = "q8_0's range (a block's f16 scale: |x| / 127 up to 65504)";
    instead = "export with --type bf16 instead";
  }
  if (o.count)
    throw std::runtime_error(one_line(fmt::format(
        "{}: tensor '{}': {} value{} beyond {} (the first, {}, at element {}) would be written as "
        "infinity; {}",
        source, t.hf, o.count, o.count == 1 ? " is" : "s are", range, values[size_t(o.first)], o.first,
        instead)));
}

void pad(std::ostream& os, uint64_t written) {
  static const char zeros[kAlignment] = {};
  if (const uint64_t r = written % kAlignment) os.write(zeros, std::streamsize(kAlignment - r));
}

/// Refuses an output the export would replace at a loss (see export_gguf).
void check_output(const std::string& out, const std::vector<std::string>& inputs, bool force) {
  auto refuse = [&](const std::string& why) {
    throw std::invalid_argument(one_line(fmt::format("{}: {}", out, why)));
  };
  if (const std::string in = overlapping_input(out, inputs); !in.empty())
    refuse(fmt::format("is or lies inside the input {}; write the GGUF file elsewhere", in));
  std::error_code ec;
  const auto st = fs::symlink_status(out, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_regular_file(st)) refuse("exists and is not a regular file; not replaced");
  if (!force) refuse("exists; pass --force to replace a GGUF file that export-gguf wrote");
  bool ours = false;
  try {
    const GgufFile f(out);
    ours = f.has("roundpipe.written_by") && f.get("roundpipe.written_by") == kWrittenBy;
  } catch (const std::exception&) {
    ours = false;
  }
  if (!ours)
    refuse(fmt::format("exists and was not written by {}; --force replaces only such files", kWrittenBy));
}

}  // namespace

GgufExportType parse_gguf_export_type(const std::string& s) {
  if (s == "f16") return GgufExportType::f16;
  if (s == "bf16") return GgufExportType::bf16;
  if (s == "q8_0") return GgufExportType::q8_0;
  throw std::invalid_argument(one_line(fmt::format("--type: expected f16, bf16 or q8_0, got '{}'", s)));
}

int64_t export_gguf(const std::string& in_dir, const std::string& out, GgufExportType type, bool force,
                    const std::string& base) {
  std::error_code ec;
  if (!fs::is_directory(in_dir, ec))
    throw std::invalid_argument(
        one_line(fmt::format("{}: not a folder (expected a Hugging Face model folder)", in_dir)));
  check_output(out, {in_dir, base.empty() ? adapter_base_path(in_dir) : base}, force);
  // a plain folder is read one tensor at a time as it is written; an adapter is merged first
  const ModelSource src = open_model_or_adapter(in_dir, base);
  const LoadedModel& m = src.header();
  const std::string arch = gguf_architecture(m.config, in_dir);
  GgufHeader kv;
  fs::path named = fs::path(in_dir).lexically_normal();
  if (!named.has_filename()) named = named.parent_path();  // "runs/x/final/"
  model_metadata(kv, m.config, arch, named.filename().string(), type);
  tokenizer_metadata(kv, m, in_dir);
  const std::vector<OutTensor> tensors = plan_tensors(src, arch, type);
  GgufHeader info;
  for (const OutTensor& t : tensors) {
    info.put_str(t.name);
    info.put<uint32_t>(uint32_t(t.shape.size()));
    for (auto d = t.shape.rbegin(); d != t.shape.rend(); ++d)
      info.put<uint64_t>(uint64_t(*d));  // ne[0] innermost
    info.put<uint32_t>(uint32_t(t.type));
    info.put<uint64_t>(t.offset);
  }
  uint64_t need = uint64_t(1) << 20;  // the header's fixed part and padding, with room to spare
  need += kv.bytes().size() + info.bytes().size();
  if (!tensors.empty()) need += tensors.back().offset + tensors.back().nbytes;
  require_free_disk(out, need, "the GGUF file",
                    "free some space or write it to another disk (nothing was written)");
  write_file_atomically(out, [&](std::ostream& os) {
    GgufHeader head;
    head.put<uint32_t>(0x46554747);  // "GGUF"
    head.put<uint32_t>(3);
    head.put<uint64_t>(tensors.size());
    head.put<uint64_t>(kv.n_kv());
    auto write = [&](const std::vector<uint8_t>& b) {
      os.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    };
    write(head.bytes());
    write(kv.bytes());
    write(info.bytes());
    pad(os, head.bytes().size() + kv.bytes().size() + info.bytes().size());
    std::vector<uint8_t> buf;
    for (const OutTensor& t : tensors) {
      std::vector<float> values = t.hf.empty() ? t.own : src.read_f32(t.hf).data;
      if (t.permute_heads) values = permute_qk_rows(values.data(), t.shape[0], t.shape[1], t.permute_heads);
      check_range(values, t, src.header().source);
      buf.resize(t.nbytes);
      quantize_weights(format_of(t.type), values.data(), buf.data(), t.numel());
      write(buf);
      pad(os, t.nbytes);
    }
  });
  return int64_t(tensors.size());
}

}  // namespace rp
