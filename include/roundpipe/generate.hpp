// Text generation with a KV cache on one device (no pipeline): what `roundpipe generate`
// runs, and what the trainer uses for its samples before and after fine-tuning.
//
//   rp::LoadedModel lm = rp::load_model("runs/default/final");
//   rp::Generator gen(lm, {.backend = "cpu"});
//   rp::GenerateOptions o;  o.max_new_tokens = 64;            // greedy by default
//   std::vector<int32_t> out = gen.generate(prompt_ids, o);   // the new tokens
//
// Prefill runs the whole prompt through every layer at once (its keys and values go to the
// cache); each decode step then runs one token, attending to the cache
// (Ops::attention_decode). The same layer math as training (model/layers.cpp) in the
// device's compute dtype: fp32 on the CPU backend, bf16 (or f16) on CUDA.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "roundpipe/checkpoint.hpp"
#include "roundpipe/dtype.hpp"
#include "roundpipe/model.hpp"

namespace rp {

struct GeneratorOptions {
  std::string backend = "cpu";  ///< cpu | cuda | auto
  DType dtype = DType::bf16;    ///< CUDA storage dtype (bf16 or f16); the CPU computes in f32
  int64_t max_context = 0;  ///< KV-cache rows (prompt + new tokens); 0: max_position_embeddings, at most 4096
};

/// Decoding (as Hugging Face's generate: greedy when temperature is 0, else sampling with
/// its logits warpers in the order temperature, top-k, top-p).
struct GenerateOptions {
  int64_t max_new_tokens = 128;
  double temperature = 0;         ///< 0: greedy (argmax, the first maximum on ties); > 0: sample
  int64_t top_k = 0;              ///< keep the k most likely tokens (0: all)
  double top_p = 1;               ///< keep the smallest set whose probability reaches top_p (1: all)
  uint64_t seed = 0;              ///< sampling: std::mt19937_64 seed
  std::vector<int32_t> stop_ids;  ///< stop after generating one of these (it is returned)
};

class Generator {
 public:
  /// Uploads `model`'s weights (every tensor of make_layout(model.config)). Throws
  /// std::invalid_argument for a bad option or a missing tensor, DeviceError without the
  /// requested device.
  Generator(const LoadedModel& model, const GeneratorOptions& options = {});
  /// The same from parameter groups (fp32, one pointer per layout group, e.g. a Session's
  /// master weights).
  Generator(const ModelLayout& layout, const std::vector<const float*>& groups,
            const GeneratorOptions& options = {});
  ~Generator();
  Generator(Generator&&) noexcept;
  Generator& operator=(Generator&&) noexcept;

  /// Generates after `prompt` (token ids, at least one): at most max_new_tokens, stopping
  /// after a stop id or when the KV cache is full. `on_token` (optional) sees each new id as
  /// it comes; returning false stops after that id. Returns the new ids. Throws std::invalid_argument for an
  /// empty prompt, an id outside the vocabulary or a prompt longer than the cache.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                const std::function<bool(int32_t)>& on_token = {});
  /// The fp32 logits [ids.size(), vocab] of running `ids` from position 0 (no cache kept), as
  /// transformers returns them (Granite's logits_scaling, Gemma's final_logit_softcapping applied).
  std::vector<float> logits(const std::vector<int32_t>& ids);
  int64_t max_context() const;
  std::string device_name() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The next token from `logits` (vocab floats) under `o` (temperature, top_k, top_p); `u`
/// is a uniform draw in [0, 1) used when sampling. Greedy: the first maximum.
int32_t pick_token(const std::vector<float>& logits, const GenerateOptions& o, double u);

}  // namespace rp
