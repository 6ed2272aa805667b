// The optimizer state file (optimizer.bin next to a checkpoint's weights): its format, and
// writing / reading it section by section. rp::Session (save_optimizer_state /
// load_optimizer_state) owns the buffers and calls this; nothing here knows the runtime.
//
// Format (little-endian, version 2):
//   header   "RPOPTST1" (8 bytes), version u32 = 2, flags u32 (bit 0: async / staleness 1,
//            bit 1: fp32 master weights, bit 2: low-precision copy, bit 3: loss scaler),
//            steps closed N i64, low-precision dtype name (u32 length + bytes: "f32",
//            "bf16", "f16"), group count u32, per group its name (u32 length + bytes) and
//            numel i64, loss-scale count u32 + that many f32 (the scales of steps
//            N..N+staleness), XXH3-64 of all header bytes after the magic (u64)
//   groups   in layout order: the AdamW state (optimizer/adamw.hpp save_state, with the
//            hyper-parameters and its own checksum; n = 0 for a group never updated),
//            [master: numel f32 + XXH3-64 u64], [low-precision copy: numel elements of the
//            dtype + XXH3-64 u64]
//   scaler   [LossScaler::save (own magic and checksum)]
//   end      "RPOPTEND"
// Frozen groups (ParamGroup::frozen) have no optimizer state and are left out of the file
// altogether: "group" above means trainable group, in layout order (a run without frozen
// groups writes exactly what it wrote before they existed).
// Version 1 (the same layout with FNV-1a checksums) is refused with a one-line error.
#pragma once
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/checksum.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/loss_scale.hpp"
#include "roundpipe/dtype.hpp"
#include "roundpipe/model.hpp"

namespace rp {

inline constexpr uint32_t kOptimizerStateVersion = 2;

struct OptimizerStateHeader {
  int64_t steps = 0;        ///< steps closed N
  bool async = true;        ///< saved by a staleness-1 run
  bool has_master = false;  ///< fp32 master weights per group
  bool has_lowp = false;    ///< low-precision copy per group
  bool has_scaler = false;  ///< a LossScaler record
  DType lowp_dtype = DType::f32;
  std::vector<std::pair<std::string, int64_t>> groups;  ///< (name, numel) in layout order
  std::vector<float> loss_scales;                       ///< scales of steps N..N+staleness
};

/// What write_optimizer_state writes; the pointers refer to the owner's buffers (nothing
/// is copied). header.groups is filled from `layout`.
struct OptimizerStateView {
  OptimizerStateHeader header;
  const ModelLayout* layout = nullptr;
  const std::vector<AdamWState>* adam = nullptr;            ///< one per group (frozen groups' unused)
  const AdamWOptions* adam_options = nullptr;               ///< recorded with each group's state
  const std::vector<std::vector<float>>* master = nullptr;  ///< with header.has_master
  std::vector<const void*> lowp;       ///< with header.has_lowp: numel elements of lowp_dtype per group
  const LossScaler* scaler = nullptr;  ///< with header.has_scaler
};

/// Writes `v` to `path` atomically (base/atomic_file.hpp). Throws std::runtime_error
/// ("<path>: <what>") on I/O errors; a failure leaves no partial file and keeps an older one.
void write_optimizer_state(const std::string& path, const OptimizerStateView& v);

/// Reads a state file section by section. Every error is a std::runtime_error with one line
/// "<path>: <what>": missing file, not a state file, another format version, truncation,
/// checksum mismatch, corrupted values, trailing bytes.
class OptimizerStateReader {
 public:
  /// Opens `path` and reads and checks the header (magic, version, flags, checksum, values).
  explicit OptimizerStateReader(const std::string& path);
  const OptimizerStateHeader& header() const { return h_; }
  [[noreturn]] void fail(const std::string& what) const;
  /// Checks the file's groups against `layout`'s trainable groups ("saved for another model?").
  void check_groups(const ModelLayout& layout) const;
  /// The next group's AdamW state and the hyper-parameters saved with it; the moment count
  /// is checked against g.numel before anything is allocated.
  void read_adam(const ParamGroup& g, AdamWState& st, AdamWOptions& opts);
  /// The next group's fp32 master weights (g.numel floats) into `dst`.
  void read_master(const ParamGroup& g, float* dst);
  /// The next group's low-precision copy, converted (through fp32) to `dt` into `dst`
  /// (g.numel elements); `dst` null: read and checked only.
  void read_lowp(const ParamGroup& g, void* dst, DType dt);
  /// The loss scaler record into `s` (unchanged on error).
  void read_scaler(LossScaler& s);
  /// The end marker, and nothing after it.
  void finish();
  /// Right after the constructor, without loading anything (a seek per group): the file's
  /// size against what the header's groups, the AdamW records' own heads and the flags need,
  /// and the end marker where they end. Finds truncation and trailing bytes before a caller
  /// loads a model for the file (a flipped payload byte is found by the checksums while
  /// reading). The reader is left where the constructor left it.
  void check_extent();

 private:
  void bytes(void* p, size_t n, const char* what);
  template <class T>
  T pod(const char* what) {
    T v{};
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string str(const char* what, uint32_t max_len);
  void checksum(const std::string& what);
  void read_header();

  std::string path_;
  std::ifstream is_;
  Checksum sum_;
  OptimizerStateHeader h_;
  std::vector<unsigned char> scratch_;
};

}  // namespace rp
