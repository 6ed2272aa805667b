#include "model/checkpoint.hpp"
#include "model/error_text.hpp"


#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/config.hpp"
#include "model/gguf.hpp"
#include "model/gpt_oss_hf.hpp"
#include "model/safetensors.hpp"
#include "model/tokenizer_export.hpp"
#include "base/atomic_file.hpp"

namespace rp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {


[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(one_line(fmt::format("{}: {}", where, what)));
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json read_json(const std::string& path) {
  try {
    return json::parse(read_text(path));
  } catch (const json::exception& e) {
    fail(path, fmt::format("invalid JSON: {}", e.what()));
  }
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

/// Checks m.tensors against the layout of m.config: all present, right shapes, a tied
/// lm_head equal to the embedding (then dropped), nothing unexpected.
void check_tensors(LoadedModel& m, const ModelLayout& layout, const std::string& where) {
  std::set<std::string> expected;
  for (const auto& g : layout.groups)
    for (const auto& t : g.tensors) {
      expected.insert(t.name);
      auto it = m.tensors.find(t.name);
      if (it == m.tensors.end())
        fail(where, fmt::format("missing tensor '{}' (expected shape [{}])", t.name, fmt::join(t.shape, ", ")));
      if (it->second.shape != t.shape)
        fail(where, fmt::format("tensor '{}': expected shape [{}], got [{}]", t.name,
                                fmt::join(t.shape, ", "), fmt::join(it->second.shape, ", ")));
      if (int64_t(it->second.data.size()) != t.numel())
        fail(where, fmt::format("tensor '{}': holds {} values, expected {}", t.name, it->second.data.size(), t.numel()));
    }
  if (m.config.tie_word_embeddings) {
    auto lm = m.tensors.find("lm_head.weight");
    if (lm != m.tensors.end()) {
      const auto& emb = m.tensors.at("model.embed_tokens.weight");
      if (lm->second.shape != emb.shape ||
          std::memcmp(lm->second.data.data(), emb.data.data(), emb.data.size() * sizeof(float)) != 0)
        fail(where, "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' but "
                    "tie_word_embeddings is true");
      m.tensors.erase(lm);
    }
  }
  for (auto it = m.tensors.begin(); it != m.tensors.end();) {
    if (expected.count(it->first)) {
      ++it;
    } else if (ends_with(it->first, "rotary_emb.inv_freq")) {
      it = m.tensors.erase(it);
    } else {
      fail(where, fmt::format("unexpected tensor '{}' (not part of a {} model with this config)",
                              it->first, m.config.architecture));
    }
  }
}

/// A stacked expert tensor of a sparse layer (row-major [num_experts, rows, cols], see
/// gguf_expert_stack_name) as the num_experts Hugging Face matrices prefix<e>suffix [rows, cols];
/// their shapes are checked against the layout by check_tensors.
void split_expert_stack(const GgufFile& f, const GgufTensorInfo& t, LoadedModel& m, const std::string& prefix,
                        const std::string& suffix) {
  const std::vector<int64_t> shape = t.shape();
  const int64_t E = m.config.num_experts;
  if (E <= 0 || shape.size() != 3 || shape[0] != E)
    fail(f.path(), fmt::format("tensor '{}': expected 3-D [num_experts = {}, rows, cols], got [{}]", t.name, E,
                               fmt::join(shape, ", ")));
  const std::vector<float> all = f.dequantize(t);
  const size_t per = size_t(shape[1] * shape[2]);
  for (int64_t e = 0; e < E; ++e) {
    const std::string hf = prefix + std::to_string(e) + suffix;
    if (m.tensors.count(hf)) fail(f.path(), fmt::format("tensor '{}' appears twice", t.name));
    HostTensor h;
    h.shape = {shape[1], shape[2]};
    h.data.assign(all.begin() + ptrdiff_t(size_t(e) * per), all.begin() + ptrdiff_t(size_t(e + 1) * per));
    m.tensors.emplace(hf, std::move(h));
  }
}

LoadedModel load_gguf(const std::string& path) {
  GgufFile f(path);
  LoadedModel m;
  m.source = path;
  m.config = config_from_gguf(f);  // checks the sizes against the file's size
  check_host_memory_to_load(m.config, path);
  const ModelLayout layout = make_layout(m.config);
  for (const auto& t : f.tensors()) {
    if (t.name == "rope_freqs.weight") continue;  // folded into config.rope_scaling
    std::string prefix, suffix;
    if (gguf_expert_stack_name(t.name, prefix, suffix)) {
      split_expert_stack(f, t, m, prefix, suffix);
      continue;
    }
    const std::string hf = gguf_to_hf_name(t.name);
    if (hf.empty()) fail(path, fmt::format("unexpected tensor '{}' (no Hugging Face equivalent)", t.name));
    if (m.tensors.count(hf)) fail(path, fmt::format("tensor '{}' appears twice", t.name));
    HostTensor h;
    h.shape = t.shape();
    h.data = f.dequantize(t);
    m.tensors.emplace(hf, std::move(h));
  }
  check_tensors(m, layout, path);
  if (m.config.architecture == "llama") {
    // Undo convert_hf_to_gguf.py's LlamaModel.permute() of q_proj / k_proj rows.
    for (int64_t l = 0; l < m.config.num_hidden_layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.self_attn.", l);
      for (auto [name, heads] : {std::pair{"q_proj.weight", m.config.num_attention_heads},
                                 {"k_proj.weight", m.config.num_key_value_heads}}) {
        HostTensor& w = m.tensors.at(p + name);
        unpermute_qk_rows(w.data.data(), w.shape[0], w.shape[1], heads);
      }
    }
  }
  if (f.has("tokenizer.ggml.model") && f.get("tokenizer.ggml.model") == "gpt2")
    m.tokenizer_json = tokenizer_json_from_gguf(f);
  if (f.has("tokenizer.chat_template") && f.get("tokenizer.chat_template").is_string())
    m.chat_template = f.get_string("tokenizer.chat_template");
  return m;
}

std::string chat_template_of(const fs::path& dir) {
  const fs::path tc = dir / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(tc, ec)) {
    json j = read_json(tc.string());
    if (j.is_object() && j.contains("chat_template")) {
      const json& t = j["chat_template"];
      if (t.is_string()) return t.get<std::string>();
      if (t.is_array()) {  // [{"name": ..., "template": ...}]: "default", else the first
        for (const auto& e : t)
          if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
            return e["template"].get<std::string>();
        if (!t.empty() && t[0].is_object() && t[0].contains("template") && t[0]["template"].is_string())
          return t[0]["template"].get<std::string>();
      }
      if (!t.is_null()) fail(tc.string(), "key 'chat_template': expected a string or a list of templates");
    }
  }
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja, ec)) return read_text(jinja.string());
  return "";
}

LoadedModel load_hf_dir(const std::string& path) {
  const fs::path dir(path);
  LoadedModel m;
  m.source = path;
  m.config = load_config_file((dir / "config.json").string());
  std::error_code ec;
  {  // the config's sizes against the weight files, before anything is allocated from them
    uint64_t bytes = 0;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".safetensors") bytes += e.file_size(ec);
    if (bytes > 0)  // none: load_safetensors names the missing file
      check_weights_fit_files(m.config, bytes, m.config.gpt_oss() ? 0.5 : 2.0,  // MXFP4 experts: 4.25 bits
                              (dir / "config.json").string(), "num_hidden_layers");
    check_host_memory_to_load(m.config, (dir / "config.json").string());
  }
  std::string where = (dir / "model.safetensors.index.json").string();
  if (!fs::exists(where, ec)) where = (dir / "model.safetensors").string();
  m.tensors = load_safetensors(path);
  if (m.config.gpt_oss()) gpt_oss_experts_from_hf(m, where);  // stacked (or MXFP4) -> per expert
  check_tensors(m, make_layout(m.config), where);
  const fs::path tj = dir / "tokenizer.json";
  if (fs::exists(tj, ec)) m.tokenizer_json = read_json(tj.string());
  m.chat_template = chat_template_of(dir);
  return m;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream o(p, std::ios::binary);
  if (!o) fail(p.string(), fmt::format("cannot create: {}", std::strerror(errno)));
  o.write(s.data(), std::streamsize(s.size()));
  o.close();
  if (!o) fail(p.string(), "write failed");
}

std::string dump_json(const json& j, const fs::path& p) {
  try {
    return j.dump(2) + "\n";
  } catch (const json::exception& e) {
    fail(p.string(), fmt::format("cannot serialise JSON: {}", e.what()));
  }
}

}  // namespace

LoadedModel load_model(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    std::error_code cwd_ec;
    const auto cwd = fs::current_path(cwd_ec);
    fail(path, fs::path(path).is_relative() && !cwd_ec
                   ? fmt::format("no such file or directory (relative to the working directory {})", cwd.string())
                   : std::string("no such file or directory"));
  }
  if (fs::is_directory(st)) return load_hf_dir(path);
  return load_gguf(path);
}

void fill_groups(const LoadedModel& m, const ModelLayout& layout,
                 std::vector<std::vector<float>>& group_data) {
  group_data.resize(layout.groups.size());
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const auto& grp = layout.groups[g];
    group_data[g].assign(size_t(grp.numel), 0.0f);
    for (const auto& t : grp.tensors) {
      auto it = m.tensors.find(t.name);
      if (it == m.tensors.end()) fail(m.source, fmt::format("missing tensor '{}'", t.name));
      if (int64_t(it->second.data.size()) != t.numel())
        fail(m.source, fmt::format("tensor '{}': {} values, the layout expects {}", t.name,
                                   it->second.data.size(), t.numel()));
      std::memcpy(group_data[g].data() + t.offset, it->second.data.data(), size_t(t.numel()) * sizeof(float));
    }
  }
}

void save_hf_checkpoint(const std::string& dir_in, const ModelLayout& layout,
                        const std::vector<const float*>& group_data,
                        const nlohmann::json& tokenizer_json, const std::string& chat_template,
                        DType dtype, const std::function<void(const std::string& tmp_dir)>& extra) {
  if (group_data.size() != layout.groups.size())
    throw std::invalid_argument(fmt::format("save_hf_checkpoint: {} group buffers for {} groups",
                                            group_data.size(), layout.groups.size()));
  if (dtype == DType::i32) throw std::invalid_argument("save_hf_checkpoint: dtype i32 is not supported");
  replace_folder(dir_in, [&](const std::string& tmp_dir) {
    const fs::path tmp(tmp_dir);
    const ModelConfig& c = layout.config;
    json cfg = config_to_json(c);
    const char* tname = dtype == DType::f32 ? "float32" : dtype == DType::bf16 ? "bfloat16" : "float16";
    cfg["torch_dtype"] = tname;
    cfg["dtype"] = tname;
    write_text(tmp / "config.json", dump_json(cfg, tmp / "config.json"));
    json gen = {{"_from_model_config", true}};
    if (c.bos_token_id >= 0) gen["bos_token_id"] = c.bos_token_id;
    if (c.eos_token_id >= 0) gen["eos_token_id"] = c.eos_token_id;
    if (c.pad_token_id >= 0) gen["pad_token_id"] = c.pad_token_id;
    write_text(tmp / "generation_config.json", dump_json(gen, tmp / "generation_config.json"));

    std::vector<TensorRef> refs;
    GptOssHfExperts experts;  // GPT-OSS: the experts in HF's stacked, interleaved form
    if (c.gpt_oss()) experts = gpt_oss_experts_to_hf(layout, group_data);
    for (size_t g = 0; g < layout.groups.size(); ++g)
      for (const auto& t : layout.groups[g].tensors)
        if (!c.gpt_oss() || !is_gpt_oss_expert_name(t.name))
          refs.push_back({t.name, t.shape, group_data[g] ? group_data[g] + t.offset : nullptr});
    refs.insert(refs.end(), experts.tensors.begin(), experts.tensors.end());
    save_safetensors_sharded(tmp.string(), refs, dtype, uint64_t(5) * 1000 * 1000 * 1000);

    if (!tokenizer_json.is_null())
      write_text(tmp / "tokenizer.json", dump_json(tokenizer_json, tmp / "tokenizer.json"));
    if (!tokenizer_json.is_null() || !chat_template.empty()) {
      json tc = tokenizer_config_json(tokenizer_json, c.bos_token_id, c.eos_token_id, c.pad_token_id,
                                      chat_template, c.max_position_embeddings);
      write_text(tmp / "tokenizer_config.json", dump_json(tc, tmp / "tokenizer_config.json"));
    }
    if (extra) extra(tmp.string());
  });
}

void convert_gguf_to_hf(const std::string& gguf, const std::string& out_dir, DType dtype) {
  LoadedModel m = load_model(gguf);
  const ModelLayout layout = make_layout(m.config);
  std::vector<std::vector<float>> groups;
  fill_groups(m, layout, groups);
  m.tensors.clear();  // halve peak memory before writing
  std::vector<const float*> ptrs;
  for (const auto& g : groups) ptrs.push_back(g.data());
  save_hf_checkpoint(out_dir, layout, ptrs, m.tokenizer_json, m.chat_template, dtype);
}

}  // namespace rp
