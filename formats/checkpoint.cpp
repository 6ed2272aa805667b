#include "formats/checkpoint.hpp"
#include "model/error_text.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/atomic_file.hpp"
#include "base/host_resources.hpp"
#include "base/output_folder.hpp"
#include "formats/format_fail.hpp"
#include "formats/gguf.hpp"
#include "formats/gpt_oss_hf.hpp"
#include "formats/phi3_hf.hpp"
#include "formats/safetensors.hpp"
#include "formats/tokenizer_export.hpp"
#include "model/config.hpp"
#include "roundpipe/model_source.hpp"

namespace rp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream o(p, std::ios::binary);
  if (!o) format_fail(p.string(), fmt::format("cannot create: {}", std::strerror(errno)));
  o.write(s.data(), std::streamsize(s.size()));
  o.close();
  if (!o) format_fail(p.string(), "write failed");
}

std::string dump_json(const json& j, const fs::path& p) {
  try {
    return j.dump(2) + "\n";
  } catch (const json::exception& e) {
    format_fail(p.string(), fmt::format("cannot serialise JSON: {}", e.what()));
  }
}

}  // namespace

namespace {

/// The groups of a streaming save, read one at a time, and one GPT-OSS decoder's experts in
/// Hugging Face's stacked form: what the tensor being written reads from.
class StreamedGroups {
 public:
  StreamedGroups(const ModelLayout& layout, const GroupReader& read) : layout_(layout), read_(read) {}

  const float* group(size_t g) {
    if (g != group_) {
      group_ = SIZE_MAX;  // a throwing read leaves nothing cached
      data_ = read_(g);
      group_ = g;
    }
    return data_;
  }
  const float* experts(int64_t l, size_t k) {
    if (l != experts_of_) {
      experts_of_ = -1;
      experts_ = {};
      const float* d = group(size_t(l + 1));
      if (!d) return nullptr;
      experts_ = gpt_oss_layer_experts_to_hf(layout_, l, d);
      experts_of_ = l;
    }
    return experts_.values.at(k).data();
  }

 private:
  const ModelLayout& layout_;
  const GroupReader& read_;
  size_t group_ = SIZE_MAX;
  const float* data_ = nullptr;
  int64_t experts_of_ = -1;
  GptOssHfLayerExperts experts_;
};

/// The tensors of a Hugging Face folder of `layout` in group order (Phi-3: q/k/v and gate/up
/// fused; GPT-OSS: a decoder's experts stacked after its other tensors), each read from `s`
/// when the writer reaches it.
std::vector<TensorRef> streamed_hf_tensors(const ModelLayout& layout, StreamedGroups& s) {
  const ModelConfig& c = layout.config;
  const std::vector<HfTensorPlace> places = hf_tensor_places(layout);
  std::vector<TensorRef> refs;
  for (size_t i = 0; i < places.size(); ++i) {
    const HfTensorPlace& p = places[i];
    if (!c.gpt_oss() || !is_gpt_oss_expert_name(p.name))
      refs.push_back({p.name, p.shape, nullptr, [&s, g = p.group, off = p.offset]() -> const float* {
                        const float* d = s.group(g);
                        return d ? d + off : nullptr;
                      }});
    const bool group_ends = i + 1 == places.size() || places[i + 1].group != p.group;
    if (!c.gpt_oss() || !group_ends || p.group < 1 || int64_t(p.group) > c.num_hidden_layers) continue;
    const int64_t l = int64_t(p.group) - 1;
    const GptOssHfLayerExperts specs = gpt_oss_layer_experts_to_hf(layout, l, nullptr);
    for (size_t k = 0; k < specs.specs.size(); ++k)
      refs.push_back(
          {specs.specs[k].first, specs.specs[k].second, nullptr, [&s, l, k] { return s.experts(l, k); }});
  }
  return refs;
}

}  // namespace

void save_hf_checkpoint(const std::string& dir_in, const ModelLayout& layout,
                        const std::vector<const float*>& group_data, const nlohmann::json& tokenizer_json,
                        const std::string& chat_template, DType dtype,
                        const std::function<void(const std::string& tmp_dir)>& extra) {
  if (group_data.size() != layout.groups.size())
    throw std::invalid_argument(fmt::format("save_hf_checkpoint: {} group buffers for {} groups",
                                            group_data.size(), layout.groups.size()));
  save_hf_checkpoint(
      dir_in, layout, [&](size_t g) { return group_data[g]; }, tokenizer_json, chat_template, dtype, extra);
}

void save_hf_checkpoint(const std::string& dir_in, const ModelLayout& layout, const GroupReader& read_group,
                        const nlohmann::json& tokenizer_json, const std::string& chat_template, DType dtype,
                        const std::function<void(const std::string& tmp_dir)>& extra) {
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

    StreamedGroups groups(layout, read_group);
    save_safetensors_sharded(tmp.string(), streamed_hf_tensors(layout, groups), dtype,
                             uint64_t(5) * 1000 * 1000 * 1000);

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

void check_model_output_folder(const std::string& out_dir, const std::vector<std::string>& inputs) {
  if (out_dir.empty())
    throw std::invalid_argument("output folder: an empty path; expected the folder to write the model into");
  if (const std::string why = unsafe_output_folder(out_dir); !why.empty())
    throw std::invalid_argument(one_line(fmt::format(
        "{}: output {}, which a model folder would replace as a whole; expected a folder of its own", out_dir,
        why)));
  if (const std::string in = overlapping_input(out_dir, inputs); !in.empty())
    throw std::invalid_argument(
        one_line(fmt::format("{}: the output folder is, contains or lies inside the input {} (writing it "
                             "would replace the input); "
                             "expected a separate folder",
                             out_dir, in)));
  const fs::path out = resolved_path(out_dir);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw std::invalid_argument(
        one_line(fmt::format("{}: output exists and is not a folder; expected a folder", out_dir)));
  if (!fs::is_directory(out, ec) || fs::is_empty(out, ec)) return;
  std::vector<std::string> foreign = foreign_names(out);
  if (foreign.empty()) return;
  size_t folders = 0;
  for (auto& name : foreign)
    if (fs::is_directory(fs::symlink_status(out / name, ec))) name += "/", ++folders;
  const bool one = foreign.size() == 1;
  const std::string what = folders == foreign.size() ? (one ? "a folder" : "folders")
                           : folders == 0            ? (one ? "a file" : "files")
                                                     : "files and folders";
  throw std::invalid_argument(one_line(fmt::format(
      "{}: output holds {} roundpipe did not write there ({}), and writing the folder would delete {}; "
      "expected a new or empty folder, or one an earlier convert, merge or run wrote (its "
      "roundpipe_manifest.json "
      "lists every file)",
      out_dir, what, name_list(foreign), one ? "it" : "them")));
}

std::vector<std::string> clean_model_folder_leftovers(const std::string& out_dir) {
  if (out_dir.empty()) return {};  // no folder: check_model_output_folder refuses it
  std::string d = out_dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const fs::path p(d);
  const std::string parent = p.parent_path().empty() ? std::string(".") : p.parent_path().string();
  std::vector<std::string> lines;
  for (StaleTemporary s : clean_stale_temporaries(parent, p.filename().string())) {
    if (p.parent_path().empty())  // as the user named it: "out.tmp-42", not "./out.tmp-42"
      for (std::string* name : {&s.path, &s.target})
        if (name->rfind("./", 0) == 0) name->erase(0, 2);
    if (!s.error.empty())
      lines.push_back(
          fmt::format("{}: left by a roundpipe write that ended (its marker {} says so), but {}; "
                      "make it writable and remove both",
                      s.path, owner_marker_path(s.path), s.error));
    else if (s.left_alone)
      lines.push_back(
          fmt::format("left alone {} (named like a killed writer's leftover, but no roundpipe writer "
                      "marked it as its own)",
                      s.path));
    else if (s.restored)
      lines.push_back(
          fmt::format("restored {} from {} (an earlier roundpipe write was killed while replacing it)",
                      s.target, s.path));
    else lines.push_back(fmt::format("removed {} left by an interrupted roundpipe write", s.path));
  }
  return lines;
}

void save_model_folder(const std::string& out_dir, const ModelLayout& layout, const GroupReader& read_group,
                       const nlohmann::json& tokenizer_json, const std::string& chat_template, DType dtype,
                       const std::string& command) {
  uint64_t need = uint64_t(1) << 20;  // config, manifest, README and the other small files
  for (const auto& g : layout.groups) need += uint64_t(g.numel) * dtype_size(dtype);
  if (!tokenizer_json.is_null()) need += tokenizer_json.dump().size();
  require_free_disk(out_dir, need, "the model folder",
                    "free some space or write it to another disk (nothing was written)");
  save_hf_checkpoint(out_dir, layout, read_group, tokenizer_json, chat_template, dtype,
                     [&](const std::string& tmp) { write_manifest(tmp, command); });
}

void convert_gguf_to_hf(const std::string& gguf, const std::string& out_dir, DType dtype) {
  check_model_output_folder(out_dir, {gguf});
  const ModelSource src = ModelSource::open(gguf);
  const ModelLayout layout = make_layout(src.config());
  std::vector<float> group;
  const GroupReader read = [&](size_t g) {
    std::vector<float>().swap(group);  // the previous group goes before the next is read
    group.resize(size_t(layout.groups.at(g).numel));
    read_model_group(src, layout, int(g), group);
    return group.data();
  };
  save_model_folder(out_dir, layout, read, src.header().tokenizer_json, src.header().chat_template, dtype,
                    "convert");
}

}  // namespace rp
