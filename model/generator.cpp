// rp::Generator (roundpipe/generate.hpp): prefill + KV-cache decoding on one device.
// The decoder math is model/layers.cpp's DecoderLayer forward (HF LlamaDecoderLayer /
// Qwen3DecoderLayer), with keys and values written to the cache rows of their positions
// and attention over the cache (Ops::attention_decode).
#include "roundpipe/generate.hpp"

#include <algorithm>
#include <cmath>
#include <future>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "kernels/device.hpp"
#include "kernels/ops.hpp"
#include "model/layers.hpp"
#include "model/moe_block.hpp"

namespace rp {

int32_t pick_token(const std::vector<float>& logits, const GenerateOptions& o, double u) {
  if (logits.empty()) throw std::invalid_argument("pick_token: no logits");
  if (o.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // HF's warpers: temperature, top-k, top-p; then a draw from the softmax of what is left
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  size_t keep = idx.size();
  if (o.top_k > 0) keep = std::min(keep, size_t(o.top_k));
  std::vector<double> p(keep);
  const double m = double(logits[size_t(idx[0])]) / o.temperature;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += p[i] = std::exp(double(logits[size_t(idx[i])]) / o.temperature - m);
  if (o.top_p < 1) {  // the smallest prefix whose probability reaches top_p (at least one token)
    double c = 0;
    size_t n = 0;
    while (n < keep && c < o.top_p * sum) c += p[n++];
    keep = std::max<size_t>(n, 1);
    sum = std::accumulate(p.begin(), p.begin() + long(keep), 0.0);
  }
  double r = u * sum;
  for (size_t i = 0; i < keep; ++i) {
    if (r < p[i]) return idx[i];
    r -= p[i];
  }
  return idx[keep - 1];
}

struct Generator::Impl {
  ModelConfig c;
  std::unique_ptr<Device> dev;
  std::vector<DeviceBuffer> groups;      // the weights, one buffer per layout group
  std::map<std::string, const void*> w;  // HF tensor name -> device pointer
  std::vector<DeviceBuffer> kc, vc;      // per decoder layer [C, nkv, D]
  int64_t C = 0;                         // cache rows
  // per decoder layer (Gemma 3's sliding layers have their own base); longrope: a call takes
  // the table of its largest position + 1, as transformers does per forward pass
  std::vector<RopeTables> ropes;
  // activations for up to `rows` tokens
  int64_t rows = 0;
  DeviceBuffer x, xn, q, qr, kr, o, h1, hn, g, u, m, y, ids, pos, lg, lg32;
  std::vector<int32_t> host_ids, host_pos;
  // sparse (mixture-of-experts) decoders: the block per decoder layer (null: dense) and its
  // forward scratch for up to `rows` tokens
  std::vector<std::unique_ptr<MoeBlock>> moe;
  DecoderDims moe_dims;
  DeviceBuffer moe_scratch;
  MoeBufs moe_bufs;

  size_t esz() const { return dtype_size(dev->compute_dtype()); }
  const void* t(const std::string& name) const {
    auto it = w.find(name);
    if (it == w.end()) throw std::invalid_argument("Generator: the model has no tensor " + name);
    return it->second;
  }
  void* at(const DeviceBuffer& b, int64_t elems) const {
    return static_cast<char*>(b.get()) + elems * int64_t(esz());
  }

  void init(const ModelLayout& layout, const std::vector<const float*>& data, const GeneratorOptions& opt);
  // init's device part: the weights' upload (copies queued from `staging`) and the KV cache
  void upload_and_reserve(const ModelLayout& layout, const std::vector<const float*>& data,
                          std::vector<std::vector<char>>& staging);
  void ensure_rows(int64_t n);
  // runs tokens ids[0..n) at positions past.. through every layer; x holds the final hidden states
  void forward(const std::vector<int32_t>& tok, int64_t past);
  std::vector<float> head(int64_t first_row, int64_t n);  // fp32 logits of rows [first_row, first_row+n)
  // longrope: whether decoding one token after `past` cached ones crosses into the long table
  // while the cache holds keys of the short one. Phi3ForCausalLM.prepare_inputs_for_generation
  // then drops its cache and recomputes the whole sequence (so every key takes the long table);
  // other families' longrope (transformers' dynamic update alone) keep their cache: new tokens
  // take the long table, the cached keys keep the short one, as here without the recompute.
  bool switches_table(int64_t past) const {
    return c.architecture == "phi3" && c.rope_scaling.type == "longrope" &&
           past == c.rope_scaling.original_max_position_embeddings;
  }
};

void Generator::Impl::init(const ModelLayout& layout, const std::vector<const float*>& data,
                           const GeneratorOptions& opt) {
  c = layout.config;
  if (data.size() != layout.groups.size())
    throw std::invalid_argument(fmt::format("Generator: {} parameter groups given, the model has {}",
                                            data.size(), layout.groups.size()));
  std::string backend = opt.backend;
  if (backend == "auto") backend = cuda_device_count() > 0 ? "cuda" : "cpu";
  DeviceOptions d;
  d.dtype = opt.dtype;
  d.capacity_bytes = size_t(1) << 40;  // one device, no emulated cap
  if (backend == "cpu") {
    dev = make_cpu_device(0, d);
    dev->ops().set_num_threads(
        int(std::max(1u, std::thread::hardware_concurrency())));  // one device: every core
  } else if (backend == "cuda") dev = make_cuda_device(0, d);
  else
    throw std::invalid_argument("Generator: unknown backend '" + backend + "' (expected cpu, cuda or auto)");
  // positions are int32 on the device
  if (opt.max_context < 0 || opt.max_context > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument(
        fmt::format("Generator: max_context: expected 0 (the model's positions) to {} positions, got {}",
                    std::numeric_limits<int32_t>::max(), opt.max_context));
  C = opt.max_context > 0
          ? opt.max_context
          : std::min<int64_t>(c.max_position_embeddings > 0 ? c.max_position_embeddings : 4096, 4096);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) ropes.push_back(layer_rope_tables(c, l));
  Stream& s = dev->stream(StreamKind::compute);
  // The stream's thread copies from `staging` into `groups` while this goes on: a throw on the
  // way (a device out of memory for a group or the KV cache) waits for those copies before
  // unwinding frees either.
  std::vector<std::vector<char>> staging;
  try {
    upload_and_reserve(layout, data, staging);
  } catch (...) {
    s.synchronize();
    throw;
  }
  s.synchronize();
}

void Generator::Impl::upload_and_reserve(const ModelLayout& layout, const std::vector<const float*>& data,
                                         std::vector<std::vector<char>>& staging) {
  Stream& s = dev->stream(StreamKind::compute);
  const DType dt = dev->compute_dtype();
  for (size_t gi = 0; gi < layout.groups.size(); ++gi) {
    const ParamGroup& g = layout.groups[gi];
    groups.emplace_back(*dev, size_t(g.numel) * esz());
    staging.emplace_back(size_t(g.numel) * esz());
    cast_f32_to(data[gi], staging.back().data(), g.numel, dt);
    s.copy_h2d(groups.back().get(), staging.back().data(), staging.back().size());
    for (const TensorSpec& ts : g.tensors) w[ts.name] = at(groups.back(), ts.offset);
  }
  if (c.tie_word_embeddings) w["lm_head.weight"] = t("model.embed_tokens.weight");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    moe.push_back(c.is_moe_layer(l) ? std::make_unique<MoeBlock>(layout, int(l) + 1) : nullptr);
  moe_dims.hidden = c.hidden_size;
  moe_dims.experts = c.num_experts;
  moe_dims.experts_per_tok = c.num_experts_per_tok;
  moe_dims.expert_ffn = c.moe_intermediate_size;
  moe_dims.expert_padded = dev->ops().expert_gemm() == ExpertGemm::bucketed;  // the ops batch padded segments
  const size_t kv = size_t(C * c.num_key_value_heads * c.head_dim) * esz();
  try {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      kc.emplace_back(*dev, kv);
      vc.emplace_back(*dev, kv);
    }
  } catch (const DeviceOutOfMemory& e) {
    throw DeviceOutOfMemory(
        fmt::format("a KV cache of {} positions (max_context, generate's --context) needs {:.1f} GiB over {} "
                    "layers, more than {} holds ({})",
                    C, double(kv) * 2 * double(c.num_hidden_layers) / double(1 << 30), c.num_hidden_layers,
                    dev->name(), e.what()));
  }
}

void Generator::Impl::ensure_rows(int64_t n) {
  if (n <= rows) return;
  rows = std::max<int64_t>(n, 16);
  const int64_t H = c.hidden_size, F = std::max<int64_t>(c.intermediate_size, 1),
                QD = c.num_attention_heads * c.head_dim, KD = c.num_key_value_heads * c.head_dim;
  auto buf = [&](int64_t elems, size_t sz) { return DeviceBuffer(*dev, size_t(rows * elems) * sz); };
  x = buf(H, esz()), xn = buf(H, esz()), h1 = buf(H, esz()), hn = buf(H, esz()), y = buf(H, esz());
  q = buf(QD, esz()), qr = buf(QD, esz()), o = buf(QD, esz()), kr = buf(KD, esz());
  g = buf(F, esz()), u = buf(F, esz()), m = buf(F, esz());
  ids = buf(1, 4), pos = buf(1, 4);
  if (c.num_moe_layers() > 0) {
    ScratchCarver count(nullptr);
    carve_moe_scratch(moe_dims, size_t(rows), esz(), false, count, moe_bufs);
    moe_scratch = DeviceBuffer(*dev, count.used());
    ScratchCarver sc(moe_scratch.get());
    carve_moe_scratch(moe_dims, size_t(rows), esz(), false, sc, moe_bufs);
  }
}

void Generator::Impl::forward(const std::vector<int32_t>& tok, int64_t past) {
  const int64_t n = int64_t(tok.size());
  ensure_rows(n);
  // host copies that live until the copies ran (head() waits for them)
  host_ids = tok;
  host_pos.resize(size_t(n));
  std::iota(host_pos.begin(), host_pos.end(), int32_t(past));
  Stream& s = dev->stream(StreamKind::compute);
  s.copy_h2d(ids.get(), host_ids.data(), size_t(n) * 4);
  s.copy_h2d(pos.get(), host_pos.data(), size_t(n) * 4);
  s.launch([this, n, past] {
    Ops& ops = dev->ops();
    const int64_t H = c.hidden_size, F = c.intermediate_size, nq = c.num_attention_heads,
                  nkv = c.num_key_value_heads, D = c.head_dim;
    const float eps = float(c.rms_norm_eps), scale = c.attention_scale();
    const float branch = float(c.residual_multiplier);  // Granite's (1 elsewhere)
    const float off = c.norm_weight_offset();           // Gemma's norms: 1 + w
    // an RMSNorm ends each residual branch: OLMo 2 (instead of pre-norms), Gemma (besides them)
    const bool post = c.post_norms || c.gemma();
    const int32_t* pp = pos.as<int32_t>();
    ops.embedding_fwd(ids.as<int32_t>(), t("model.embed_tokens.weight"), x.get(), n, H, c.vocab_size);
    if (c.embedding_scale() != 1.0)
      scale_activation(ops, x.get(), x.get(), n * H, in_dtype(ops, float(c.embedding_scale())));
    // q/k norms per head, or (OLMo 2) over a token's whole q and k
    const int64_t qn_rows = c.qk_norm_whole ? n : n * nq, kn_rows = c.qk_norm_whole ? n : n * nkv;
    const int64_t qn_cols = c.qk_norm_whole ? nq * D : D, kn_cols = c.qk_norm_whole ? nkv * D : D;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string pre = fmt::format("model.layers.{}.", l);
      void* krow = at(kc[size_t(l)], past * nkv * D);
      void* vrow = at(vc[size_t(l)], past * nkv * D);
      // OLMo 2 (post_norms): no pre-norm, xn then takes o_proj's output for its norm
      const void* xin = c.post_norms ? x.get() : xn.get();
      if (!c.post_norms)
        ops.rmsnorm_fwd(x.get(), t(pre + "input_layernorm.weight"), xn.get(), n, H, eps, off);
      ops.linear_fwd(xin, t(pre + "self_attn.q_proj.weight"), c.qk_norm ? qr.get() : q.get(), n, H, nq * D);
      ops.linear_fwd(xin, t(pre + "self_attn.k_proj.weight"), c.qk_norm ? kr.get() : krow, n, H, nkv * D);
      ops.linear_fwd(xin, t(pre + "self_attn.v_proj.weight"), vrow, n, H, nkv * D);
      const int32_t rows[2] = {0, int32_t(n)};
      if (c.has_qkv_bias()) {  // GPT-OSS, Qwen2: biased projections (no q/k norm)
        ops.grouped_bias_fwd(q.get(), t(pre + "self_attn.q_proj.bias"), rows, 1, nq * D);
        ops.grouped_bias_fwd(krow, t(pre + "self_attn.k_proj.bias"), rows, 1, nkv * D);
        ops.grouped_bias_fwd(vrow, t(pre + "self_attn.v_proj.bias"), rows, 1, nkv * D);
      }
      if (c.qk_norm) {
        ops.rmsnorm_fwd(qr.get(), t(pre + "self_attn.q_norm.weight"), q.get(), qn_rows, qn_cols, eps, off);
        ops.rmsnorm_fwd(kr.get(), t(pre + "self_attn.k_norm.weight"), krow, kn_rows, kn_cols, eps, off);
      }
      const RopeTable& rope = ropes[size_t(l)].pick(past + n);
      ops.rope_fwd_at(q.get(), pp, n, nq, D, rope.inv_freq.data(), rope.attention_scaling, c.rotary_dim());
      ops.rope_fwd_at(krow, pp, n, nkv, D, rope.inv_freq.data(), rope.attention_scaling, c.rotary_dim());
      // sliding window, sinks (GPT-OSS), soft-capped scores (Gemma 2)
      if (c.attention_sinks || c.attention_window(l) > 0 || c.attn_logit_softcapping > 0) {
        Ops::AttentionVariant var;
        var.window = c.attention_window(l);
        var.softcap = float(c.attn_logit_softcapping);
        if (c.attention_sinks) var.sinks = t(pre + "self_attn.sinks");
        ops.attention_decode_v(q.get(), kc[size_t(l)].get(), vc[size_t(l)].get(), o.get(), past, n, nq, nkv,
                               D, scale, var);
      } else {
        ops.attention_decode(q.get(), kc[size_t(l)].get(), vc[size_t(l)].get(), o.get(), past, n, nq, nkv, D,
                             scale);
      }
      void* attn = post ? xn.get() : h1.get();
      ops.linear_fwd(o.get(), t(pre + "self_attn.o_proj.weight"), attn, n, nq * D, H);
      if (c.attention_bias) ops.grouped_bias_fwd(attn, t(pre + "self_attn.o_proj.bias"), rows, 1, H);
      if (post) ops.rmsnorm_fwd(attn, t(pre + "post_attention_layernorm.weight"), h1.get(), n, H, eps, off);
      if (branch != 1.0f) scale_activation(ops, h1.get(), h1.get(), n * H, branch);
      ops.add(x.get(), h1.get(), h1.get(), n * H);
      if (!c.post_norms)  // the norm before the MLP
        ops.rmsnorm_fwd(
            h1.get(),
            t(pre + (c.gemma() ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight")),
            hn.get(), n, H, eps, off);
      if (const MoeBlock* b = moe[size_t(l)].get()) {  // x = h1 + the routed experts
        b->forward(ops, groups[size_t(l) + 1].get(), hn.get(), h1.get(), x.get(), n, moe_bufs, nullptr);
        continue;
      }
      const void* in = c.post_norms ? h1.get() : hn.get();
      ops.linear_fwd(in, t(pre + "mlp.gate_proj.weight"), g.get(), n, H, F);
      ops.linear_fwd(in, t(pre + "mlp.up_proj.weight"), u.get(), n, H, F);
      if (c.gemma()) ops.geglu_fwd(g.get(), u.get(), m.get(), n * F);
      else ops.swiglu_fwd(g.get(), u.get(), m.get(), n * F);
      ops.linear_fwd(m.get(), t(pre + "mlp.down_proj.weight"), post ? hn.get() : y.get(), n, F, H);
      if (post)
        ops.rmsnorm_fwd(hn.get(), t(pre + "post_feedforward_layernorm.weight"), y.get(), n, H, eps, off);
      if (branch != 1.0f) scale_activation(ops, y.get(), y.get(), n * H, branch);
      ops.add(h1.get(), y.get(), x.get(), n * H);
    }
  });
}

std::vector<float> Generator::Impl::head(int64_t first, int64_t n) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const size_t need = size_t(n * V);
  if (lg.bytes() < need * esz()) lg = DeviceBuffer(*dev, need * esz());
  if (lg32.bytes() < need * 4) lg32 = DeviceBuffer(*dev, need * 4);
  Stream& s = dev->stream(StreamKind::compute);
  s.launch([this, first, n, H, V] {
    Ops& ops = dev->ops();
    ops.rmsnorm_fwd(at(x, first * H), t("model.norm.weight"), hn.get(), n, H, float(c.rms_norm_eps),
                    c.norm_weight_offset());
    ops.linear_fwd(hn.get(), t("lm_head.weight"), lg.get(), n, H, V);
    if (c.logits_scaling != 1.0)
      scale_activation(ops, lg.get(), lg.get(), n * V, float(1.0 / c.logits_scaling));
    ops.cast(DType::f32, lg32.get(), dev->compute_dtype(), lg.get(), n * V);
  });
  std::vector<float> out(need);
  s.copy_d2h(out.data(), lg32.get(), need * 4);
  auto done = std::make_shared<std::promise<std::string>>();
  auto fut = done->get_future();
  s.then([done](const std::string& e) { done->set_value(e); });
  const std::string err = fut.get();  // the ops' first failure since the previous call, if any
  if (!err.empty()) throw DeviceError("generate: " + err);
  // Gemma's final_logit_softcapping: cap * tanh(z / cap), in fp32 from the stored logits
  if (const float cap = float(c.final_logit_softcapping); cap > 0)
    for (float& z : out) z = Ops::soft_cap(z, cap);
  return out;
}

Generator::Generator(const LoadedModel& model, const GeneratorOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  const ModelLayout layout = make_layout(model.config);
  std::vector<std::vector<float>> data;
  fill_groups(model, layout, data);
  std::vector<const float*> ptrs;
  for (auto& d : data) ptrs.push_back(d.data());
  impl_->init(layout, ptrs, opt);
}

Generator::Generator(const ModelLayout& layout, const std::vector<const float*>& groups,
                     const GeneratorOptions& opt)
    : impl_(std::make_unique<Impl>()) {
  impl_->init(layout, groups, opt);
}

Generator::~Generator() = default;
Generator::Generator(Generator&&) noexcept = default;
Generator& Generator::operator=(Generator&&) noexcept = default;
int64_t Generator::max_context() const { return impl_->C; }
std::string Generator::device_name() const { return impl_->dev->name(); }

namespace {
void check_ids(const std::vector<int32_t>& ids, int64_t vocab, int64_t cap) {
  if (ids.empty()) throw std::invalid_argument("generate: the prompt is empty");
  if (int64_t(ids.size()) > cap)
    throw std::invalid_argument(
        fmt::format("generate: the prompt has {} tokens, the KV cache holds {}", ids.size(), cap));
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw std::invalid_argument(
          fmt::format("generate: token id {} is outside the vocabulary [0, {})", id, vocab));
}
}  // namespace

std::vector<float> Generator::logits(const std::vector<int32_t>& ids) {
  Impl& I = *impl_;
  check_ids(ids, I.c.vocab_size, I.C);
  I.forward(ids, 0);
  return I.head(0, int64_t(ids.size()));
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& o,
                                         const std::function<bool(int32_t)>& on_token) {
  Impl& I = *impl_;
  check_ids(prompt, I.c.vocab_size, I.C);
  // written so that a NaN fails (it sampled from NaN probabilities); an infinite temperature too
  if (!(o.temperature >= 0) || std::isinf(o.temperature) || !(o.top_p > 0 && o.top_p <= 1) || o.top_k < 0)
    throw std::invalid_argument(fmt::format(
        "generate: expected a finite temperature >= 0, top_k >= 0 and 0 < top_p <= 1, got {}, {}, {}",
        o.temperature, o.top_k, o.top_p));
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> unif(0.0, 1.0);
  std::vector<int32_t> out, seq = prompt;
  I.forward(prompt, 0);
  int64_t past = int64_t(prompt.size());
  std::vector<float> lg = I.head(past - 1, 1);
  while (int64_t(out.size()) < o.max_new_tokens) {
    const int32_t next = pick_token(lg, o, o.temperature > 0 ? unif(rng) : 0.0);
    out.push_back(next);
    if (on_token && !on_token(next)) break;
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end() || past >= I.C) break;
    if (int64_t(out.size()) == o.max_new_tokens) break;
    seq.push_back(next);
    if (I.switches_table(past)) {  // recompute every key with the long table
      I.forward(seq, 0);
      lg = I.head(past, 1);
    } else {
      I.forward({next}, past);
      lg = I.head(0, 1);
    }
    ++past;
  }
  return out;
}

}  // namespace rp
