// Analytic cost model of mixture-of-experts (Qwen3-MoE) models: a sparse decoder counts the
// FLOPs of its router and k routed experts but the bytes of all E experts; dense decoders of
// a MoE model (mlp_only_layers, decoder_sparse_step) count as dense; parameter counts agree
// with ModelConfig's; the predicted scratch is what the layers of model/layers.cpp ask for.
#include <gtest/gtest.h>

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/device.hpp"
#include "kernels/moe_buckets.hpp"
#include "model/config.hpp"
#include "model/layer.hpp"
#include "model/layout.hpp"
#include "scheduler/cost_model.hpp"
#include "scheduler/partition.hpp"

namespace rp {
namespace {

// 4 decoders: 0 and 2 sparse; 1 dense by mlp_only_layers; 3 sparse
ModelShape small_moe() {
  ModelShape m;
  m.vocab_size = 1000, m.hidden_size = 256, m.intermediate_size = 768, m.num_layers = 4;
  m.num_heads = 4, m.num_kv_heads = 2, m.head_dim = 64, m.qk_norm = true;
  m.num_experts = 16, m.experts_per_token = 2, m.moe_intermediate_size = 128;
  m.mlp_only_layers = {1};
  return m;
}

std::string fixture_config() { return std::string(RP_FIXTURES_DIR) + "/hf_moe/tiny_qwen3_moe/config.json"; }

TEST(CostModelMoe, SparseLayerFlopsCountTopKExpertsBytesCountAllExperts) {
  const ModelShape m = small_moe();
  DeviceModel d;
  const int64_t n_seq = 2, S = 512;
  const double T = double(n_seq * S), H = 256, F = 768, E = 16, k = 2, Fe = 128;
  auto e = estimate_layers(m, n_seq, S, d);
  ASSERT_EQ(e.size(), 6u);
  const double attn_params = H * 256 * 2 + 2.0 * H * 128;  // q, o [256, H]; k, v [128, H]
  const double attn = 2.0 * n_seq * 4 * double(S) * S * 64;
  const double sparse_gemm = attn_params + E * H + k * 3 * H * Fe;  // router + k experts
  const double dense_gemm = attn_params + 3 * H * F;
  for (int l : {1, 3, 4}) {  // decoders 0, 2, 3
    SCOPED_TRACE(l);
    EXPECT_NEAR(e[size_t(l)].fwd_flops, 2 * T * sparse_gemm + attn, 1e-9 * e[size_t(l)].fwd_flops);
    // recompute + input and weight gradients: 3x every GEMM, attention 1 + 2.5
    EXPECT_NEAR(e[size_t(l)].bwd_flops, 6 * T * sparse_gemm + 3.5 * attn, 1e-9 * e[size_t(l)].bwd_flops);
  }
  EXPECT_NEAR(e[2].fwd_flops, 2 * T * dense_gemm + attn, 1e-9 * e[2].fwd_flops);  // mlp_only layer 1
  // weights and gradients: the router and all 16 experts, norms included
  const int64_t sparse_params =
      2 * 256 + 256 * 256 * 2 + 2 * 256 * 128 + 2 * 64 + 16 * 256 + 16 * 3 * 256 * 128;
  EXPECT_EQ(layer_parameters(m, 1), sparse_params);
  EXPECT_EQ(e[1].cost.weight_bytes, sparse_params * 2);
  EXPECT_EQ(e[1].cost.grad_bytes, sparse_params * 4);
  EXPECT_EQ(layer_parameters(m, 2), 2 * 256 + 256 * 256 * 2 + 2 * 256 * 128 + 2 * 64 + 3 * 256 * 768);
  EXPECT_EQ(layer_parameters(m, 1, true), sparse_params - 14 * 3 * 256 * 128);  // 2 of 16 experts active
  // twice the experts at the same top-k: the same FLOPs, twice the expert weights
  ModelShape m2 = m;
  m2.num_experts = 32;
  auto e2 = estimate_layers(m2, n_seq, S, d);
  EXPECT_NEAR(e2[1].fwd_flops - e[1].fwd_flops, 2 * T * 16 * H, 1e-9 * e[1].fwd_flops);  // the router only
  EXPECT_EQ(e2[1].cost.weight_bytes - e[1].cost.weight_bytes, (16 * 256 + 16 * 3 * 256 * 128) * 2);
  EXPECT_EQ(e2[2].cost, e[2].cost);  // the dense layer is unchanged
  // frozen base weights: no weight gradients, 2x every GEMM in backward
  d.frozen_base = true;
  auto ef = estimate_layers(m, n_seq, S, d);
  EXPECT_NEAR(ef[1].bwd_flops, 4 * T * sparse_gemm + 3.5 * attn, 1e-9 * ef[1].bwd_flops);
}

TEST(CostModelMoe, GroupedGemmsRunAtTheirEfficiency) {
  const ModelShape m = small_moe();
  DeviceModel d;
  d.mem_bandwidth = 1e30;  // compute-bound: seconds = FLOPs / rate
  d.grouped_gemm_efficiency = 0.6;
  d.grouped_wgrad_efficiency = 0.2;
  const int64_t T = 4096;
  auto a = estimate_layers(m, 1, T, d);
  d.grouped_gemm_efficiency = 0.3;
  auto b = estimate_layers(m, 1, T, d);
  const double expert_flops = 2.0 * T * 2 * 3 * 256 * 128;  // gate, up, down of 2 experts per token
  const double slower = expert_flops / (d.peak_flops * 0.3) - expert_flops / (d.peak_flops * 0.6);
  EXPECT_NEAR(b[1].cost.fwd - a[1].cost.fwd, slower, 1e-9);
  // backward: the recompute and the input gradients at this rate, the weight gradients not
  EXPECT_NEAR(b[1].cost.bwd - a[1].cost.bwd, 2 * slower, 1e-9);
  EXPECT_DOUBLE_EQ(b[2].cost.fwd, a[2].cost.fwd);  // the dense layer has no grouped GEMMs
  d.grouped_wgrad_efficiency = 0.1;
  auto c = estimate_layers(m, 1, T, d);
  EXPECT_NEAR(c[1].cost.bwd - b[1].cost.bwd,
              expert_flops / (d.peak_flops * 0.1) - expert_flops / (d.peak_flops * 0.2), 1e-9);
  EXPECT_DOUBLE_EQ(c[1].cost.fwd, b[1].cost.fwd);
  d.grouped_gemm_efficiency = 0;
  EXPECT_THROW(estimate_layers(m, 1, T, d), std::invalid_argument);
}

// Bucketed expert GEMMs: every grouped linear of a sparse block pays bucketed_call_seconds once
// per expected bucket on top of its GEMM time; gate, up and down in the forward, and the
// recompute's three plus three input gradients and three weight gradients in the backward.
TEST(CostModelMoe, BucketedGemmsPayHostTimePerBucket) {
  const ModelShape m = small_moe();
  DeviceModel d;
  d.expert_padded = true;
  const int64_t T = 4096;
  d.bucketed_call_seconds = 0;
  auto a = estimate_layers(m, 1, T, d);
  d.bucketed_call_seconds = 1e-3;
  auto b = estimate_layers(m, 1, T, d);
  const double rows = double(T) * 2;  // top-2
  const int64_t buckets = expected_bucket_count(rows, 16);
  ASSERT_GT(buckets, 1);  // 16 experts spread 0.54-1.55 x the even share do not fit one bucket
  EXPECT_NEAR(b[1].cost.fwd - a[1].cost.fwd, 3 * double(buckets) * 1e-3, 1e-12);
  EXPECT_NEAR(b[1].cost.bwd - a[1].cost.bwd, 9 * double(buckets) * 1e-3, 1e-12);
  EXPECT_DOUBLE_EQ(b[2].cost.fwd, a[2].cost.fwd);  // the dense layer has no grouped GEMMs
  // grouped GEMMs make one call each: no such time
  d.expert_padded = false;
  auto c = estimate_layers(m, 1, T, d);
  d.bucketed_call_seconds = 0;
  auto e = estimate_layers(m, 1, T, d);
  EXPECT_DOUBLE_EQ(c[1].cost.fwd, e[1].cost.fwd);
  d.bucketed_call_seconds = -1;
  EXPECT_THROW(estimate_layers(m, 1, T, d), std::invalid_argument);
}

TEST(CostModelMoe, ParameterCountsAgreeWithModelConfig) {
  ModelConfig c = load_config_file(fixture_config());
  for (int64_t step : {1, 2}) {
    c.decoder_sparse_step = step;
    const ModelShape m = model_shape_from_config(c);
    EXPECT_EQ(m.num_moe_layers(), c.num_moe_layers());
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) EXPECT_EQ(m.is_moe_layer(i), c.is_moe_layer(i)) << i;
    EXPECT_EQ(model_parameters(m), c.num_parameters()) << "step " << step;
    EXPECT_EQ(model_parameters(m, true), c.num_active_parameters()) << "step " << step;
    // and the layout's groups hold what layer_parameters counts
    const ModelLayout lay = make_layout(c);
    for (int l = 0; l <= int(c.num_hidden_layers); ++l)
      EXPECT_EQ(layer_parameters(m, l), lay.groups[size_t(l)].numel) << l;
  }
}

TEST(CostModelMoe, ShapeFromConfigJsonAcceptsBothExpertKeys) {
  std::ifstream f(fixture_config());
  nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_TRUE(j.contains("num_local_experts"));  // as transformers 5 writes it
  ModelShape a = model_shape_from_hf_json(j, "config.json");
  EXPECT_EQ(a.num_experts, 8);
  EXPECT_EQ(a.experts_per_token, 2);
  EXPECT_EQ(a.mlp_only_layers, std::vector<int64_t>{1});
  EXPECT_EQ(a.num_moe_layers(), 2);
  EXPECT_FALSE(a.is_moe_layer(1));
  j["num_experts"] = j["num_local_experts"];
  j.erase("num_local_experts");
  j["decoder_sparse_step"] = 2;
  ModelShape b = model_shape_from_hf_json(j, "config.json");
  EXPECT_EQ(b.num_experts, 8);
  EXPECT_EQ(b.num_moe_layers(), 0);  // layer 1 would be the only sparse one, and it is mlp-only
  auto expect_error = [&](const nlohmann::json& bad, const std::string& key) {
    try {
      model_shape_from_hf_json(bad, "config.json");
      ADD_FAILURE() << "accepted " << key;
    } catch (const std::invalid_argument& x) {
      const std::string w = x.what();
      EXPECT_NE(w.find(key), std::string::npos) << w;
      EXPECT_EQ(w.find('\n'), std::string::npos) << w;
    }
  };
  nlohmann::json bad = j;
  bad["num_experts_per_tok"] = 9;
  expect_error(bad, "num_experts_per_tok");
  bad["num_experts_per_tok"] = 0;
  expect_error(bad, "num_experts_per_tok");
  bad.erase("num_experts_per_tok");
  expect_error(bad, "num_experts_per_tok");
  bad = j;
  bad["mlp_only_layers"] = {1, -2};
  expect_error(bad, "mlp_only_layers");
  bad = j;
  bad.erase("moe_intermediate_size");
  expect_error(bad, "moe_intermediate_size");
  bad = j;
  bad.erase("intermediate_size");  // layers 0 and 2 are dense at step 2
  expect_error(bad, "intermediate_size");
}

// The planner's memory model and the layers: each decoder's predicted scratch (forward and
// backward) is what Layer::scratch_bytes asks for, for sparse and dense decoders of a MoE
// model, chunked or not, with saved attention, with LoRA adapters (and dropout) on a frozen
// base.
TEST(CostModelMoe, PlannedScratchEqualsTheLayersScratch) {
  const ModelConfig c = load_config_file(fixture_config());
  const MicroBatchShape s{2, 24};
  for (int lora : {0, 1, 2})  // none; all-linear with dropout; attention + the experts (no dropout)
    for (bool saved : {false, true})
      for (int64_t chunk : {0, 7}) {
        SCOPED_TRACE(fmt::format("lora {}, saved attention {}, MLP chunk {}", lora, saved, chunk));
        LoraConfig lc;
        lc.r = 4;
        lc.dropout = lora == 2 ? 0.0 : 0.1;
        lc.target_modules = {"all-linear"};
        if (lora == 2) lc.target_parameters = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
        const ModelLayout m = lora ? make_layout(c, lc) : make_layout(c);
        DeviceModel d;
        d.saved_attention = saved;
        d.mlp_chunk_tokens = chunk;
        d.scratch_elem_bytes = 2;
        lora_device_model(d, m);
        EXPECT_EQ(d.frozen_base, lora > 0);
        EXPECT_EQ(d.lora_experts_gate_up && d.lora_experts_down, lora == 2);
        const auto e = estimate_layers(model_shape_from_config(c), s.n_seq, s.seq_len, d);
        LayerOptions lo;
        lo.mlp_chunk_tokens = chunk;
        lo.save_attention = saved;
        for (int l = 1; l <= int(c.num_hidden_layers); ++l) {
          auto layer = make_layer(m, l, lo);
          EXPECT_EQ(e[size_t(l)].cost.scratch_bytes, int64_t(layer->scratch_bytes(s, DType::bf16, true)))
              << l;
          EXPECT_EQ(e[size_t(l)].cost.scratch_fwd_bytes, int64_t(layer->scratch_bytes(s, DType::bf16, false)))
              << l;
        }
        // a sparse decoder's scratch differs from the dense one's (the test can see a mix-up)
        EXPECT_NE(e[1].cost.scratch_bytes, e[2].cost.scratch_bytes);
      }
}

// The experts' adapters add their grouped GEMMs to the sparse layers' FLOPs (forward: the
// four low-rank products per routed row of gate/up and down), nothing to the dense layers'.
TEST(CostModelMoe, ExpertAdaptersAddTheirGroupedGemms) {
  const ModelConfig c = load_config_file(fixture_config());
  LoraConfig lc;
  lc.r = 8;
  lc.target_modules = {"q_proj"};
  const ModelLayout attn = make_layout(c, lc);
  lc.target_parameters = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
  const ModelLayout experts = make_layout(c, lc);
  DeviceModel da, de;
  lora_device_model(da, attn);
  lora_device_model(de, experts);
  const ModelShape shape = model_shape_from_config(c);
  const auto ea = estimate_layers(shape, 1, 32, da), ee = estimate_layers(shape, 1, 32, de);
  const double R = 32.0 * double(c.num_experts_per_tok), r = 8, H = double(c.hidden_size),
               Fe = double(c.moe_intermediate_size);
  // a = xs A^T [R, r]; a Bg^T, a Bu^T [R, Fe]; m Ad^T [R, r]; (.) Bd^T [R, H]
  EXPECT_DOUBLE_EQ(ee[1].fwd_flops - ea[1].fwd_flops, 2 * R * r * (H + 2 * Fe + Fe + H));
  EXPECT_GT(ee[1].bwd_flops, ea[1].bwd_flops + 2 * (ee[1].fwd_flops - ea[1].fwd_flops));
  EXPECT_EQ(ee[2].fwd_flops, ea[2].fwd_flops);  // the dense layer
  EXPECT_GT(ee[1].cost.scratch_bytes, ea[1].cost.scratch_bytes);
}

// Frozen groups of a MoE layout (LoRA on an nf4 base): the sparse decoders' weight bytes
// are all their experts in the compute dtype, uploaded as nf4 storage, with no gradients.
TEST(CostModelMoe, FrozenGroupsOfAMoeLayout) {
  const ModelConfig c = load_config_file(fixture_config());
  LoraConfig lc;
  lc.r = 4;
  lc.target_modules = {"all-linear"};
  lc.base_format = WeightFormat::nf4;
  const ModelLayout m = make_layout(c, lc);  // the base groups frozen in nf4
  DeviceModel d;
  lora_device_model(d, m);
  auto costs = layer_costs(estimate_layers(model_shape_from_config(c), 1, 32, d));
  const auto analytic = costs;
  apply_frozen_groups(costs, m, DType::bf16, 4);
  const int a1 = m.adapter_group(1);
  ASSERT_GE(a1, 0);
  EXPECT_EQ(costs[1].weight_bytes, analytic[1].weight_bytes + m.groups[size_t(a1)].numel * 2);
  EXPECT_EQ(costs[1].frozen_weight_bytes, analytic[1].weight_bytes);
  EXPECT_EQ(costs[1].staging_bytes, m.groups[1].storage_bytes);
  EXPECT_LT(costs[1].staging_bytes, analytic[1].weight_bytes / 3);  // nf4: ~4.5 bits per weight
  EXPECT_EQ(costs[1].grad_bytes, m.groups[size_t(a1)].numel * 4);   // the adapters only
  // a sparse layer's adapters reach attention only: fewer than the dense layer's
  EXPECT_LT(m.groups[size_t(a1)].numel, m.groups[size_t(m.adapter_group(2))].numel);
}

// A stage with a sparse decoder holds two router-statistics buffers [2E] fp32 per activation
// slot (the uploaded copy and the summed one); a stage of dense layers none.
TEST(CostModelMoe, SparseStagesHoldRouterStatisticsPerSlot) {
  const ModelShape m = small_moe();
  auto costs = layer_costs(estimate_layers(m, 1, 64, DeviceModel{}));
  EXPECT_EQ(costs[1].router_stats_bytes, 2 * 16 * 4);
  EXPECT_EQ(costs[2].router_stats_bytes, 0);  // mlp_only layer
  EXPECT_EQ(costs[0].router_stats_bytes, 0);
  auto without = costs;
  for (auto& c : without) c.router_stats_bytes = 0;
  PartitionOptions po;
  po.micro_batches = 4;  // two slots
  po.alloc_granule = 512;
  for (const Stage& st :
       {Stage{StageKind::forward, 0, 1}, Stage{StageKind::backward, 1, 3}, Stage{StageKind::tail, 4, 5}}) {
    SCOPED_TRACE(fmt::format("{} {}-{}", stage_kind_name(st.kind), st.first, st.last));
    // 2 slots x 2 buffers of 128 bytes, each charged as the pool charges a small allocation
    EXPECT_EQ(estimate_stage(costs, st, po).work_bytes - estimate_stage(without, st, po).work_bytes,
              2 * 2 * int64_t(pool_allocation_bytes(128, 512)));
  }
  for (const Stage& st : {Stage{StageKind::forward, 0, 0}, Stage{StageKind::backward, 2, 2}})
    EXPECT_EQ(estimate_stage(costs, st, po).work_bytes, estimate_stage(without, st, po).work_bytes);
}

// FP8 linears: each decoder's planned weight cache (forward: W's codes; backward and tail:
// W's and W^T's) is what Layer::fp8_weight_bytes asks the worker to allocate (a sparse
// decoder caches its attention projections only), and a stage's memory adds its layers'
// caches as the pool charges them, in estimate_stage and in the partitioner's own sums.
TEST(CostModelMoe, Fp8WeightCacheIsPlannedAsTheLayersAllocateIt) {
  const ModelConfig c = load_config_file(fixture_config());
  const ModelLayout m = make_layout(c);
  DeviceModel d;
  d.scratch_elem_bytes = 2;
  d.fp8_flops = 1e15;
  const auto e = estimate_layers(model_shape_from_config(c), 2, 32, d);
  LayerOptions lo;
  lo.fp8 = true;
  for (int l = 1; l <= int(c.num_hidden_layers); ++l) {
    auto layer = make_layer(m, l, lo);
    EXPECT_EQ(e[size_t(l)].cost.fp8_fwd_bytes, int64_t(layer->fp8_weight_bytes(false))) << l;
    EXPECT_EQ(e[size_t(l)].cost.fp8_bwd_bytes, int64_t(layer->fp8_weight_bytes(true))) << l;
    EXPECT_GT(e[size_t(l)].cost.fp8_bwd_bytes, e[size_t(l)].cost.fp8_fwd_bytes) << l;
  }
  EXPECT_NE(e[1].cost.fp8_fwd_bytes, e[2].cost.fp8_fwd_bytes);  // sparse vs dense
  EXPECT_EQ(e[0].cost.fp8_fwd_bytes, 0);                        // the embedding
  d.fp8_flops = 0;
  EXPECT_EQ(estimate_layers(model_shape_from_config(c), 2, 32, d)[1].cost.fp8_bwd_bytes, 0);

  const auto costs = layer_costs(e);
  auto without = costs;
  for (auto& x : without) x.fp8_fwd_bytes = x.fp8_bwd_bytes = 0;
  PartitionOptions po;
  po.micro_batches = 4;
  po.alloc_granule = 512;
  const int n = int(costs.size());
  for (const Stage& st : {Stage{StageKind::forward, 0, 2}, Stage{StageKind::backward, 1, 3},
                          Stage{StageKind::tail, 2, n - 1}}) {
    SCOPED_TRACE(fmt::format("{} {}-{}", stage_kind_name(st.kind), st.first, st.last));
    int64_t want = 0;
    for (int l = st.first; l <= st.last; ++l) {
      const LayerCost& x = costs[size_t(l)];
      const int64_t b = st.kind == StageKind::forward ? x.fp8_fwd_bytes : x.fp8_bwd_bytes;
      if (b > 0) want += int64_t(pool_allocation_bytes(size_t(b), 512));
    }
    EXPECT_GT(want, 0);
    EXPECT_EQ(estimate_stage(costs, st, po).work_bytes - estimate_stage(without, st, po).work_bytes, want);
  }
  const PartitionResult r = partition(costs, po);
  ASSERT_EQ(r.stages.size(), r.plan.stages.size());
  for (size_t i = 0; i < r.stages.size(); ++i)
    EXPECT_EQ(r.stages[i].work_bytes, estimate_stage(costs, r.plan.stages[i], po).work_bytes) << i;
}

}  // namespace
}  // namespace rp
