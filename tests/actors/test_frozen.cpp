// Frozen parameter groups (ParamGroup::frozen, the base of LoRA training) in the runtime:
//  - a tiny model with groups frozen in f32, bf16 and q8_0 trains like the sequential reference
//    (tests/actors/runtime_reference.hpp) that computes with the dequantized frozen weights,
//    gives the frozen groups no gradient and updates only the trainable ones; the frozen
//    groups stay bit-identical; clipping sees the trainable gradients only;
//  - no protocol message names a frozen group, its uploads are its storage bytes and no
//    gradient of it is downloaded (byte totals of the param_up / grad_down tracks);
//  - the storage-form constructor equals the fp32 one, and a save / load of the optimizer
//    state with frozen groups resumes bit for bit;
//  - the pin budget pins every pass's buffers, then the gradient slots and trainable weights,
//    then the frozen weights, and a run with nothing pinned trains alike.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/session_testing.hpp"
#include "base/host_resources.hpp"
#include "tests/actors/runtime_reference.hpp"
#include "trace/chrome_trace.hpp"

namespace rp::test {
namespace {

constexpr int64_t kNSeq = 2, kSeqLen = 5, kM = 3;

struct FrozenCase {
  bool qwen3, tied;
  std::vector<std::pair<int, WeightFormat>> frozen;  // (group, base format)
  int mixed = -1;  // an f32 group whose norms are moved behind its compute copy, stored in bf16
};

// qwen3 tied: the frozen embedding is also the tied LM head (null dW in the cross-entropy) and
// frozen decoders have q/k norms (null rmsnorm dw); llama untied: a frozen q8_0 LM head, and one
// with the embedding, a decoder and the LM head in fp8 (a scale per row of each matrix). f32
// groups are the CPU device's compute copy itself (ParamGroup::direct_bytes: uploaded straight
// into the weights); the mixed one is uploaded partly so and partly through a staging buffer,
// as a bf16 base with f32 norms is on a bf16 GPU.
std::vector<FrozenCase> cases() {
  return {{true, true, {{0, WeightFormat::bf16}, {2, WeightFormat::q8_0}, {4, WeightFormat::f32}}},
          {false, false, {{1, WeightFormat::bf16}, {3, WeightFormat::q8_0}, {5, WeightFormat::q8_0}}},
          {true, false, {{1, WeightFormat::f32}, {3, WeightFormat::bf16}}, 1},
          {false, false, {{0, WeightFormat::fp8}, {2, WeightFormat::fp8}, {5, WeightFormat::fp8}}}};
}

// Group g (frozen in f32) keeps its matrices where they are and stores its 1-D tensors in bf16
// after its compute copy.
void move_norms_behind(ModelLayout& m, int g) {
  ParamGroup& grp = m.groups[size_t(g)];
  int moved = 0;
  for (TensorSpec& t : grp.tensors) {
    if (t.shape.size() != 1) continue;
    t.format = WeightFormat::bf16;
    t.byte_offset = grp.storage_bytes;
    grp.storage_bytes += t.numel() * 2;
    ++moved;
  }
  ASSERT_GT(moved, 0);
  ASSERT_EQ(grp.direct_bytes(DType::f32), grp.numel * 4);
  ASSERT_LT(grp.direct_bytes(DType::f32), grp.storage_bytes);
}

ModelLayout frozen_layout(const FrozenCase& fc) {
  ModelLayout m = make_layout(tiny_config(fc.qwen3, fc.tied));
  for (auto [g, f] : fc.frozen) freeze_group(m, g, f);
  if (fc.mixed >= 0) move_norms_behind(m, fc.mixed);
  return m;
}

std::vector<int32_t> ids_of(int t, std::vector<int32_t>* targets) {
  std::vector<int32_t> ids;
  random_tokens(67, kM * kNSeq * kSeqLen, 100 + uint64_t(t) * 10, ids, *targets);
  return ids;
}

TestSessionOptions options(bool async, int workers, double clip = 0) {
  TestSessionOptions o;
  o.workers = workers;
  o.micro_batches = kM;
  o.micro = {kNSeq, kSeqLen};
  o.async = async;
  o.adam = adam_opts();
  o.shards = 2;
  o.max_grad_norm = clip;
  return o;
}

struct Result {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> weights;  // group_weights_f32 of every group
};

Result run_session(Session& s, int steps, int first = 0) {
  Result r;
  for (int t = first; t < first + steps; ++t) {
    std::vector<int32_t> tg, ids = ids_of(t, &tg);
    s.forward_backward(ids, tg);
    s.step(lr_at(t));
  }
  for (int t = first; t < first + steps; ++t) {
    StepResult sr = s.wait(t);
    r.losses.push_back(sr.loss_sum / sr.tokens);
    r.norms.push_back(sr.grad_norm);
  }
  s.synchronize();
  for (int g = 0; g < int(s.layout().groups.size()); ++g) r.weights.push_back(s.group_weights_f32(g));
  return r;
}

// Staleness-s loop over the computed weights; frozen groups get no gradient and no update.
Result run_reference(const ModelLayout& m, bool async, int steps, double clip) {
  auto w = computed_weights(m, random_weights(m, 7));
  std::vector<std::vector<std::vector<float>>> versions{w};
  std::vector<TextbookAdamW> opt(m.groups.size());
  Result out;
  for (int t = 0; t < steps; ++t) {
    const auto& used = versions[size_t(std::max(0, t - (async ? 1 : 0)))];
    std::vector<std::vector<double>> grads(m.groups.size());
    for (size_t g = 0; g < grads.size(); ++g) grads[g].assign(w[g].size(), 0.0);
    double loss = 0, count = 0;
    std::vector<int32_t> tg, ids = ids_of(t, &tg);
    sequential_forward_backward(m, used, ids, tg, kM, {kNSeq, kSeqLen}, grads, loss, count);
    out.losses.push_back(loss / count);
    double sumsq = 0;
    for (size_t g = 0; g < grads.size(); ++g)
      for (auto& x : grads[g]) x /= count, sumsq += x * x;
    const double norm = std::sqrt(sumsq);
    out.norms.push_back(norm);
    const double coef = clip > 0 ? std::min(1.0, clip / (norm + 1e-6)) : 1.0;
    for (size_t g = 0; g < grads.size(); ++g) {
      if (m.groups[g].frozen) continue;
      for (auto& x : grads[g]) x *= coef;
      opt[g].step(w[g], grads[g], adam_opts(), lr_at(t));
    }
    versions.push_back(w);
  }
  out.weights = w;
  return out;
}

TEST(FrozenGroups, TrainLikeTheReferenceAndStayBitIdentical) {
  for (const FrozenCase& fc : cases())
    for (bool async : {true, false})
      for (double clip : {0.0, 0.05}) {
        SCOPED_TRACE(fmt::format("{} {}, {}, clip {}", fc.qwen3 ? "qwen3" : "llama",
                                 fc.tied ? "tied" : "untied", async ? "async" : "sync", clip));
        const ModelLayout m = frozen_layout(fc);
        const Result ref = run_reference(m, async, 3, clip);
        TestSessionOptions o = options(async, 2, clip);
        if (fc.mixed >= 0) o.transfer_chunk_bytes = 100;  // chunks that span the direct prefix's end
        TestSession s(m, random_weights(m, 7), o);
        for (const auto& gf : fc.frozen)
          EXPECT_TRUE(s.master_weights()[size_t(gf.first)].empty()) << "group " << gf.first;
        const Result got = run_session(s, 3);
        if (!async) {  // an evaluation pass reads the final weights (frozen ones dequantized too)
          std::vector<int32_t> tg, ids = ids_of(7, &tg);
          const EvalResult e = s.wait_eval(s.evaluate(ids, tg));
          std::vector<std::vector<double>> unused(m.groups.size());
          for (size_t g = 0; g < m.groups.size(); ++g) unused[g].assign(size_t(m.groups[g].numel), 0.0);
          double loss = 0, count = 0;
          sequential_forward_backward(m, ref.weights, ids, tg, kM, {kNSeq, kSeqLen}, unused, loss, count);
          EXPECT_NEAR(e.loss_sum / e.tokens, loss / count, 1e-5 * loss / count);
        }
        const auto initial = computed_weights(m, random_weights(m, 7));
        for (size_t t = 0; t < ref.losses.size(); ++t) {
          EXPECT_NEAR(got.losses[t], ref.losses[t], 1e-5 * ref.losses[t]) << "step " << t;
          if (clip > 0) {
            EXPECT_NEAR(got.norms[t], ref.norms[t], 1e-4 * ref.norms[t]) << "step " << t;
          }
        }
        if (clip > 0) {
          EXPECT_GT(ref.norms[0], clip);  // clipping is active
        }
        for (size_t g = 0; g < m.groups.size(); ++g) {
          if (m.groups[g].frozen) {  // exactly the dequantized storage, before and after
            ASSERT_EQ(got.weights[g].size(), initial[g].size());
            EXPECT_EQ(std::memcmp(got.weights[g].data(), initial[g].data(), initial[g].size() * 4), 0)
                << "frozen group " << g << " changed";
          } else {
            EXPECT_GT(rel_err(got.weights[g], initial[g]), 1e-4) << "group " << g << " did not train";
            EXPECT_LT(rel_err(got.weights[g], ref.weights[g]), 1e-5) << "group " << g;
          }
        }
      }
}

// Every message of the protocol that names a group names a trainable one, the parameter
// uploads carry the frozen groups' storage bytes (also a group uploaded partly into its
// weights and partly into a staging buffer), and only trainable gradients come down.
TEST(FrozenGroups, NoProtocolTrafficAndStorageSizedUploads) {
  for (const FrozenCase& fc : {cases()[0], cases()[2]}) {  // the mixed group: two copies, storage-sized
    const ModelLayout m = frozen_layout(fc);
    TestSessionOptions o = options(true, 2, 0.05);
    o.trace = true;
    o.trace_messages = true;
    o.transfer_chunk_bytes = 0;  // whole copies
    const IterationPlan plan = make_default_plan(m.num_layers(), 2);
    o.plan = plan;
    const int steps = 2;
    std::string path = (std::filesystem::temp_directory_path() / "rp_frozen_trace.json").string();
    {
      TestSession s(m, random_weights(m, 7), o);
      run_session(s, steps);
      s.write_trace(path);
    }
    const nlohmann::json j = read_trace_json(path);
    std::filesystem::remove(path);
    std::set<int> frozen;
    for (const auto& gf : fc.frozen) frozen.insert(gf.first);
    std::map<std::pair<int64_t, int64_t>, std::string> track;
    for (const auto& e : j["traceEvents"])
      if (e["ph"] == "M" && e["name"] == "thread_name") track[{e["pid"], e["tid"]}] = e["args"]["name"];
    double param_bytes = 0, grad_bytes = 0;
    int messages_with_group = 0;
    for (const auto& e : j["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const std::string name = track[{e["pid"], e["tid"]}];
      if (e.contains("args") && e["args"].contains("group")) {
        ++messages_with_group;
        EXPECT_FALSE(frozen.count(e["args"]["group"].get<int>()))
            << e["name"] << " names frozen group " << e["args"]["group"];
      }
      if (!e.contains("args") || !e["args"].contains("bytes")) continue;
      if (name.find("param_up") != std::string::npos) param_bytes += e["args"]["bytes"].get<double>();
      if (name.find("grad_down") != std::string::npos) grad_bytes += e["args"]["bytes"].get<double>();
    }
    EXPECT_GT(messages_with_group, 0);
    double want_param = 0, want_grad = 0;  // per pass, one pass per step
    for (const Stage& st : plan.stages) {
      for (int g : m.groups_uploaded(st.layers(), st.kind == StageKind::backward)) {
        const ParamGroup& grp = m.groups[size_t(g)];
        want_param += grp.frozen ? double(grp.storage_bytes) : double(grp.numel) * 4;
      }
      if (st.kind != StageKind::forward)
        for (int g : m.groups_of(st.layers()))
          if (!m.groups[size_t(g)].frozen) want_grad += double(m.groups[size_t(g)].numel) * 4;
    }
    EXPECT_EQ(param_bytes, steps * want_param);
    EXPECT_EQ(grad_bytes, steps * want_grad);
  }
}

// A session given the frozen groups in storage form computes exactly what one given fp32
// computes; a run saved after 2 steps and resumed (from storage form) ends bit-identical to
// an uninterrupted run of 4; the state file holds no frozen group.
TEST(FrozenGroups, StorageFormConstructorAndExactResume) {
  for (const FrozenCase& fc : cases()) {
    const ModelLayout m = frozen_layout(fc);
    const auto storage_form = [&] {
      std::vector<std::vector<uint8_t>> st(m.groups.size());
      auto w = random_weights(m, 7);
      for (size_t g = 0; g < m.groups.size(); ++g) {
        if (!m.groups[g].frozen) continue;
        st[g].resize(size_t(m.groups[g].storage_bytes));
        for (const TensorSpec& t : m.groups[g].tensors)
          quantize_weights(t.format, w[g].data() + t.offset, st[g].data() + t.byte_offset, t.numel(),
                           weight_format_cols(t.shape));
      }
      return st;
    };
    const auto trainable_only = [&] {
      auto w = random_weights(m, 7);
      for (size_t g = 0; g < m.groups.size(); ++g)
        if (m.groups[g].frozen) w[g].clear();
      return w;
    };
    const std::string path = (std::filesystem::temp_directory_path() / "rp_frozen_state.bin").string();
    Result straight;
    {
      TestSession s(m, random_weights(m, 7), options(true, 2));
      straight = run_session(s, 4);
    }
    {
      TestSession s(m, random_weights(m, 7), options(true, 2));
      run_session(s, 2);
      s.save_optimizer_state(path);
    }
    Session resumed(m, trainable_only(), storage_form(), options(true, 2));
    const OptimizerStateInfo info = resumed.load_optimizer_state(path);
    EXPECT_EQ(info.steps, 2);
    const Result rest = run_session(resumed, 2, 2);
    for (size_t g = 0; g < m.groups.size(); ++g)
      EXPECT_EQ(std::memcmp(rest.weights[g].data(), straight.weights[g].data(), rest.weights[g].size() * 4),
                0)
          << "group " << g;
    for (int t = 0; t < 2; ++t) EXPECT_EQ(rest.losses[size_t(t)], straight.losses[size_t(t) + 2]);
    // the file lists the trainable groups only: a layout with other groups frozen is refused
    ModelLayout other = make_layout(tiny_config(fc.qwen3, fc.tied));
    Session plain(other, random_weights(other, 7), options(true, 2));
    EXPECT_THROW(plain.load_optimizer_state(path), std::runtime_error);
    std::filesystem::remove(path);
  }
}

// LoRA on a base frozen in fp8 (e4m3 with a scale per row) trains close to the same run on a
// bf16 base: same weights, adapters and batches, losses within 2% at every step (e4m3's 3
// mantissa bits put each weight within 1/16 of itself; the errors average out over a row's
// products), not bit-identical to it (the fp8 storage is in use), and closer to it than the
// same run on a q4_0 base.
TEST(FrozenGroups, LoraOnAnFp8BaseTrainsLikeOnABf16Base) {
  const auto run = [](WeightFormat base) {
    LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.target_modules = {"all-linear"};
    lc.base_format = base;
    const ModelLayout m = make_layout(tiny_config(false, false), lc);
    for (const ParamGroup& g : m.groups)
      for (const TensorSpec& t : g.tensors)
        if (g.frozen && t.shape.size() == 2) {
          EXPECT_EQ(t.format, base) << t.name;
        }
    TestSession s(m, random_weights(m, 7), options(true, 2));
    return run_session(s, 4);
  };
  const Result fp8 = run(WeightFormat::fp8), bf16 = run(WeightFormat::bf16), q4 = run(WeightFormat::q4_0);
  ASSERT_EQ(fp8.losses.size(), 4u);
  double fp8_off = 0, q4_off = 0;
  for (size_t t = 0; t < fp8.losses.size(); ++t) {
    EXPECT_NEAR(fp8.losses[t], bf16.losses[t], 0.02 * bf16.losses[t]) << "step " << t;
    fp8_off += std::fabs(fp8.losses[t] - bf16.losses[t]);
    q4_off += std::fabs(q4.losses[t] - bf16.losses[t]);
  }
  EXPECT_GT(fp8_off, 0) << "the fp8 base computed exactly what the bf16 base did";
  // 8 bits with a scale per row sit closer to bf16 than 4 bits with a scale per 32
  EXPECT_LT(fp8_off, 0.5 * q4_off) << "fp8 off by " << fp8_off << ", q4_0 by " << q4_off;
}

TEST(FrozenGroups, ConstructorRejectsInconsistentWeights) {
  const ModelLayout m = frozen_layout(cases()[0]);
  std::vector<std::vector<uint8_t>> st(m.groups.size());
  st[1].resize(10);  // group 1 is trainable
  EXPECT_THROW(Session(m, random_weights(m, 7), st, options(true, 1)), std::invalid_argument);
  st[1].clear();
  st[2].resize(size_t(m.groups[2].storage_bytes) - 1);  // frozen, one byte short
  auto w = random_weights(m, 7);
  w[2].clear();
  EXPECT_THROW(Session(m, w, st, options(true, 1)), std::invalid_argument);
  st[2].resize(size_t(m.groups[2].storage_bytes));
  EXPECT_THROW(Session(m, random_weights(m, 7), st, options(true, 1)), std::invalid_argument);  // given twice
  EXPECT_THROW(Session(m, random_weights(m, 7), options(true, 1)).group_weights_f32(99), std::out_of_range);
}

}  // namespace
}  // namespace rp::test

namespace rp::test {
namespace {

// The budget is spent in order: pass buffers, gradient slots and trainable weights (f32 on the
// CPU backend: numel * 4 bytes each), frozen weights (storage_bytes); a buffer that does not
// fit what is left stays pageable. Budgets cut exactly at each class boundary must leave
// exactly the later classes pageable.
TEST(FrozenGroups, PinBudgetPinsPassBuffersThenTrainableStateThenFrozenWeights) {
  const FrozenCase fc = cases()[1];
  const ModelLayout m = frozen_layout(fc);
  size_t frozen = 0, trainable = 0;
  for (const ParamGroup& g : m.groups)
    (g.frozen ? frozen : trainable) += g.frozen ? size_t(g.storage_bytes) : size_t(g.numel) * 4 * 2;
  ASSERT_GT(frozen, 0u);
  const auto run = [&](std::optional<size_t> budget, Result* out) {
    TestSessionOptions o = options(true, 2);
    o.pin_budget_bytes = budget;
    TestSession s(m, random_weights(m, 7), o);
    if (out) *out = run_session(s, 2);
    return s.host_pinning();
  };
  Result all_pinned, none_pinned;
  const HostPinning all = run(size_t(1) << 50, &all_pinned);
  EXPECT_EQ(all.pageable_bytes, 0u);
  ASSERT_GT(all.pinned_bytes, frozen + trainable);  // plus the pass buffers
  const size_t pass = all.pinned_bytes - frozen - trainable;

  const HostPinning no_frozen = run(pass + trainable, nullptr);
  EXPECT_EQ(no_frozen.pinned_bytes, pass + trainable);
  EXPECT_EQ(no_frozen.pageable_bytes, frozen);
  EXPECT_EQ(no_frozen.pageable_frozen_bytes, frozen);

  const HostPinning pass_only = run(pass, nullptr);
  EXPECT_EQ(pass_only.pinned_bytes, pass);
  EXPECT_EQ(pass_only.pageable_bytes, frozen + trainable);
  EXPECT_EQ(pass_only.pageable_frozen_bytes, frozen);

  const HostPinning none = run(0, &none_pinned);
  EXPECT_EQ(none.pinned_bytes, 0u);
  EXPECT_EQ(none.pageable_bytes, all.pinned_bytes);
  for (size_t g = 0; g < m.groups.size(); ++g)
    EXPECT_EQ(std::memcmp(none_pinned.weights[g].data(), all_pinned.weights[g].data(),
                          none_pinned.weights[g].size() * 4),
              0)
        << "group " << g;
  EXPECT_EQ(none_pinned.losses, all_pinned.losses);

  EXPECT_EQ(run(std::nullopt, nullptr).budget, host_total_bytes() / 4 * 3);  // the default
}

}  // namespace
}  // namespace rp::test
