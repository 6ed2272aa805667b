// tokenizer_config.json's chat_template given as a list of {"name", "template"} entries, as
// transformers reads it (PreTrainedTokenizerBase: a dict by name; get_chat_template takes
// "default" and refuses a list without one, whatever its length): the "default" entry is the
// template; a list without one loads with no template and chat_template_error, one line naming
// the file and the names, which chat formatting refuses with (tests/trainer/test_chat_format.cpp);
// malformed entries are refused at load.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "model/layout.hpp"
#include "test_io_util.hpp"

namespace rp {
namespace {

using nlohmann::json;
using test::TempDir;

std::string tiny_folder(const TempDir& dir) {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 8, c.hidden_size = 8, c.intermediate_size = 8, c.num_hidden_layers = 1;
  c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 4;
  c.tie_word_embeddings = true;
  const ModelLayout layout = make_layout(c);
  std::vector<std::vector<float>> groups;
  std::vector<const float*> ptrs;
  for (const auto& g : layout.groups) groups.emplace_back(size_t(g.numel), 0.5f);
  for (const auto& g : groups) ptrs.push_back(g.data());
  const json tok = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", json::array()}}},
                    {"added_tokens", json::array()}};
  const std::string out = dir / "model";
  save_hf_checkpoint(out, layout, ptrs, tok, "{{ 'single' }}", DType::f32);
  return out;
}

void set_templates(const std::string& folder, const json& templates) {
  const std::string path = folder + "/tokenizer_config.json";
  json tc = json::parse(std::ifstream(path));
  tc["chat_template"] = templates;
  std::ofstream(path, std::ios::trunc) << tc.dump();
}

std::string load_error(const std::string& folder) {
  try {
    load_model(folder);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(loaded)";
}

TEST(ChatTemplateList, TheDefaultEntryIsTheTemplate) {
  TempDir dir("chat_list");
  const std::string m = tiny_folder(dir);
  EXPECT_EQ(load_model(m).chat_template, "{{ 'single' }}");
  set_templates(m, json::array({{{"name", "tool_use"}, {"template", "{{ 'tools' }}"}},
                                {{"name", "default"}, {"template", "{{ 'chat' }}"}},
                                {{"name", "rag"}, {"template", "{{ 'rag' }}"}}}));
  const LoadedModel loaded = load_model(m);
  EXPECT_EQ(loaded.chat_template, "{{ 'chat' }}");
  EXPECT_EQ(loaded.chat_template_source, "tokenizer_config.json key 'chat_template'");
}

TEST(ChatTemplateList, AListWithoutADefaultLeavesNoTemplateAndSaysWhy) {
  TempDir dir("chat_list");
  const std::string m = tiny_folder(dir);
  const std::string file = m + "/tokenizer_config.json";
  // one entry: transformers does not take it for the default either
  set_templates(m, json::array({{{"name", "rag"}, {"template", "{{ 'rag' }}"}}}));
  LoadedModel loaded = load_model(m);
  EXPECT_EQ(loaded.chat_template, "");
  std::string e = loaded.chat_template_error;
  EXPECT_EQ(e.rfind(file + ": key 'chat_template': ", 0), 0u) << e;
  EXPECT_NE(e.find("no entry named \"default\" (templates: \"rag\")"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // several: sorted by name, as transformers lists them
  set_templates(m, json::array({{{"name", "tool_use"}, {"template", "{{ 'tools' }}"}},
                                {{"name", "rag"}, {"template", "{{ 'rag' }}"}}}));
  e = load_model(m).chat_template_error;
  EXPECT_NE(e.find("(templates: \"rag\", \"tool_use\")"), std::string::npos) << e;
  // with a default there is no error
  set_templates(m, json::array({{{"name", "default"}, {"template", "{{ 'chat' }}"}}}));
  EXPECT_EQ(load_model(m).chat_template_error, "");
  // entries that are not {"name", "template"} strings are refused as such
  set_templates(m, json::array({{{"name", "default"}, {"template", 3}}}));
  e = load_error(m);  // malformed: refused at load
  EXPECT_EQ(e.rfind(file + ": key 'chat_template'", 0), 0u) << e;
  EXPECT_NE(e.find("\"name\" and \"template\""), std::string::npos) << e;
}

}  // namespace
}  // namespace rp
