// The portable base-model name of an adapter (roundpipe/adapter.hpp): what counts as a
// Hugging Face model id, where a local model names its own id (config.json _name_or_path, GGUF
// general.source.* / general.base_model.*), and the local path kept beside the adapter, which
// generate and merge use before the id.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "roundpipe/adapter.hpp"
#include "test_io_util.hpp"

namespace {

using namespace rp;
using namespace rp::test;

TEST(BaseModelId, HubIdsAreOwnerSlashName) {
  for (const char* ok :
       {"HuggingFaceTB/SmolLM2-135M", "Qwen/Qwen3-0.6B", "meta-llama/Llama-3.1-8B", "a/b", "o_1/n.2"})
    EXPECT_TRUE(is_hub_model_id(ok)) << ok;
  for (const char* bad : {"", "SmolLM2", "/abs/model.gguf", "./a/b", "a/b/c", "a//b", "../x", "a/..", "a/.b",
                          "a/b-", "a b/c", "a/b\n", "runs/lora/final/", "a--b/c", "C:\\x/y"})
    EXPECT_FALSE(is_hub_model_id(bad)) << bad;
}

TEST(BaseModelId, AFolderNamesItsIdThroughConfigNameOrPath) {
  TempDir d("hubid_folder");
  auto config = [&](const nlohmann::json& j) { std::ofstream(d / "config.json") << j.dump(); };
  config({{"_name_or_path", "HuggingFaceTB/SmolLM2-135M"}, {"model_type", "llama"}});
  EXPECT_EQ(hub_id_of_model(d.path.string()), "HuggingFaceTB/SmolLM2-135M");
  config({{"_name_or_path", "/home/me/models/smol"}});  // saved from a local folder: not portable
  EXPECT_EQ(hub_id_of_model(d.path.string()), "");
  config({{"model_type", "llama"}});
  EXPECT_EQ(hub_id_of_model(d.path.string()), "");
  std::ofstream(d / "config.json") << "{not json";
  EXPECT_EQ(hub_id_of_model(d.path.string()), "");
}

TEST(BaseModelId, AGgufNamesItsIdThroughItsSourceMetadata) {
  TempDir d("hubid_gguf");
  auto gguf = [&](const std::function<void(GgufBuilder&)>& add) {
    GgufBuilder b;
    b.str("general.architecture", "llama");
    b.str("general.name", "Smollm2 135M");  // a display name, never taken for the id
    add(b);
    write_bytes(d / "m.gguf", b.build());
    return hub_id_of_model(d / "m.gguf");
  };
  EXPECT_EQ(gguf([](GgufBuilder&) {}), "");
  EXPECT_EQ(gguf([](GgufBuilder& b) { b.str("general.source.huggingface.repository", "Qwen/Qwen3-0.6B"); }),
            "Qwen/Qwen3-0.6B");
  EXPECT_EQ(gguf([](GgufBuilder& b) {
              b.str("general.source.url", "https://huggingface.co/Qwen/Qwen3-0.6B/tree/main");
            }),
            "Qwen/Qwen3-0.6B");
  EXPECT_EQ(gguf([](GgufBuilder& b) {
              b.u32("general.base_model.count", 1);
              b.str("general.base_model.0.repo_url", "https://huggingface.co/HuggingFaceTB/SmolLM2-135M");
            }),
            "HuggingFaceTB/SmolLM2-135M");
  EXPECT_EQ(gguf([](GgufBuilder& b) { b.str("general.source.url", "https://example.com/a/b"); }), "");
}

TEST(BaseModelId, TheSpecIdComesFirstAndThePathIsKeptAbsolute) {
  TempDir d("hubid_ref");
  std::ofstream(d / "config.json") << R"({"_name_or_path": "HuggingFaceTB/SmolLM2-135M"})";
  BaseModelRef r = base_model_ref(d.path.string(), "");
  EXPECT_EQ(r.id, "HuggingFaceTB/SmolLM2-135M");
  EXPECT_EQ(r.id_from, "config.json _name_or_path");
  EXPECT_EQ(r.portable(), r.id);
  EXPECT_TRUE(fs::path(r.path).is_absolute());
  r = base_model_ref(d.path.string(), "me/my-base");
  EXPECT_EQ(r.portable(), "me/my-base");
  EXPECT_EQ(r.id_from, "base_model_id");
  fs::remove(d / "config.json");
  r = base_model_ref(d.path.string(), "");
  EXPECT_EQ(r.id, "");
  EXPECT_EQ(r.portable(), r.path);  // nothing portable is known: the local path, as before

  write_adapter_base_record(d.path.string(), base_model_ref(d.path.string(), "me/my-base"));
  EXPECT_EQ(adapter_base_path(d.path.string()), fs::absolute(d.path).lexically_normal().string());
  std::ofstream(d / kAdapterBaseFile) << "[1, 2]";
  EXPECT_EQ(adapter_base_path(d.path.string()), "");
  // a record that is a named pipe no program writes to: refused at once (it waited forever)
  fs::remove(d / kAdapterBaseFile);
  ASSERT_EQ(::mkfifo((d / kAdapterBaseFile).c_str(), 0600), 0);
  try {
    adapter_base_path(d.path.string());
    ADD_FAILURE() << "a named pipe as the base record was read";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is a named pipe that no program writes to"), std::string::npos)
        << e.what();
  }
}

}  // namespace
