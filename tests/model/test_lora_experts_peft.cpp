// Parity with Hugging Face PEFT for LoRA on the experts (target_parameters, PEFT's ParamWrapper)
// and the attention of a tiny Qwen3-MoE (tests/fixtures/hf_lora/make_expert_lora_golden.py):
// logits, loss and every adapter gradient (fp32 CPU at 1e-5, bf16 CUDA looser; both with grouped
// expert GEMMs and with the padded expert layout and bucketed ones, the default); PEFT's own
// adapter folder read into the runtime's layout; our export written key for key and value for
// value as PEFT saved it; the merge (expert adapters folded into the expert weights) giving
// PEFT's logits; and, with a Python that has peft, PEFT loading our export (and wrapping nothing
// else) with our merge's logits, for experts + attention and for attention alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "formats/checkpoint.hpp"
#include "formats/peft_experts.hpp"
#include "formats/safetensors.hpp"
#include "model/lora.hpp"
#include "roundpipe/adapter.hpp"
#include "tests/model/device_reference.hpp"

namespace rp::test {
namespace {

namespace fs = std::filesystem;
const std::string kDir = std::string(RP_FIXTURES_DIR) + "/hf_lora/tiny_qwen3_moe_lora";

struct Golden {
  LoadedModel base;
  ModelLayout layout;
  std::vector<std::vector<float>> weights;
  std::vector<int32_t> ids, targets;
  MicroBatchShape shape;
  std::unique_ptr<SafetensorsFile> file;
  HostTensor get(const std::string& n) const {
    auto* e = file->find(n);
    if (!e) throw std::runtime_error("golden tensor missing: " + n);
    return file->read_f32(*e);
  }
};

Golden load_golden() {
  Golden g;
  g.base = load_model(kDir);
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(kDir + "/lora.json"));
  LoraConfig lc;
  lc.r = j.at("r").get<int64_t>();
  lc.alpha = j.at("alpha").get<double>();
  lc.target_modules = j.at("target_modules").get<std::vector<std::string>>();
  lc.target_parameters = j.at("target_parameters").get<std::vector<std::string>>();
  g.file = std::make_unique<SafetensorsFile>(kDir + "/golden.safetensors");
  g.layout = make_layout(g.base.config, lc);
  fill_groups(g.base, make_layout(g.base.config), g.weights);
  for (size_t gi = g.weights.size(); gi < g.layout.groups.size(); ++gi) {
    const ParamGroup& grp = g.layout.groups[gi];
    std::vector<float> w(size_t(grp.numel));
    for (auto& t : grp.tensors) {
      HostTensor v = g.get("lora." + t.name);
      EXPECT_EQ(v.shape, t.shape) << t.name;
      std::copy(v.data.begin(), v.data.end(), w.begin() + t.offset);
    }
    g.weights.push_back(std::move(w));
  }
  HostTensor ids = g.get("ids"), tg = g.get("targets");
  g.shape = {ids.shape[0], ids.shape[1]};
  for (float v : ids.data) g.ids.push_back(int32_t(v));
  for (float v : tg.data) g.targets.push_back(int32_t(v));
  return g;
}

double rel(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<const float*> pointers(const std::vector<std::vector<float>>& g) {
  std::vector<const float*> p;
  for (auto& v : g) p.push_back(v.data());
  return p;
}

void check(Device& dev, double tol_out, double tol_grad, const LayerOptions& lo = {}) {
  Golden g = load_golden();
  DeviceRun r = device_forward_backward(dev, g.layout, g.weights, g.ids, g.targets, g.shape, -1, lo);
  HostTensor loss = g.get("loss"), logits = g.get("logits");
  EXPECT_NEAR(r.count, loss.data[1], 0.5);
  EXPECT_NEAR(r.loss_sum, loss.data[0], tol_out * std::abs(loss.data[0]));
  ASSERT_EQ(r.logits.size(), logits.data.size());
  EXPECT_LT(rel(r.logits.data(), logits.data.data(), logits.data.size()), tol_out) << "logits";
  int checked = 0, experts = 0;
  const int L = int(g.layout.config.num_hidden_layers);
  for (int gi = L + 2; gi < int(g.layout.groups.size()); ++gi)
    for (auto& t : g.layout.groups[size_t(gi)].tensors) {
      HostTensor want = g.get("grad." + t.name);
      ASSERT_EQ(int64_t(want.data.size()), t.numel()) << t.name;
      EXPECT_LT(rel(r.grads[size_t(gi)].data() + t.offset, want.data.data(), want.data.size()), tol_grad)
          << "d/d " << t.name;
      ++checked;
      experts += t.name.find(".mlp.experts.") != std::string::npos;
    }
  EXPECT_EQ(checked, 2 * 4 * L + 5);  // q, k, v, o per layer; the sparse layer's five expert tensors
  EXPECT_EQ(experts, 5);
}

// Grouped expert GEMMs ("expert_gemm": "grouped") on the unpadded layout.
DeviceOptions grouped() {
  DeviceOptions o;
  o.expert_gemm_bucketed = false;
  return o;
}
TEST(LoraExpertsPeft, CpuBackendMatchesPeftFp32) {
  auto dev = make_cpu_device(0, grouped());
  EXPECT_EQ(dev->ops().expert_gemm(), ExpertGemm::grouped);
  check(*dev, 1e-5, 1e-5);
}

// bf16 storage against PEFT in fp32, at the tolerances of the dense adapters' parity test.
TEST(LoraExpertsPeft, CudaBackendMatchesPeftBf16) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto dev = make_cuda_device(0, grouped());
  EXPECT_EQ(dev->ops().expert_gemm(), ExpertGemm::grouped);
  check(*dev, 2e-2, 8e-2);
}

// The same with the padded expert layout and bucketed expert GEMMs ("expert_gemm": "bucketed",
// the default): the device's ops batch the experts, the layers pad their sorted rows.
DeviceOptions bucketed() {
  DeviceOptions o;
  o.expert_gemm_bucketed = true;
  return o;
}
LayerOptions padded() {
  LayerOptions lo;
  lo.expert_padded = true;
  return lo;
}
TEST(LoraExpertsPeft, CpuBackendBucketedMatchesPeftFp32) {
  auto dev = make_cpu_device(0, bucketed());
  EXPECT_EQ(dev->ops().expert_gemm(), ExpertGemm::bucketed);
  check(*dev, 1e-5, 1e-5, padded());
}
TEST(LoraExpertsPeft, CudaBackendBucketedMatchesPeftBf16) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";
  auto dev = make_cuda_device(0, bucketed());
  EXPECT_EQ(dev->ops().expert_gemm(), ExpertGemm::bucketed);
  check(*dev, 2e-2, 8e-2, padded());
}

TEST(LoraExpertsPeft, ReadsPeftsAdapterFolder) {
  Golden g = load_golden();
  const PeftAdapter a = read_peft_adapter(kDir + "/adapter");
  EXPECT_EQ(a.lora.target_parameters,
            (std::vector<std::string>{"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));
  EXPECT_EQ(a.lora.target_modules, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));
  std::vector<std::vector<float>> groups = g.weights;
  for (size_t gi = size_t(g.layout.num_layers()); gi < groups.size(); ++gi)
    std::fill(groups[gi].begin(), groups[gi].end(), 0.f);
  load_peft_adapter(a, g.layout, groups);
  for (size_t gi = size_t(g.layout.num_layers()); gi < groups.size(); ++gi)
    EXPECT_EQ(groups[gi], g.weights[gi]) << g.layout.groups[gi].name;  // PEFT's values, exactly
  // a run that adapts only the attention refuses it, naming the key
  LoraConfig attn = *g.layout.lora;
  attn.target_parameters.clear();
  const ModelLayout other = make_layout(g.base.config, attn);
  std::vector<std::vector<float>> og(other.groups.size());
  for (size_t gi = 0; gi < og.size(); ++gi) og[gi].assign(size_t(other.groups[gi].numel), 0.f);
  try {
    load_peft_adapter(a, other, og);
    ADD_FAILURE() << "loaded an expert adapter into a run without expert adapters";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("target_parameters"), std::string::npos) << e.what();
  }
}

TEST(LoraExpertsPeft, ExportIsWhatPeftSaves) {
  Golden g = load_golden();
  const fs::path d = fs::temp_directory_path() / fmt::format("rp_expert_export_{}", ::getpid());
  save_peft_adapter(d.string(), g.layout, pointers(g.weights), "");
  SafetensorsFile ours((d / kAdapterWeightsFile).string()), peft(kDir + "/adapter/" + kAdapterWeightsFile);
  ASSERT_EQ(ours.entries().size(), peft.entries().size());
  for (const auto& e : peft.entries()) {
    const auto* o = ours.find(e.name);
    ASSERT_NE(o, nullptr) << e.name;
    const HostTensor a = ours.read_f32(*o), b = peft.read_f32(e);
    EXPECT_EQ(a.shape, b.shape) << e.name;
    EXPECT_EQ(a.data, b.data) << e.name;
  }
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(d / kAdapterConfigFile));
  EXPECT_EQ(cfg.at("target_parameters"),
            nlohmann::json({"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}));
  EXPECT_EQ(cfg.at("target_modules"), nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj"}));
  EXPECT_EQ(cfg.at("lora_dropout"), 0.0);
  // and back: the same values in the runtime's layout
  const PeftAdapter back = read_peft_adapter(d.string());
  std::vector<std::vector<float>> groups = g.weights;
  load_peft_adapter(back, g.layout, groups);
  EXPECT_EQ(groups, g.weights);
  fs::remove_all(d);
}

TEST(LoraExpertsPeft, MergedWeightsGivePeftsLogits) {
  Golden g = load_golden();
  const MergedWeights m = merge_adapters(g.layout, pointers(g.weights));
  auto dev = make_cpu_device(0, {});
  DeviceRun r = device_forward_backward(*dev, m.layout, m.groups, g.ids, g.targets, g.shape);
  HostTensor logits = g.get("logits");
  EXPECT_LT(rel(r.logits.data(), logits.data.data(), logits.data.size()), 1e-5);
  // merging PEFT's folder onto the base model gives the same weights
  LoadedModel base = load_model(kDir);
  merge_peft_adapter(base, read_peft_adapter(kDir + "/adapter"));
  std::vector<std::vector<float>> from_folder;
  fill_groups(base, m.layout, from_folder);
  for (size_t gi = 0; gi < from_folder.size(); ++gi)
    EXPECT_LT(rel(from_folder[gi].data(), m.groups[gi].data(), from_folder[gi].size()), 1e-7) << gi;
}

// The export of attention-only adapters on a MoE model names no MLP module PEFT would map onto
// the experts; a dense MLP projection of a mixed model is written as its full path.
TEST(LoraExpertsPeft, ExportTargetsOnlyWhatWasTrained) {
  Golden g = load_golden();
  LoraConfig l = *g.layout.lora;
  l.target_parameters.clear();
  l.target_modules = {"q_proj", "v_proj", "down_proj"};
  const nlohmann::json cfg = peft_adapter_config(make_layout(g.base.config, l), "");
  EXPECT_EQ(cfg.at("target_modules"), nlohmann::json({"q_proj", "v_proj", "model.layers.1.mlp.down_proj"}));
  EXPECT_FALSE(cfg.contains("target_parameters"));
  l.target_modules.clear();
  l.target_parameters = {"down_proj"};
  const nlohmann::json only = peft_adapter_config(make_layout(g.base.config, l), "");
  EXPECT_TRUE(only.at("target_modules").is_null());
  EXPECT_EQ(only.at("target_parameters"), nlohmann::json({"mlp.experts.down_proj"}));
}

// On a model whose decoder layers are all sparse, "all-linear" adapts the attention alone; the
// folder says so (target_modules q, k, v, o) and a run with the same spec takes it back (a
// resume compares the folder with the run's adapters, not with the seven names all-linear
// stands for).
TEST(LoraExpertsPeft, AllLinearOnAnAllSparseModelReadsBack) {
  Golden g = load_golden();
  ModelConfig c = g.base.config;
  c.mlp_only_layers.clear();
  c.decoder_sparse_step = 1;
  ASSERT_EQ(c.num_moe_layers(), c.num_hidden_layers);
  LoraConfig l = *g.layout.lora;
  l.target_modules = {"all-linear"};
  const ModelLayout layout = make_layout(c, l);
  std::vector<std::vector<float>> w;
  for (const auto& grp : layout.groups) w.emplace_back(size_t(grp.numel), 0.25f);
  const fs::path d = fs::temp_directory_path() / fmt::format("rp_all_sparse_{}", ::getpid());
  save_peft_adapter(d.string(), layout, pointers(w), "");
  const PeftAdapter a = read_peft_adapter(d.string());
  EXPECT_EQ(a.lora.target_modules, (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));
  std::vector<std::vector<float>> back = w;
  for (size_t gi = size_t(layout.num_layers()); gi < back.size(); ++gi)
    std::fill(back[gi].begin(), back[gi].end(), 0.f);
  EXPECT_NO_THROW(load_peft_adapter(a, layout, back));
  EXPECT_EQ(back, w);
  fs::remove_all(d);
}

// The stdout and stderr of shell command `cmd`; rc its exit status (-1: it did not start).
std::string command_output(const std::string& cmd, int& rc) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  rc = pclose(p);
  return out;
}

std::string peft_python() {
  const char* env = std::getenv("RP_PYTHON");
  const std::string py = env && *env ? env : "python3";
  const std::string probe = py + " -c 'import torch, transformers, peft' >/dev/null 2>&1";
  return std::system(probe.c_str()) == 0 ? py : "";
}

// PEFT loads our exports (experts + attention; attention alone) onto the base with our merge's
// logits and wraps nothing the files do not hold (tests/fixtures/peft/check_export.py).
TEST(LoraExpertsPeft, PeftLoadsOurExportWithTheLogitsOfOurMerge) {
  const std::string py = peft_python();
  if (py.empty())
    GTEST_SKIP() << "no Python with torch, transformers and peft (set RP_PYTHON=/path/to/python)";
  Golden g = load_golden();
  LoraConfig attn = *g.layout.lora;
  attn.target_parameters.clear();
  const ModelLayout attn_layout = make_layout(g.base.config, attn);
  std::vector<std::vector<float>> attn_w = g.weights;
  for (size_t gi = size_t(attn_layout.num_layers()); gi < attn_w.size(); ++gi) {  // drop the expert tensors
    std::vector<float> w(size_t(attn_layout.groups[gi].numel));
    for (const auto& t : attn_layout.groups[gi].tensors) {
      const auto& src = g.layout.groups[gi].tensors[size_t(g.layout.groups[gi].find(t.name))];
      std::copy_n(g.weights[gi].begin() + src.offset, t.numel(), w.begin() + t.offset);
    }
    attn_w[gi] = std::move(w);
  }
  const fs::path d = fs::temp_directory_path() / fmt::format("rp_expert_peft_{}", ::getpid());
  std::string cmd = py + " " + RP_FIXTURES_DIR + "/peft/check_export.py";
  int i = 0;
  using Run = std::pair<const ModelLayout*, const std::vector<std::vector<float>>*>;
  for (auto [layout, w] : {Run{&g.layout, &g.weights}, Run{&attn_layout, &attn_w}}) {
    const std::string a = (d / fmt::format("adapter{}", i)).string(),
                      m = (d / fmt::format("merged{}", i)).string();
    save_peft_adapter(a, *layout, pointers(*w), kDir);
    save_merged_checkpoint(m, *layout, pointers(*w), nullptr, "", DType::f32);
    cmd += " " + kDir + " " + a + " " + m;
    ++i;
  }
  int rc = -1;
  const std::string out = command_output(cmd, rc);
  EXPECT_EQ(rc, 0) << out;
  size_t at = 0;
  for (int k = 0; k < 2; ++k) {
    at = out.find("{\"adapter_vs_merged\"", at);
    ASSERT_NE(at, std::string::npos) << out;
    const size_t end = out.find('\n', at);
    const nlohmann::json r = nlohmann::json::parse(out.substr(at, end - at));
    std::printf("peft check %d: %s\n", k, r.dump().c_str());
    EXPECT_TRUE(r["ok"].get<bool>()) << r.dump();
    at = end;
  }
  fs::remove_all(d);
}

// GPT-OSS interleaves gate and up in its gate_up_proj (gate column f at 2f, up at 2f + 1), and
// so do the rows of PEFT's lora_B for that parameter: the export writes gate row f at row 2f and
// up row f at 2f + 1, reading the folder back (into a layout, and merged from the folder) gives
// the values again, and, with a Python that has peft, PEFT's logits with our export are those of
// our merge.
TEST(LoraExpertsPeft, GptOssGateUpRowsInterleaveAsTheParameter) {
  const std::string base_dir = std::string(RP_FIXTURES_DIR) + "/hf_gpt_oss/tiny_gpt_oss";
  const LoadedModel base = load_model(base_dir);
  const ModelConfig& c = base.config;
  ASSERT_TRUE(c.gpt_oss());
  LoraConfig lc;
  lc.r = 4;
  lc.alpha = 8;
  lc.target_parameters = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
  const ModelLayout layout = make_layout(c, lc);
  std::vector<std::vector<float>> w;
  fill_groups(base, make_layout(c), w);
  uint32_t state = 12345;
  for (size_t gi = w.size(); gi < layout.groups.size(); ++gi) {
    std::vector<float> v(size_t(layout.groups[gi].numel));
    for (float& x : v) x = float((state = state * 1664525u + 1013904223u) >> 8) / float(1 << 24) - 0.5f;
    w.push_back(std::move(v));
  }
  const int ag = layout.adapter_group(1);
  const ParamGroup& g = layout.groups[size_t(ag)];
  const int64_t E = c.num_experts, Fe = c.moe_intermediate_size, r = lc.r;
  const float* gate = w[size_t(ag)].data() +
                      g.tensors[size_t(g.find("model.layers.0.mlp.experts.gate_proj.lora_B.weight"))].offset;
  const float* up = w[size_t(ag)].data() +
                    g.tensors[size_t(g.find("model.layers.0.mlp.experts.up_proj.lora_B.weight"))].offset;
  const auto peft = peft_expert_tensors(layout, 0, w[size_t(ag)].data());
  const HostTensor& b = peft.at("model.layers.0.mlp.experts.base_layer.lora_B.weight");
  ASSERT_EQ(b.shape, (std::vector<int64_t>{2 * Fe, r * E}));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t f = 0; f < Fe; ++f)
      for (int64_t q = 0; q < r; ++q) {
        ASSERT_EQ(b.data[size_t((2 * f) * r * E + q * E + e)], gate[(e * Fe + f) * r + q])
            << e << " " << f << " " << q;
        ASSERT_EQ(b.data[size_t((2 * f + 1) * r * E + q * E + e)], up[(e * Fe + f) * r + q])
            << e << " " << f << " " << q;
      }
  const fs::path d = fs::temp_directory_path() / fmt::format("rp_gpt_oss_peft_{}", ::getpid());
  const std::string a = (d / "adapter").string(), m = (d / "merged").string();
  save_peft_adapter(a, layout, pointers(w), base_dir);
  std::vector<std::vector<float>> back = w;
  for (size_t gi = size_t(layout.num_layers()); gi < back.size(); ++gi)
    std::fill(back[gi].begin(), back[gi].end(), 0.f);
  load_peft_adapter(read_peft_adapter(a), layout, back);
  EXPECT_EQ(back, w);
  const MergedWeights merged = merge_adapters(layout, pointers(w));
  LoadedModel folded = load_model(base_dir);
  merge_peft_adapter(folded, read_peft_adapter(a));
  std::vector<std::vector<float>> from_folder;
  fill_groups(folded, merged.layout, from_folder);
  for (size_t gi = 0; gi < from_folder.size(); ++gi)
    EXPECT_LT(rel(from_folder[gi].data(), merged.groups[gi].data(), from_folder[gi].size()), 1e-6) << gi;
  const std::string py = peft_python();
  if (!py.empty()) {
    save_merged_checkpoint(m, layout, pointers(w), nullptr, "", DType::f32);
    const std::string cmd =
        py + " " + RP_FIXTURES_DIR + "/peft/check_export.py " + base_dir + " " + a + " " + m;
    int rc = -1;
    const std::string out = command_output(cmd, rc);
    EXPECT_EQ(rc, 0) << out;
    const size_t at = out.find("{\"adapter_vs_merged\"");
    ASSERT_NE(at, std::string::npos) << out;
    const nlohmann::json res = nlohmann::json::parse(out.substr(at, out.find('\n', at) - at));
    std::printf("peft check (GPT-OSS): %s\n", res.dump().c_str());
    EXPECT_TRUE(res["ok"].get<bool>()) << res.dump();
  }
  fs::remove_all(d);
}

}  // namespace
}  // namespace rp::test
