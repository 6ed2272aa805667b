// Per-layer profile: measured times and memory, smoothed, saved in the run directory.
//
// Pure data + smoothing (the profiler of the automatic planner). The runtime measures (CUDA events on the
// GPU, steady clocks on the CPU backend), reads timers only after the work finished (never
// blocking the pipeline), and reports each measurement with record(). A Profile is not
// thread-safe: one owner (the scheduler actor) receives measurements as messages.
//
// Smoothing: a bias-corrected exponential moving average (as Adam's first moment,
// Kingma & Ba 2015): m_n = beta*m_{n-1} + (1-beta)*x_n, estimate = m_n / (1 - beta^n).
// The first sample of every series is dropped (allocations, page faults, cold caches).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/json_text.hpp"
#include "scheduler/cost_model.hpp"

namespace rp {

class JsonFields;

/// What a profile records and its reader accepts. Seconds of one layer and one micro-batch:
/// 1e6 s (11.6 days) is far beyond any layer pass, and rules out only a broken clock or a hand edit.
inline constexpr double kProfileMaxSeconds = 1e6;
/// Device bytes of one layer (weights, gradients, scratch): 1 TiB, several times the memory of
/// any GPU.
inline constexpr int64_t kProfileMaxBytes = int64_t(1) << 40;
/// Tokens of a micro-batch (n_seq x seq_len): 2^40, the spec's bound on a step's tokens.
inline constexpr int64_t kProfileMaxTokens = int64_t(1) << 40;
/// Samples of a series: 10^12, a million years of passes at 30 per second.
inline constexpr int64_t kProfileMaxSamples = 1000000000000;

/// What a measurement times, for one layer and one micro-batch.
enum class ProfileKind : uint8_t {
  forward,    ///< forward in a forward stage
  recompute,  ///< recompute of the forward in a backward stage (when timed separately)
  backward,   ///< backward in a backward stage (including the recompute unless the
              ///< recompute is recorded separately)
  tail,       ///< the layer inside the fused tail stage (forward + loss + backward)
};
const char* profile_kind_name(ProfileKind k);
/// Inverse of profile_kind_name; throws std::invalid_argument naming `s`.
ProfileKind profile_kind_from_name(const std::string& s);

/// The linear layers' compute as a profile (Profile::linear_compute) and a checkpoint record
/// it: "bf16" without FP8 linears, "fp8" with FP8 linears whose weight gradients stay in the
/// compute dtype, "fp8+wgrad" with FP8 weight gradients too (where some linear's input width
/// allows them, model/fp8_linear.hpp's fp8_wgrad_reach).
const char* linear_compute_name(bool fp8, bool fp8_weight_gradients);

/// Bias-corrected EMA of a series of seconds that drops the series' first sample.
class SmoothedTime {
 public:
  explicit SmoothedTime(double beta = 0.8);
  /// Adds one sample (seconds >= 0, finite; the caller checks). The first is dropped.
  void add(double seconds);
  bool has_value() const { return kept_ > 0; }
  /// Bias-corrected estimate in seconds (0 before any kept sample).
  double value() const;
  int64_t kept() const { return kept_; }
  int64_t seen() const { return seen_; }
  /// |estimate after the latest sample - before| / estimate after (1 with < 2 kept samples).
  double last_change() const { return last_change_; }
  double beta() const { return beta_; }
  nlohmann::json to_json() const;
  /// The series `f` reads (Profile::from_json's errors: "<where>: key '<k>': expected <range>").
  static SmoothedTime from_json(const JsonFields& f, double beta);

 private:
  double beta_;
  double m_ = 0;
  int64_t seen_ = 0, kept_ = 0;
  double last_change_ = 1;
};

struct LayerProfile {
  SmoothedTime fwd, recompute, bwd, tail;
  int64_t weight_bytes = -1;        ///< device bytes of its parameters (-1: not measured)
  int64_t grad_bytes = -1;          ///< device bytes of its gradient accumulators (-1: not measured)
  int64_t scratch_peak_bytes = -1;  ///< peak temporary bytes of one call (max over samples)
  explicit LayerProfile(double beta = 0.8) : fwd(beta), recompute(beta), bwd(beta), tail(beta) {}
  SmoothedTime& series(ProfileKind k);
  const SmoothedTime& series(ProfileKind k) const;
};

class Profile {
 public:
  Profile() = default;
  /// A profile of `num_layers` compute layers (L + 2) for micro-batches of n_seq x seq_len
  /// tokens. Throws std::invalid_argument for num_layers < 3, a bad shape or beta not in [0, 1).
  Profile(int num_layers, int64_t n_seq, int64_t seq_len, double beta = 0.8);

  int num_layers() const { return int(layers_.size()); }
  int64_t n_seq() const { return n_seq_; }
  int64_t seq_len() const { return seq_len_; }
  double beta() const { return beta_; }
  std::string device;  ///< free text naming the device the times come from
  /// The linear compute the times were measured in (linear_compute_name); "" in files written
  /// before it was recorded (unknown).
  std::string linear_compute;

  /// The worker's hook: `seconds` of `kind` for layer `layer` and one micro-batch.
  /// Throws std::invalid_argument naming the layer for an index out of range or a time
  /// outside [0, kProfileMaxSeconds] (so a profile holds nothing its reader refuses).
  void record(int layer, ProfileKind kind, double seconds);
  /// Device memory of `layer`; pass -1 for what was not measured. Scratch keeps the max.
  /// Throws std::invalid_argument for a count above kProfileMaxBytes.
  void record_memory(int layer, int64_t weight_bytes, int64_t grad_bytes, int64_t scratch_peak_bytes);
  const LayerProfile& layer(int l) const;

  /// True when every layer has settled estimates (>= min_samples kept samples, last
  /// relative change <= rel_tol) for forward and backward, or for the tail kind (decoders
  /// the plan puts into the tail stage; always for the last layer): the moment to re-plan
  /// (between iterations, never mid-iteration).
  bool settled(double rel_tol = 0.05, int64_t min_samples = 3) const;

  /// Costs for the partitioner: measured estimates replace `analytic` where they exist;
  /// a kind measured on some layers calibrates the others of the same kind (decoder or
  /// not) by the ratio sum(measured)/sum(analytic). A backward is the backward series plus
  /// the recompute series. A tail cost not measured is the analytic one scaled like
  /// fwd + bwd. Throws std::invalid_argument when analytic.size() != num_layers().
  std::vector<LayerCost> apply(const std::vector<LayerCost>& analytic) const;

  nlohmann::json to_json() const;
  /// Errors: std::invalid_argument("<where>: <key or layer>: <what>"); a key to_json does not
  /// write (at the top, in a layer or in a series) is "<where>: unknown key '<k>' (known keys: ...)".
  /// A value out of range is "<where>: [layer <l>.<series>: ]key '<k>': expected <range>, got <v>":
  /// seconds (m) in [0, kProfileMaxSeconds], also once bias-corrected; sample counts (kept, seen)
  /// in [0, kProfileMaxSamples], seen >= kept; last_change finite and >= 0; byte counts in
  /// [0, kProfileMaxBytes]; n_seq, seq_len >= 1 with n_seq x seq_len <= kProfileMaxTokens; beta in
  /// [0, 1). With `lines` (parse_json_text's key_lines of the text `j` came from, whose file
  /// `where` names) a key's error names its line: "<where>:<line>: ...".
  static Profile from_json(const nlohmann::json& j, const std::string& where,
                           const JsonKeyLines* lines = nullptr);
  /// Writes JSON atomically (base/atomic_file.hpp). Throws std::runtime_error("<path>: ...").
  void save(const std::string& path) const;
  /// Throws std::runtime_error("<path>: ...") for I/O or parse errors: a syntax error is
  /// "<path>:<line>:<column>: invalid JSON: <reason>", a key given twice in one object
  /// "<path>:<line>: key '<a.b>' given twice" (base/json_text.hpp), a key from_json refuses
  /// "<path>:<line>: ...".
  static Profile load(const std::string& path);

 private:
  std::vector<LayerProfile> layers_;
  int64_t n_seq_ = 0, seq_len_ = 0;
  double beta_ = 0.8;
};

}  // namespace rp
