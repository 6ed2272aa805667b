// Optimizer settings: AdamW hyper-parameters, fp16 dynamic loss scaling and learning-rate
// schedules. The optimizer itself runs inside the runtime (CPU AdamW on the fp32 master).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace rp {

/// Hyper-parameters of AdamW / Adam, with torch.optim.AdamW's meaning and defaults
/// (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization", Alg. 2; Adam: Kingma
/// & Ba 2015, Alg. 1; AMSGrad: Reddi et al. 2018).
struct AdamWOptions {
  double lr = 1e-4;           ///< base learning rate (the per-step value is passed separately)
  double beta1 = 0.9;         ///< first-moment decay, in [0, 1)
  double beta2 = 0.999;       ///< second-moment decay, in [0, 1)
  double eps = 1e-8;          ///< added to sqrt(v_hat), >= 0
  double weight_decay = 0.0;  ///< >= 0; decoupled (AdamW) or L2 (Adam), see `decoupled`
  bool decoupled = true;      ///< true: AdamW (Loshchilov & Hutter); false: L2 added to the gradient
  bool amsgrad = false;       ///< keep the running max of v and normalise by it
  bool maximize = false;      ///< ascend: the gradient is negated
};

/// Throws std::invalid_argument (one line, naming the field) when an option is out of
/// range: lr < 0, beta not in [0,1), eps < 0, weight_decay < 0, or any is NaN.
void validate(const AdamWOptions& o);

/// torch.amp.GradScaler's knobs and defaults (fp16 dynamic loss scaling).
struct LossScalerOptions {
  float init_scale = 65536.f;      ///< 2^16, > 0 and finite
  float growth_factor = 2.f;       ///< > 1
  float backoff_factor = 0.5f;     ///< in (0, 1)
  int64_t growth_interval = 2000;  ///< consecutive clean steps before growing, >= 1
  /// Floor of the scale: a backoff never goes below it (Megatron-LM's and DeepSpeed's
  /// min_loss_scale; torch has none). > 0, finite, <= init_scale. A run whose scale reaches it
  /// keeps overflowing at the smallest useful scale: the trainer stops it (docs/spec.md).
  float min_scale = 1.f;
  /// Throws std::invalid_argument (one line, naming the field) when out of range.
  void validate() const;
};

/// Learning-rate schedules (Hugging Face transformers semantics, plus a min_lr floor).
///
/// lr(step), where `step` is the scheduler index of HF's LambdaLR: the number of optimizer
/// steps already taken. HF applies lr(t) to update t+1, so with warmup_steps > 0 the very
/// first update (t = 0) uses lr 0, exactly like transformers' schedulers.
///
/// With W = warmup_steps, T = total_steps, f = the factor below, result = lr * f except
/// where min_lr applies:
///  - warmup (all kinds), t < W:  f = t / W                       (ramps up from 0; no floor)
///  - "constant", t >= W:         f = 1   (get_constant_schedule_with_warmup)
///  - "linear",   t >= W:         p = (t - W) / max(1, T - W) clamped to [0, 1],
///                                lr(t) = min_lr + (lr - min_lr) * (1 - p)
///                                (get_linear_schedule_with_warmup when min_lr = 0)
///  - "cosine",   t >= W:         p as above, lr(t) = min_lr + (lr - min_lr) * 0.5 (1 + cos(pi p))
///                                (get_cosine_schedule_with_warmup, num_cycles = 0.5, when
///                                min_lr = 0; get_cosine_with_min_lr_schedule_with_warmup
///                                with min_lr_rate = min_lr / lr otherwise)
/// Past T the decaying kinds stay at min_lr (HF's cosine would rise again: p is clamped).
/// Negative t is treated as 0. Units: lr and min_lr in the optimizer's lr unit; steps are
/// optimizer steps (not micro-batches).
struct LrSchedule {
  std::string kind = "constant";  ///< "constant", "linear" or "cosine"
  double lr = 1e-4;               ///< peak learning rate, >= 0
  double min_lr = 0;              ///< floor of the decay, 0 <= min_lr <= lr
  int64_t warmup_steps = 0;       ///< >= 0
  int64_t total_steps = 0;        ///< linear/cosine: > 0 and >= warmup_steps; constant: ignored

  /// Learning rate for scheduler index `step` (see above).
  double at(int64_t step) const;

  /// Throws std::invalid_argument (one line, prefixed "schedule") if a field is out of range.
  void validate() const;

  /// Parses {"kind": "cosine", "lr": 3e-4, "min_lr": 3e-5, "warmup_steps": 100,
  /// "total_steps": 10000}. "lr" is required, the rest default as above. Errors are one
  /// line, std::invalid_argument, naming `where` and the key ("<where>.warmup_steps: expected
  /// a non-negative integer, got \"x\""); unknown keys are refused listing the valid ones,
  /// unknown kinds listing "constant, linear, cosine".
  static LrSchedule from_json(const nlohmann::json& j, const std::string& where);
};

}  // namespace rp
