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
#include "base/output_folder.hpp"
#include "formats/format_fail.hpp"
#include "formats/gguf.hpp"
#include "formats/gpt_oss_hf.hpp"
#include "formats/phi3_hf.hpp"
#include "formats/safetensors.hpp"
#include "formats/tokenizer_export.hpp"
#include "model/config.hpp"

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

void save_hf_checkpoint(const std::string& dir_in, const ModelLayout& layout,
                        const std::vector<const float*>& group_data, const nlohmann::json& tokenizer_json,
                        const std::string& chat_template, DType dtype,
                        const std::function<void(const std::string& tmp_dir)>& extra) {
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
    for (const TensorRef& t : hf_tensor_refs(layout, group_data))  // Phi-3: q/k/v and gate/up fused
      if (!c.gpt_oss() || !is_gpt_oss_expert_name(t.name)) refs.push_back(t);
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

void check_model_output_folder(const std::string& out_dir, const std::vector<std::string>& inputs) {
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

void save_model_folder(const std::string& out_dir, const ModelLayout& layout,
                       const std::vector<const float*>& groups, const nlohmann::json& tokenizer_json,
                       const std::string& chat_template, DType dtype, const std::string& command) {
  save_hf_checkpoint(out_dir, layout, groups, tokenizer_json, chat_template, dtype,
                     [&](const std::string& tmp) { write_manifest(tmp, command); });
}

void convert_gguf_to_hf(const std::string& gguf, const std::string& out_dir, DType dtype) {
  check_model_output_folder(out_dir, {gguf});
  LoadedModel m = load_model(gguf);
  const ModelLayout layout = make_layout(m.config);
  std::vector<std::vector<float>> groups;
  fill_groups(m, layout, groups);
  m.tensors.clear();  // halve peak memory before writing
  std::vector<const float*> ptrs;
  for (const auto& g : groups) ptrs.push_back(g.data());
  save_model_folder(out_dir, layout, ptrs, m.tokenizer_json, m.chat_template, dtype, "convert");
}

}  // namespace rp
