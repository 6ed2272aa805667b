// Writing PEFT adapter folders (roundpipe/adapter.hpp): export -> import reproduces every
// group bit for bit, the folder is replaced atomically, malformed adapters are refused with one
// line naming the file and key, and (when torch + transformers + peft are importable) the real
// peft library loads the export and gives the logits of our merged checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "formats/safetensors.hpp"
#include "lora_test_layout.hpp"
#include "roundpipe/adapter.hpp"
#include "test_io_util.hpp"

namespace {

using namespace rp;
using namespace rp::test;
using nlohmann::json;

const std::string kDir = std::string(RP_FIXTURES_DIR) + "/peft/";

LoraConfig lora_of(int64_t r, std::vector<std::string> targets, std::vector<std::string> mts) {
  LoraConfig l;
  l.r = r;
  l.alpha = 2.0 * double(r);
  l.target_modules = std::move(targets);
  l.modules_to_save = std::move(mts);
  return l;
}

/// A LoRA layout over the fixture's base model with random adapters and modules_to_save
/// matrices (as training leaves them).
struct Trained {
  ModelLayout layout;
  std::vector<std::vector<float>> groups;
};
Trained trained(const std::string& base, const LoraConfig& l, uint32_t seed) {
  const LoadedModel m = load_model(kDir + base);
  Trained t{lora_test_layout(m.config, l), {}};
  t.groups = base_groups(t.layout, m.tensors);
  randomise(t.groups, size_t(m.config.num_hidden_layers + 2), 0.05f, seed);
  std::mt19937 rng(seed + 1);
  std::normal_distribution<float> n(0.0f, 0.02f);
  for (size_t g = 0; g < size_t(m.config.num_hidden_layers + 2); ++g)
    if (!t.layout.groups[g].frozen)
      for (float& x : t.groups[g]) x += n(rng);
  return t;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

void write_text(const std::string& path, const std::string& s) {
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  o << s;
}

TEST(PeftExport, KeysFollowPeft) {
  EXPECT_EQ(peft_tensor_key("model.layers.3.mlp.up_proj.lora_B.weight"),
            "base_model.model.model.layers.3.mlp.up_proj.lora_B.weight");
  EXPECT_EQ(peft_tensor_key("lm_head.weight"), "base_model.model.lm_head.weight");
  EXPECT_EQ(tensor_name_of_peft_key("base_model.model.model.embed_tokens.weight"),
            "model.embed_tokens.weight");
  EXPECT_EQ(tensor_name_of_peft_key("model.embed_tokens.weight"), "");
  LoraConfig l;
  l.target_modules = {"down_proj", "q_proj"};
  EXPECT_EQ(lora_target_list(l), (std::vector<std::string>{"q_proj", "down_proj"}));
  l.target_modules = {"all-linear"};
  EXPECT_EQ(lora_target_list(l).size(), 7u);
  l.target_modules = {"lm_head"};
  EXPECT_THROW(lora_target_list(l), std::invalid_argument);
}

TEST(PeftExport, ConfigHasPeftsFields) {
  LoraConfig l = lora_of(8, {"all-linear"}, {"lm_head"});
  l.alpha = 16;
  l.dropout = 0.05;
  l.use_rslora = true;
  const ModelConfig tied = load_model(kDir + "base_tied").config;
  const json j = peft_adapter_config(lora_test_layout(tied, l), "HuggingFaceTB/SmolLM2-135M");
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["r"], 8);
  EXPECT_TRUE(j["lora_alpha"].is_number_integer());
  EXPECT_EQ(j["lora_alpha"], 16);
  EXPECT_EQ(j["lora_dropout"], 0.05);
  EXPECT_EQ(j["target_modules"].size(), 7u);
  EXPECT_EQ(j["use_rslora"], true);
  EXPECT_EQ(j["modules_to_save"], json::array({"lm_head"}));  // tied: the embedding, tied by PEFT
  EXPECT_EQ(j["base_model_name_or_path"], "HuggingFaceTB/SmolLM2-135M");
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["fan_in_fan_out"], false);
  EXPECT_EQ(j["init_lora_weights"], true);
  EXPECT_EQ(j["ensure_weight_tying"], true);
  // untied, lm_head trained: its group holds the final norm too, which PEFT calls model.norm
  const ModelConfig untied = load_model(kDir + "base_untied").config;
  const json u = peft_adapter_config(lora_test_layout(untied, l), "");
  EXPECT_FALSE(u.contains("ensure_weight_tying"));
  EXPECT_TRUE(u["base_model_name_or_path"].is_null());
  EXPECT_EQ(u["modules_to_save"], json::array({"lm_head", "model.norm"}));
  l.modules_to_save = {};
  EXPECT_TRUE(peft_adapter_config(lora_test_layout(untied, l), "")["modules_to_save"].is_null());
}

struct RoundTrip {
  const char* base;
  LoraConfig lora;
};

class PeftRoundTrip : public ::testing::TestWithParam<int> {};

const std::vector<RoundTrip>& round_trips() {
  static const std::vector<RoundTrip> v = {
      {"base_untied", lora_of(4, {"q_proj", "v_proj"}, {})},
      {"base_untied", lora_of(2, {"all-linear"}, {"embed_tokens", "lm_head"})},
      {"base_tied", lora_of(3, {"k_proj", "down_proj"}, {"lm_head"})},
      {"base_tied", lora_of(5, {"o_proj", "gate_proj", "up_proj"}, {"embed_tokens"})},
      // Qwen2 (the adapted q/k/v keep their biases in the frozen base) and Mistral
      {"../hf_golden/tiny_qwen2", lora_of(4, {"all-linear"}, {"lm_head"})},
      {"../hf_golden/tiny_mistral", lora_of(2, {"q_proj", "k_proj", "v_proj", "o_proj", "down_proj"}, {})},
      // OLMo 2 (no pre-norm: the adapted q/k/v and gate/up read the residual stream) and Granite
      // (tied, its multipliers in the merged folder's config.json)
      {"../hf_golden/tiny_olmo2", lora_of(4, {"all-linear"}, {"lm_head"})},
      {"../hf_golden/tiny_granite",
       lora_of(2, {"q_proj", "v_proj", "o_proj", "down_proj"}, {"embed_tokens"})},
      // Phi-3: PEFT's qkv_proj / gate_up_proj adapters at rank 3r / 2r, block diagonal
      {"../hf_golden/tiny_phi3", lora_of(3, {"all-linear"}, {"lm_head"})},
      {"../hf_golden/tiny_phi3", lora_of(2, {"q_proj", "k_proj", "v_proj", "down_proj"}, {})},
      // Gemma 2 and Gemma 3 (tied; four norms of 1 + w a layer, GeGLU, scaled embeddings)
      {"../hf_golden/tiny_gemma2", lora_of(4, {"all-linear"}, {})},
      {"../hf_golden/tiny_gemma3",
       lora_of(2, {"q_proj", "v_proj", "gate_proj", "down_proj"}, {"embed_tokens"})},
  };
  return v;
}

TEST_P(PeftRoundTrip, ExportThenImportEqualsBitForBit) {
  const RoundTrip& rt = round_trips()[size_t(GetParam())];
  const Trained t = trained(rt.base, rt.lora, 11u + uint32_t(GetParam()));
  TempDir d("peft_rt");
  save_peft_adapter(d / "adapter", t.layout, pointers(t.groups), rt.base);
  const PeftAdapter a = read_peft_adapter(d / "adapter");
  EXPECT_EQ(a.lora.r, rt.lora.r);
  EXPECT_EQ(a.lora.alpha, rt.lora.alpha);
  EXPECT_EQ(a.lora.target_modules, lora_target_list(rt.lora));
  EXPECT_FALSE(peft_adapter_unties(a, t.layout.config));
  // a fresh layout with the base weights only: the import must bring back every trained group
  const LoadedModel base = load_model(kDir + rt.base);
  auto back = base_groups(t.layout, base.tensors);
  load_peft_adapter(a, t.layout, back);
  for (size_t g = 0; g < t.groups.size(); ++g) EXPECT_EQ(back[g], t.groups[g]) << t.layout.groups[g].name;
  // the folder holds the two adapter files and nothing else
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(d / "adapter")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"adapter_config.json", "adapter_model.safetensors"}));
}

INSTANTIATE_TEST_SUITE_P(Peft, PeftRoundTrip, ::testing::Range(0, 12));

TEST(PeftExport, Bf16ExportRoundsEveryValueOnce) {
  const Trained t = trained("base_untied", lora_of(4, {"all-linear"}, {"lm_head"}), 5);
  TempDir d("peft_bf16");
  save_peft_adapter(d / "adapter", t.layout, pointers(t.groups), "", DType::bf16);
  SafetensorsFile f(d / "adapter/adapter_model.safetensors");
  for (const auto& e : f.entries()) EXPECT_EQ(e.dtype, "BF16") << e.name;
  const PeftAdapter a = read_peft_adapter(d / "adapter");
  auto back = base_groups(t.layout, load_model(kDir + "base_untied").tensors);
  load_peft_adapter(a, t.layout, back);
  for (size_t g = 0; g < t.groups.size(); ++g) {
    if (t.layout.groups[g].frozen) continue;
    for (size_t i = 0; i < t.groups[g].size(); ++i)
      ASSERT_LE(std::abs(back[g][i] - t.groups[g][i]), std::abs(t.groups[g][i]) * (1.0f / 256))
          << g << " " << i;
  }
}

TEST(PeftExport, AFailedSaveKeepsThePreviousFolder) {
  const Trained t = trained("base_untied", lora_of(2, {"q_proj"}, {}), 3);
  TempDir d("peft_atomic");
  save_peft_adapter(d / "adapter", t.layout, pointers(t.groups), "");
  const auto before = read_bytes(d / "adapter/adapter_model.safetensors");
  auto ptrs = pointers(t.groups);
  ptrs.back() = nullptr;  // the last adapter group cannot be written
  EXPECT_THROW(save_peft_adapter(d / "adapter", t.layout, ptrs, ""), std::invalid_argument);
  EXPECT_EQ(read_bytes(d / "adapter/adapter_model.safetensors"), before);
  for (const auto& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename(), "adapter") << "leftover " << e.path();
}

/// A copy of the untied_all fixture with `edit` applied to its config.
std::string edited_fixture(const TempDir& d, const std::function<void(json&)>& edit) {
  fs::copy(kDir + "untied_all/adapter", d / "a");
  std::ifstream in(d / "a/adapter_config.json");
  json j = json::parse(in);
  edit(j);
  write_text(d / "a/adapter_config.json", j.dump());
  return d / "a";
}

TEST(PeftImport, RefusesWhatItDoesNotComputeNamingFileAndKey) {
  auto err = [](const std::function<void(json&)>& edit) {
    TempDir d("peft_err");
    const std::string dir = edited_fixture(d, edit);
    return error_of([&] { read_peft_adapter(dir); });
  };
  EXPECT_NE(err([](json& j) {
              j["r"] = 0;
            }).find("adapter_config.json: key 'r': expected an integer in 1..65536, got 0"),
            std::string::npos);
  // a rank whose adapter sizes would wrap around int64_t
  EXPECT_NE(err([](json& j) {
              j["r"] = int64_t(1) << 62;
            }).find("adapter_config.json: key 'r': expected an integer in 1..65536, got 4611686018427387904"),
            std::string::npos);
  EXPECT_NE(
      err([](json& j) { j["peft_type"] = "IA3"; }).find("key 'peft_type': expected \"LORA\", got \"IA3\""),
      std::string::npos);
  EXPECT_NE(
      err([](json& j) { j["target_modules"] = ".*proj"; }).find("key 'target_modules': expected a list"),
      std::string::npos);
  EXPECT_NE(err([](json& j) { j["use_dora"] = true; }).find("key 'use_dora': expected false"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["bias"] = "all"; }).find("key 'bias'"), std::string::npos);
  EXPECT_NE(
      err([](json& j) { j["init_lora_weights"] = "pissa"; }).find("key 'init_lora_weights': expected true"),
      std::string::npos);
  EXPECT_NE(err([](json& j) { j["layers_to_transform"] = {0}; }).find("key 'layers_to_transform'"),
            std::string::npos);
  EXPECT_NE(err([](json& j) { j["modules_to_save"] = {"input_layernorm"}; }).find("key 'modules_to_save'"),
            std::string::npos);
  // lm_head in the file but not in modules_to_save
  EXPECT_NE(err([](json& j) {
              j["modules_to_save"] = nullptr;
            }).find("adapter_model.safetensors: key 'base_model.model.lm_head.weight': modules_to_save"),
            std::string::npos);
  // a target module dropped from the config while its tensors stay in the file
  EXPECT_NE(err([](json& j) {
              j["target_modules"] = {"q_proj", "k_proj"};
            }).find("is not in target_modules"),
            std::string::npos);
}

TEST(PeftImport, MissingFilesAndPickleAdapters) {
  TempDir d("peft_files");
  fs::create_directories(d / "a");
  EXPECT_NE(error_of([&] { read_peft_adapter(d / "a"); }).find("adapter_config.json: missing"),
            std::string::npos);
  fs::copy(kDir + "untied_all/adapter/adapter_config.json", d / "a/adapter_config.json");
  EXPECT_NE(error_of([&] { read_peft_adapter(d / "a"); }).find("adapter_model.safetensors: missing"),
            std::string::npos);
  write_text(d / "a/adapter_model.bin", "pickle");
  const std::string e = error_of([&] { read_peft_adapter(d / "a"); });
  EXPECT_NE(e.find("adapter_model.bin: PyTorch pickle adapters are not read"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(PeftImport, ChecksRankShapesAndKeysAgainstTheLayout) {
  const PeftAdapter a = read_peft_adapter(kDir + "untied_all/adapter");
  const LoadedModel base = load_model(kDir + "base_untied");
  {  // another rank
    LoraConfig l = a.lora;
    l.r = 8;
    const ModelLayout layout = lora_test_layout(base.config, l);
    auto g = base_groups(layout, base.tensors);
    EXPECT_NE(
        error_of([&] { load_peft_adapter(a, layout, g); }).find("adapter_config.json: key 'r': expected 8"),
        std::string::npos);
  }
  {  // other targets
    LoraConfig l = a.lora;
    l.target_modules = {"q_proj"};
    const ModelLayout layout = lora_test_layout(base.config, l);
    auto g = base_groups(layout, base.tensors);
    EXPECT_NE(
        error_of([&] { load_peft_adapter(a, layout, g); }).find("key 'target_modules': expected [q_proj]"),
        std::string::npos);
  }
  {  // a tensor of the wrong shape, and a missing one
    PeftAdapter bad = a;
    HostTensor& t = bad.tensors.at("model.layers.1.mlp.up_proj.lora_A.weight");
    t.shape = {4, 16};
    t.data.resize(64);
    const ModelLayout layout = lora_test_layout(base.config, a.lora);
    auto g = base_groups(layout, base.tensors);
    EXPECT_NE(
        error_of([&] { load_peft_adapter(bad, layout, g); })
            .find(
                "adapter_model.safetensors: key 'base_model.model.model.layers.1.mlp.up_proj.lora_A.weight': "
                "expected shape [4, 32], got [4, 16]"),
        std::string::npos);
    bad.tensors.erase("model.layers.1.mlp.up_proj.lora_A.weight");
    EXPECT_NE(error_of([&] { load_peft_adapter(bad, layout, g); }).find("lora_A.weight': missing"),
              std::string::npos);
  }
  {  // a tied model given an adapter that trains lm_head apart from the embedding
    const PeftAdapter u = read_peft_adapter(kDir + "tied_untie/adapter");
    const LoadedModel tied = load_model(kDir + "base_tied");
    const ModelLayout layout = lora_test_layout(tied.config, u.lora);
    auto g = base_groups(layout, tied.tensors);
    EXPECT_NE(error_of([&] { load_peft_adapter(u, layout, g); }).find("untie_embeddings"), std::string::npos);
  }
}

/// The Python that runs tests/fixtures/peft/check_export.py: $RP_PYTHON, else python3; empty
/// when it cannot import torch, transformers and peft.
std::string peft_python() {
  const char* env = std::getenv("RP_PYTHON");
  const std::string py = env && *env ? env : "python3";
  const std::string probe = py + " -c 'import torch, transformers, peft' >/dev/null 2>&1";
  return std::system(probe.c_str()) == 0 ? py : "";
}

// Every round-trip layout (untied and tied, with and without modules_to_save) exported, merged,
// and checked by the real peft in one Python process.
TEST(PeftExport, PeftLoadsOurExportWithTheLogitsOfOurMerge) {
  const std::string py = peft_python();
  if (py.empty())
    GTEST_SKIP() << "no Python with torch, transformers and peft (set RP_PYTHON=/path/to/python): the C++ "
                    "comparisons with peft's own fixtures still run";
  TempDir d("peft_py");
  std::string cmd = py + " " + RP_FIXTURES_DIR + "/peft/check_export.py";
  std::vector<bool> tied;
  for (size_t i = 0; i < round_trips().size(); ++i) {
    const RoundTrip& rt = round_trips()[i];
    const Trained t = trained(rt.base, rt.lora, 101u + uint32_t(i));
    const std::string a = d / ("adapter" + std::to_string(i)), m = d / ("merged" + std::to_string(i));
    save_peft_adapter(a, t.layout, pointers(t.groups), rt.base);
    save_merged_checkpoint(m, t.layout, pointers(t.groups), nullptr, "", DType::f32);
    cmd += " " + kDir + rt.base + " " + a + " " + m;
    tied.push_back(t.layout.config.tie_word_embeddings);
  }
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  size_t at = 0;
  for (size_t i = 0; i < round_trips().size(); ++i) {
    at = out.find("{\"adapter_vs_merged\"", at);
    ASSERT_NE(at, std::string::npos) << out;
    const size_t end = out.find('\n', at);
    const json r = json::parse(out.substr(at, end - at));
    std::printf("peft check %zu: %s\n", i, r.dump().c_str());
    EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_EQ(r["merged_tie_word_embeddings"].get<bool>(), tied[i]) << r.dump();
    at = end;
  }
}

// A run's adapter names its base by model id, as PEFT's AutoPeftModelForCausalLM needs, with
// the local file in roundpipe_base.json: peft's own config reader takes the folder (no network:
// PeftConfig reads the folder alone) and sees the id, not a path of this machine, and does not
// warn about keys it does not know.
TEST(PeftExport, PeftReadsThePortableBaseId) {
  const std::string py = peft_python();
  if (py.empty())
    GTEST_SKIP() << "no Python with torch, transformers and peft (set RP_PYTHON=/path/to/python)";
  TempDir d("peft_id");
  const RoundTrip& rt = round_trips()[0];
  const Trained t = trained(rt.base, rt.lora, 7u);
  const BaseModelRef base = base_model_ref(kDir + rt.base, "HuggingFaceTB/SmolLM2-135M");
  const std::string a = d / "adapter";
  save_peft_adapter(a, t.layout, pointers(t.groups), base.portable(), DType::f32,
                    [&](const std::string& tmp) { write_adapter_base_record(tmp, base); });
  const std::string cmd =
      "HF_HUB_OFFLINE=1 " + py +
      " -W error::UserWarning -c 'import sys; from peft import PeftConfig; "
      "c = PeftConfig.from_pretrained(sys.argv[1]); print(\"base=\" + c.base_model_name_or_path)' " +
      a + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("base=HuggingFaceTB/SmolLM2-135M\n"), std::string::npos) << out;
  // roundpipe itself finds the local base through the record, the id being no local model
  std::string found;
  load_merged_adapter(a, "", &found);
  EXPECT_EQ(found, base.path);
}

}  // namespace
