// The portable name of a base model (roundpipe/adapter.hpp: is_hub_model_id,
// hub_id_of_model, the adapter folder's kAdapterBaseFile).
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/atomic_file.hpp"
#include "base/json_text.hpp"
#include "formats/gguf.hpp"
#include "roundpipe/adapter.hpp"

namespace rp {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_hub_model_id(const std::string& s) {
  // "<owner>/<name>": letters, digits, '-', '_', '.'; neither part starts with '.' or '-' nor
  // holds "..", and nothing else (no leading '/', no second '/', no spaces)
  const size_t slash = s.find('/');
  if (slash == std::string::npos || s.find('/', slash + 1) != std::string::npos) return false;
  if (s.size() > 96 || s.find("..") != std::string::npos || s.find("--") != std::string::npos) return false;
  for (const std::string& part : {s.substr(0, slash), s.substr(slash + 1)}) {
    if (part.empty() || part.front() == '.' || part.front() == '-' || part.back() == '.' ||
        part.back() == '-')
      return false;
    for (const char c : part)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
            c == '_' || c == '.'))
        return false;
  }
  return true;
}

namespace {

/// "owner/name" of a Hugging Face address ("https://huggingface.co/owner/name[/...]"), else "".
std::string hub_id_of_url(const std::string& url) {
  for (const std::string prefix : {"https://huggingface.co/", "http://huggingface.co/", "huggingface.co/"}) {
    if (url.rfind(prefix, 0) != 0) continue;
    const std::string rest = url.substr(prefix.size());
    const size_t slash = rest.find('/');
    const size_t end = slash == std::string::npos ? std::string::npos : rest.find('/', slash + 1);
    const std::string id = rest.substr(0, end);
    return is_hub_model_id(id) ? id : "";
  }
  return "";
}

std::string hub_id_of_gguf(const std::string& path) {
  const GgufFile f(path);
  auto text = [&](const std::string& key) {
    return f.has(key) && f.get(key).is_string() ? f.get(key).get<std::string>() : std::string();
  };
  // llama.cpp's convert_hf_to_gguf.py: the repository it converted, then the first base model
  for (const std::string& id :
       {text("general.source.huggingface.repository"), hub_id_of_url(text("general.source.url")),
        hub_id_of_url(text("general.base_model.0.repo_url"))})
    if (is_hub_model_id(id)) return id;
  return "";
}

std::string hub_id_of_folder(const fs::path& dir) {
  std::ifstream in(dir / "config.json", std::ios::binary);
  if (!in) return "";
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("_name_or_path") || !j["_name_or_path"].is_string()) return "";
  const std::string id = j["_name_or_path"].get<std::string>();
  return is_hub_model_id(id) ? id : "";  // a config saved from a local folder names that folder
}

}  // namespace

std::string hub_id_of_model(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return hub_id_of_folder(path);
  if (fs::is_regular_file(path, ec)) return hub_id_of_gguf(path);
  return "";
}

BaseModelRef base_model_ref(const std::string& model_path, const std::string& base_model_id) {
  BaseModelRef r;
  std::error_code ec;
  r.path = model_path;
  if (!model_path.empty() && fs::exists(model_path, ec)) {
    const fs::path abs = fs::absolute(model_path, ec);
    if (!ec) r.path = abs.lexically_normal().string();
  }
  if (!base_model_id.empty()) {
    r.id = base_model_id;
    r.id_from = "base_model_id";
  } else if (std::string id = hub_id_of_model(model_path); !id.empty()) {
    r.id = std::move(id);
    r.id_from = fs::is_directory(model_path, ec) ? "config.json _name_or_path" : "GGUF metadata";
  }
  return r;
}

void write_adapter_base_record(const std::string& dir, const BaseModelRef& base) {
  const json j = {{"written_by", "roundpipe"},
                  {"base_model_id", base.id.empty() ? json(nullptr) : json(base.id)},
                  {"base_model_path", base.path}};
  write_file_atomically((fs::path(dir) / kAdapterBaseFile).string(),
                        [&](std::ostream& os) { os << j.dump(2) << "\n"; });
}

std::string adapter_base_path(const std::string& adapter_dir) {
  const fs::path record = fs::path(adapter_dir) / kAdapterBaseFile;
  std::error_code ec;
  if (!fs::exists(record, ec)) return "";
  // a named pipe, a folder or a device is refused in one line (read_json_file: a pipe no program
  // writes to waited forever); a record that is no JSON names no base, as an absent one
  const json j = json::parse(read_json_file(record.string()), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("base_model_path") || !j["base_model_path"].is_string()) return "";
  return j["base_model_path"].get<std::string>();
}

}  // namespace rp
