// rp::ModelSource (roundpipe/model_source.hpp): a model's tensors read one at a time from its
// mapped files, and load_model (roundpipe/checkpoint.hpp) as "open, then read every tensor".
#include "roundpipe/model_source.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/input_file.hpp"
#include "base/json_text.hpp"
#include "formats/format_fail.hpp"
#include "formats/gguf.hpp"
#include "formats/model_source_impl.hpp"
#include "formats/parallel_quantize.hpp"
#include "formats/phi3_hf.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "model/error_text.hpp"
#include "model/layout.hpp"

namespace rp {

namespace fs = std::filesystem;
using nlohmann::json;
using Loc = ModelSource::Impl::Loc;

namespace {

std::string read_text(const std::string& path) {
  try {
    return read_input_file(path, "a text file");
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(one_line(e.what()));  // as the folder's other read errors
  }
}

json read_json(const std::string& path) {
  try {
    return parse_json_text(read_json_file(path), path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(one_line(e.what()));  // as the folder's other read errors
  }
}

HostTensor read_loc(const ModelSource::Impl& s, const Loc& l) {
  if (l.mem) return *l.mem;
  if (l.oss) {
    HostTensor t;
    t.shape = l.shape;
    t.data = gpt_oss_read_f32(*l.oss, l.shape);
    return t;
  }
  if (l.st) {
    return l.st->read_f32(*l.entry);
  }
  HostTensor t;
  t.shape = l.shape;
  t.data = gguf_read_f32(*s.gguf, l);
  return t;
}

/// True when tensors a and b hold the same fp32 values (compared bit for bit, as load_model
/// always did). Same safetensors dtype: the stored bytes (the conversions to fp32 are
/// one-to-one), else both read as fp32.
bool same_values(const ModelSource::Impl& s, const Loc& a, const Loc& b) {
  if (a.shape != b.shape) return false;
  if (a.st && b.st && a.entry->dtype == b.entry->dtype) {
    const uint64_t n = a.entry->end - a.entry->begin, piece = uint64_t(8) << 20;
    std::vector<uint8_t> x(size_t(std::min(n, piece))), y(x.size());
    for (uint64_t at = 0; at < n; at += piece) {
      const uint64_t k = std::min(piece, n - at);
      a.st->read_bytes(*a.entry, at, k, x.data());
      b.st->read_bytes(*b.entry, at, k, y.data());
      if (std::memcmp(x.data(), y.data(), size_t(k)) != 0) return false;
    }
    return true;
  }
  const HostTensor x = read_loc(s, a), y = read_loc(s, b);
  return std::memcmp(x.data.data(), y.data.data(), x.data.size() * sizeof(float)) == 0;
}

/// Checks s.tensors against make_layout(config): all present, right shapes, a tied lm_head
/// equal to the embedding (then dropped), rotary inv_freq buffers dropped, nothing else.
void check_tensors(ModelSource::Impl& s, const std::string& where) {
  const ModelLayout layout = make_layout(s.header.config);
  // a GGUF's tensors are named as stored too
  const std::string arch = s.gguf ? s.gguf->get_string("general.architecture") : "";
  auto stored_as = [&](const std::string& hf, const Loc* l) -> std::string {
    if (!s.gguf) return "";
    const std::string g = l && l->gguf ? l->gguf->name : hf_to_gguf_name(hf, arch);
    if (g.empty()) return "";
    if (!l || !l->gguf) return fmt::format(" (GGUF tensor '{}')", g);
    return fmt::format(" (GGUF tensor '{}' [{}]{})", g, fmt::join(l->gguf->shape(), ", "),
                       l->expert >= 0 ? fmt::format(", expert {}", l->expert) : "");
  };
  std::set<std::string> expected;
  for (const auto& g : layout.groups)
    for (const auto& t : g.tensors) {
      expected.insert(t.name);
      auto it = s.tensors.find(t.name);
      if (it == s.tensors.end())
        format_fail(where, fmt::format("missing tensor '{}' (expected shape [{}]){}", t.name,
                                       fmt::join(t.shape, ", "), stored_as(t.name, nullptr)));
      if (it->second.shape != t.shape)
        format_fail(where, fmt::format("tensor '{}': expected shape [{}], got [{}]{}", t.name,
                                       fmt::join(t.shape, ", "), fmt::join(it->second.shape, ", "),
                                       stored_as(t.name, &it->second)));
    }
  if (s.header.config.tie_word_embeddings) {
    auto lm = s.tensors.find("lm_head.weight");
    if (lm != s.tensors.end()) {
      if (!same_values(s, lm->second, s.tensors.at("model.embed_tokens.weight")))
        format_fail(where,
                    "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight' but "
                    "tie_word_embeddings is true");
      s.tensors.erase(lm);
    }
  }
  for (auto it = s.tensors.begin(); it != s.tensors.end();) {
    if (expected.count(it->first)) {
      ++it;
    } else if (it->first.ends_with("rotary_emb.inv_freq")) {
      it = s.tensors.erase(it);
    } else {
      format_fail(where,
                  fmt::format("unexpected tensor '{}' (not part of a {} model with this config){}", it->first,
                              s.header.config.architecture, stored_as(it->first, &it->second)));
    }
  }
}

/// A model folder's chat template, the name its errors give the file it came from, and why it
/// cannot be used when the file names templates but none as the default.
struct FolderTemplate {
  std::string text, source, error;
};

/// The "default" entry of a chat_template list [{"name": ..., "template": ...}] of file `file`, as
/// transformers takes it (get_chat_template without a template name or tools). A list without
/// one (whatever its length) leaves the model without a usable template: `error` says so, naming
/// the templates it has (sorted, as transformers does), and chat formatting refuses with it
/// (transformers refuses when the template is applied too); raw-text training is unaffected.
/// Entries that are not {name, template} strings are refused at once.
FolderTemplate default_template(const json& list, const std::string& file, const std::string& source) {
  std::map<std::string, std::string> by_name;  // later entries win, as in transformers' dict
  for (const auto& e : list) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("template") ||
        !e["template"].is_string())
      format_fail(
          file,
          fmt::format("key 'chat_template': expected a string or a list of {{\"name\" and \"template\": "
                      "strings}}, got an entry {}",
                      excerpt(e.dump(-1, ' ', false, json::error_handler_t::replace))));
    by_name[e["name"].get<std::string>()] = e["template"].get<std::string>();
  }
  if (const auto d = by_name.find("default"); d != by_name.end()) return {d->second, source, {}};
  std::string names;
  for (const auto& [n, _] : by_name) names += fmt::format("{}\"{}\"", names.empty() ? "" : ", ", excerpt(n));
  return {{},
          source,
          fmt::format("{}: key 'chat_template': a list of templates with no entry named \"default\" "
                      "(templates: {}); transformers refuses it too: add a \"default\" entry, give "
                      "chat_template one template, or name a hand-written template in the spec",
                      file, names.empty() ? "none" : names)};
}

/// The chat template of model folder `dir`.
FolderTemplate chat_template_of(const fs::path& dir) {
  const fs::path tc = dir / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(tc, ec)) {
    json j = read_json(tc.string());
    if (j.is_object() && j.contains("chat_template")) {
      const json& t = j["chat_template"];
      const std::string name = "tokenizer_config.json key 'chat_template'";
      if (t.is_string()) return {t.get<std::string>(), name, {}};
      if (t.is_array()) return default_template(t, tc.string(), name);
      if (!t.is_null())
        format_fail(tc.string(), "key 'chat_template': expected a string or a list of templates");
    }
  }
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja, ec)) return {read_text(jinja.string()), "chat_template.jinja", {}};
  return {};
}

/// Every token id of the tokenizer (its vocab and added tokens) must have a row in the model's
/// embedding; a tokenizer of another model fails here, at load, naming the file, the token,
/// its id and vocab_size, not later inside a step or a generation. Ids that are no integer are
/// left to the tokenizer's own checks.
void check_tokenizer_ids(const LoadedModel& h) {
  const int64_t V = h.config.vocab_size;
  const nlohmann::json& tj = h.tokenizer_json;
  if (V <= 0 || !tj.is_object()) return;
  int64_t top = -1;
  std::string top_token;
  auto consider = [&](const nlohmann::json& id, const std::string& token) {
    if (id.is_number_integer() && id.get<int64_t>() > top) top = id.get<int64_t>(), top_token = token;
  };
  if (const auto m = tj.find("model"); m != tj.end() && m->is_object())
    if (const auto v = m->find("vocab"); v != m->end() && v->is_object())
      for (const auto& [token, id] : v->items()) consider(id, token);
  if (const auto a = tj.find("added_tokens"); a != tj.end() && a->is_array())
    for (const auto& t : *a)
      if (t.is_object() && t.contains("id") && t.contains("content") && t["content"].is_string())
        consider(t["id"], t["content"].get<std::string>());
  if (top < V) return;
  format_fail(tokenizer_origin(h),
              fmt::format("token \"{}\" has id {}, not below the model's vocab_size {}: the embedding has "
                          "no row for it; the tokenizer does not belong to this model",
                          excerpt(top_token), top, V));
}

}  // namespace

void split_fused_projections(ModelSource::Impl& s, const std::string& where) {
  for (const FusedProjection& f : fused_projections(s.header.config)) {
    int64_t rows = 0;
    for (int64_t k : f.rows) rows += k;
    const auto it = s.tensors.find(f.name);
    if (it == s.tensors.end() || !it->second.st)
      format_fail(where, fmt::format("missing tensor '{}' (expected shape [{}, {}]: {} fused)", f.name, rows,
                                     f.cols, fmt::join(f.part_modules, ", ")));
    const SafetensorsEntry& e = *it->second.entry;
    if (e.shape != std::vector<int64_t>{rows, f.cols})
      format_fail(where,
                  fmt::format("tensor '{}': expected shape [{}, {}] ({} fused), got [{}]", f.name, rows,
                              f.cols, fmt::join(f.part_modules, ", "), fmt::join(e.shape, ", ")));
    const uint64_t row_bytes = (e.end - e.begin) / uint64_t(rows);
    int64_t row0 = 0;
    for (size_t k = 0; k < f.parts.size(); ++k) {
      SafetensorsEntry part = e;  // rows [row0, row0 + rows_k) of the row-major tensor
      part.name = f.parts[k];
      part.shape = {f.rows[k], f.cols};
      part.begin = e.begin + uint64_t(row0) * row_bytes;
      part.end = part.begin + uint64_t(f.rows[k]) * row_bytes;
      s.slices.push_back(std::move(part));
      Loc l = it->second;
      l.shape = s.slices.back().shape;
      l.entry = &s.slices.back();
      s.tensors[f.parts[k]] = l;
      row0 += f.rows[k];
    }
    s.tensors.erase(it);
  }
}

namespace {

void open_hf_dir(const std::string& path, ModelSource::Impl& s) {
  const fs::path dir(path);
  s.header.config = load_config_file((dir / "config.json").string());
  std::error_code ec;
  {  // the config's sizes against the weight files, before anything is allocated from them
    uint64_t bytes = 0;
    std::vector<std::string> files;  // named in the refusal: a truncated weight file is the usual cause
    // a folder that cannot be listed (no read permission) skips this check: its files open by name
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code size_ec;
      if (it->path().extension() != ".safetensors") continue;
      const uintmax_t n = it->file_size(size_ec);
      if (!size_ec) bytes += n, files.push_back(it->path().filename().string());
    }
    std::sort(files.begin(), files.end());
    if (bytes > 0)  // none: open_safetensors names the missing file
      check_weights_fit_files(
          s.header.config, bytes,
          s.header.config.gpt_oss() ? 0.5 : 2.0,  // MXFP4: 4.25 bits
          (dir / "config.json").string(), "num_hidden_layers",
          files.size() == 1 ? files[0] : fmt::format("its {} .safetensors files", files.size()));
  }
  std::string where = (dir / "model.safetensors.index.json").string();
  if (!fs::exists(where, ec)) where = (dir / "model.safetensors").string();
  s.safetensors = open_safetensors(path);
  for (const auto& [name, w] : s.safetensors.tensors) {
    Loc l;
    l.shape = w.entry->shape;
    l.st = w.file;
    l.entry = w.entry;
    s.tensors.emplace(name, std::move(l));
  }
  if (s.header.config.gpt_oss()) gpt_oss_hf_expert_slices(s, where);
  split_fused_projections(s, where);
  check_tensors(s, where);
  const fs::path tj = dir / "tokenizer.json";
  if (fs::exists(tj, ec)) {
    s.header.tokenizer_json = read_json(tj.string());
    s.header.tokenizer_source = tj.string();
  }
  FolderTemplate t = chat_template_of(dir);
  s.header.chat_template = std::move(t.text);
  s.header.chat_template_source = std::move(t.source);
  s.header.chat_template_error = std::move(t.error);
}

/// Element size and storage form of a safetensors dtype that a storage form copies as is.
bool st_matches(const std::string& dtype, WeightFormat f) {
  return (dtype == "BF16" && f == WeightFormat::bf16) || (dtype == "F16" && f == WeightFormat::f16) ||
         (dtype == "F32" && f == WeightFormat::f32);
}

}  // namespace

const Loc& ModelSource::Impl::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end())
    format_fail(header.source, fmt::format("tensor '{}' is not part of the model", name));
  return it->second;
}

ModelSource::ModelSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelSource::ModelSource(ModelSource&&) noexcept = default;
ModelSource& ModelSource::operator=(ModelSource&&) noexcept = default;
ModelSource::~ModelSource() = default;

ModelSource ModelSource::open(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    std::error_code cwd_ec;
    const auto cwd = fs::current_path(cwd_ec);
    format_fail(path, fs::path(path).is_relative() && !cwd_ec
                          ? fmt::format("no such file or directory (relative to the working directory {})",
                                        cwd.string())
                          : std::string("no such file or directory"));
  }
  auto s = std::make_unique<Impl>();
  s->header.source = path;
  if (fs::is_directory(st)) {
    open_hf_dir(path, *s);
  } else {
    open_gguf_source(path, *s);
    check_tensors(*s, path);
    if (s->header.config.architecture == "llama") {
      // convert_hf_to_gguf.py's LlamaModel.permute() of q_proj / k_proj rows, undone as read
      const ModelConfig& c = s->header.config;
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
        const std::string p = fmt::format("model.layers.{}.self_attn.", l);
        for (auto [name, heads] :
             {std::pair{"q_proj.weight", c.num_attention_heads}, {"k_proj.weight", c.num_key_value_heads}}) {
          Loc& w = s->tensors.at(p + name);
          if (heads <= 0 || w.shape[0] % (2 * heads) != 0)
            throw std::invalid_argument(fmt::format(
                "unpermute_qk_rows: {} rows is not a multiple of 2*n_head ({})", w.shape[0], 2 * heads));
          w.permute_heads = heads;
        }
      }
    }
  }
  check_tokenizer_ids(s->header);
  return ModelSource(std::move(s));
}

ModelSource ModelSource::from_loaded(LoadedModel m) {
  auto s = std::make_unique<Impl>();
  s->mem = std::move(m.tensors);
  m.tensors.clear();
  s->header = std::move(m);
  for (const auto& [name, t] : s->mem) {
    Loc l;
    l.shape = t.shape;
    l.mem = &t;
    s->tensors.emplace(name, std::move(l));
  }
  return ModelSource(std::move(s));
}

const ModelConfig& ModelSource::config() const { return impl_->header.config; }
const LoadedModel& ModelSource::header() const { return impl_->header; }
std::vector<int64_t> ModelSource::shape(const std::string& name) const { return impl_->at(name).shape; }
HostTensor ModelSource::read_f32(const std::string& name) const { return read_loc(*impl_, impl_->at(name)); }

bool ModelSource::read_as(const std::string& name, WeightFormat f, void* dst) const {
  const Loc& l = impl_->at(name);
  int64_t n = 1;
  for (auto d : l.shape) n *= d;
  const int64_t cols = weight_format_cols(l.shape);
  const size_t bytes = weight_format_bytes(f, n, cols);  // throws for a bad block multiple
  if (l.st && st_matches(l.entry->dtype, f)) {
    l.st->read_bytes(*l.entry, 0, bytes, dst);
    return true;
  }
  if (l.gguf && gguf_read_stored(*impl_->gguf, l, f, dst)) return true;
  if (l.oss && gpt_oss_read_stored(*l.oss, l.shape, f, dst)) return true;
  const HostTensor t = read_loc(*impl_, l);
  try {
    quantize_weights_parallel(f, t.data.data(), dst, n, cols);
  } catch (const std::invalid_argument& e) {  // fp8: a row without a finite scale
    throw std::invalid_argument(fmt::format("{}: tensor '{}': {}", impl_->header.source, name, e.what()));
  }
  return false;
}

std::optional<WeightFormat> ModelSource::float_format(const std::string& name) const {
  const Loc& l = impl_->at(name);
  if (l.st) {
    const std::string& d = l.entry->dtype;
    if (d == "F32") return WeightFormat::f32;
    if (d == "F16") return WeightFormat::f16;
    if (d == "BF16") return WeightFormat::bf16;
  } else if (l.gguf) {
    switch (GgmlType(l.gguf->type)) {
      case GgmlType::F32: return WeightFormat::f32;
      case GgmlType::F16: return WeightFormat::f16;
      case GgmlType::BF16: return WeightFormat::bf16;
      default: break;
    }
  }
  return std::nullopt;
}

void ModelSource::untie_embeddings() {
  if (!impl_->header.config.tie_word_embeddings) return;
  impl_->header.config.tie_word_embeddings = false;
  impl_->tensors["lm_head.weight"] = impl_->at("model.embed_tokens.weight");
}

LoadedModel ModelSource::read_all() const {
  LoadedModel m = impl_->header;
  for (const auto& [name, l] : impl_->tensors) m.tensors.emplace(name, read_loc(*impl_, l));
  return m;
}

namespace {

// The source's name of layout tensor `t` (a tied model's head reads the embedding), checked
// against the layout's element count.
std::string source_tensor(const ModelSource& src, const TensorSpec& t) {
  std::string name = t.name;
  if (name == "lm_head.weight" && src.config().tie_word_embeddings) name = "model.embed_tokens.weight";
  int64_t n = 1;
  for (auto d : src.shape(name)) n *= d;
  if (n != t.numel())
    format_fail(src.header().source,
                fmt::format("tensor '{}' has {} values, the model config says {}", t.name, n, t.numel()));
  return name;
}

}  // namespace

int64_t read_frozen_group(const ModelSource& src, const ModelLayout& layout, int g,
                          std::span<std::byte> out) {
  if (g < 0 || g >= layout.num_layers() || !layout.groups[size_t(g)].frozen)
    throw std::invalid_argument(fmt::format("read_frozen_group: group {} is not a frozen base group", g));
  const ParamGroup& grp = layout.groups[size_t(g)];
  if (int64_t(out.size()) != grp.storage_bytes)
    throw std::invalid_argument(fmt::format("read_frozen_group: group '{}' has {} bytes, {} given", grp.name,
                                            grp.storage_bytes, out.size()));
  int64_t stored = 0;
  for (const TensorSpec& t : grp.tensors)
    stored += src.read_as(source_tensor(src, t), t.format, out.data() + t.byte_offset) ? 1 : 0;
  return stored;
}

void read_model_group(const ModelSource& src, const ModelLayout& layout, int g, std::span<float> out) {
  if (g < 0 || g >= layout.num_layers() || layout.groups[size_t(g)].frozen)
    throw std::invalid_argument(fmt::format("read_model_group: group {} is not a trainable base group", g));
  const ParamGroup& grp = layout.groups[size_t(g)];
  if (int64_t(out.size()) != grp.numel)
    throw std::invalid_argument(fmt::format("read_model_group: group '{}' has {} values, the buffer {}",
                                            grp.name, grp.numel, out.size()));
  for (const TensorSpec& t : grp.tensors) {
    const HostTensor h = src.read_f32(source_tensor(src, t));
    std::copy(h.data.begin(), h.data.end(), out.begin() + t.offset);
  }
}

int64_t read_base_groups(const ModelSource& src, const ModelLayout& layout,
                         std::vector<std::vector<float>>& trainable,
                         std::vector<std::vector<uint8_t>>& frozen, bool frozen_later) {
  trainable.resize(layout.groups.size());
  frozen.resize(layout.groups.size());
  int64_t stored = 0;
  for (size_t g = 0; g < size_t(layout.num_layers()); ++g) {
    const ParamGroup& grp = layout.groups[g];
    if (grp.frozen) {
      if (frozen_later) {  // read later: every tensor there and of its size now (read_frozen_group checks
                           // too)
        for (const TensorSpec& t : grp.tensors) source_tensor(src, t);
        continue;
      }
      std::vector<uint8_t> st(size_t(grp.storage_bytes));
      stored += read_frozen_group(src, layout, int(g),
                                  std::span<std::byte>(reinterpret_cast<std::byte*>(st.data()), st.size()));
      frozen[g] = std::move(st);
      continue;
    }
    std::vector<float> f32(size_t(grp.numel));
    read_model_group(src, layout, int(g), f32);
    trainable[g] = std::move(f32);
  }
  return stored;
}

namespace {

/// A file of a model folder the weights or their shapes are read from: config.json, the
/// safetensors shards and their index, a GGUF. Other files (tokenizer, README, a disk tier's
/// cache, its lock and temporaries kept beside the model) leave the identity alone.
bool weights_file(const fs::path& f) {
  const std::string name = f.filename().string();
  return name == "config.json" || name.ends_with(".safetensors") ||
         name.ends_with(".safetensors.index.json") || name.ends_with(".gguf");
}

}  // namespace

std::string model_files_identity(const std::string& path) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code entry_ec;
      if (it->is_regular_file(entry_ec) && weights_file(it->path())) files.push_back(it->path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  // "2026-12-05 16:29:18.123456789 UTC": a stale cache's reason quotes it
  const auto when = [](const struct timespec& t) {
    struct tm u {};
    const time_t s = t.tv_sec;
    if (!::gmtime_r(&s, &u)) return fmt::format("{}.{:09}", t.tv_sec, t.tv_nsec);
    return fmt::format("{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:09} UTC", u.tm_year + 1900, u.tm_mon + 1,
                       u.tm_mday, u.tm_hour, u.tm_min, u.tm_sec, t.tv_nsec);
  };
  std::string id = "model " + path;
  for (const fs::path& f : files) {
    // the status change time and the inode too: a file rewritten in place, or copied over with its
    // modification time kept (cp -p, rsync -a), has the same size and modification time
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0) st = {};
    id += fmt::format("; {}: {} bytes, modified {}, status changed {}, inode {} of device {}",
                      f.filename().string(), st.st_size, when(st.st_mtim), when(st.st_ctim), st.st_ino,
                      st.st_dev);
  }
  return id;
}

LoadedModel load_model(const std::string& path) {
  const ModelSource src = ModelSource::open(path);
  std::error_code ec;
  check_host_memory_to_load(src.config(),
                            fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path);
  return src.read_all();
}

}  // namespace rp
