// safetensors reading (at offsets, tensor by tensor; single files and sharded checkpoints) and writing.
//
// File format: u64 little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<k>": "<v>"}}
// then the tensor data; offsets are relative to the end of the header, row-major, little-endian.
// Every header entry is validated when a file is opened (dtype known, shape non-negative,
// end - begin == numel * element size, within the file), so a truncated or corrupt file
// throws std::runtime_error("<file>: <what>") and never crashes.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/input_file.hpp"
#include "kernels/dtype.hpp"
#include "roundpipe/checkpoint.hpp"  // HostTensor

namespace rp {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;            ///< safetensors dtype string: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;   ///< row-major
  uint64_t begin = 0, end = 0;  ///< byte offsets relative to the data section
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  /// Opens and validates `path` (its header; tensors are read when asked for); throws
  /// std::runtime_error("<path>: <what>").
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  /// Entries in file order (sorted by data offset).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  /// Throws read_f32's error when `e`'s dtype cannot be read as floats.
  void check_float_dtype(const SafetensorsEntry& e) const;
  /// Entry `name` or nullptr.
  const SafetensorsEntry* find(const std::string& name) const;
  /// The "__metadata__" object (string -> string), or an empty object.
  const nlohmann::json& metadata() const { return metadata_; }
  /// Bytes [at, at + n) of `e`'s stored data into `dst`. Throws std::runtime_error naming the file
  /// and tensor when the file no longer holds them (it shrank since it was opened) or cannot be
  /// read; std::logic_error for a range outside the tensor.
  void read_bytes(const SafetensorsEntry& e, uint64_t at, uint64_t n, void* dst) const;
  /// `e` converted to fp32 (F32, F16, BF16; U8 bytes as their values 0..255, for MXFP4
  /// blocks and scales; others throw std::runtime_error naming the file and tensor).
  HostTensor read_f32(const SafetensorsEntry& e) const;
  /// Elements [first, first + n) of `e` (row-major) as read_f32 converts them.
  std::vector<float> read_f32_range(const SafetensorsEntry& e, int64_t first, int64_t n) const;

 private:
  std::string path_;
  PositionalFile file_;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  nlohmann::json metadata_;
};

/// The open files of a safetensors checkpoint and where each tensor lies, nothing read yet.
struct SafetensorsSet {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  struct Where {
    const SafetensorsFile* file = nullptr;
    const SafetensorsEntry* entry = nullptr;
  };
  std::map<std::string, Where> tensors;  ///< by tensor name
};

/// Opens (maps and validates) what load_safetensors reads, with the same checks and errors
/// (the dtype of every tensor must be readable as floats), but reads no tensor data.
SafetensorsSet open_safetensors(const std::string& path);

/// Loads every tensor as fp32. `path` is a .safetensors file, a model.safetensors.index.json
/// (its "weight_map" names the shard of each tensor, relative to the index's folder) or a
/// folder holding model.safetensors or model.safetensors.index.json. Throws
/// std::runtime_error naming the file: unreadable/corrupt files, a tensor missing from the
/// shard the index names, a tensor in two shards.
std::map<std::string, HostTensor> load_safetensors(const std::string& path);

/// A tensor to write: fp32 data of prod(shape) elements, either in memory (`data`) or made
/// when the writer reaches it (`read`, called when data is null, right before the tensor is
/// written; what it returns needs to stay valid only until the next `read` of any tensor), so
/// a model can be written without all of it in memory at once.
struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  std::function<const float*()> read;
};

/// Writes `tensors` (in the given order) to `path` in `dtype` (f32, bf16 or f16; bf16/f16
/// round to nearest even). `metadata` (string values) goes into "__metadata__" ("format":
/// "pt" is added when absent). The file is written to "<path>.tmp-<pid>" then renamed, so
/// `path` is never left half-written. Throws std::runtime_error("<path>: <what>") on I/O
/// errors, duplicate names or a null data pointer (null data without `read`, or a `read` that
/// returns null); std::invalid_argument for dtype i32. What a `read` throws aborts the write
/// (nothing is left at `path`).
void save_safetensors(const std::string& path, const std::vector<TensorRef>& tensors, DType dtype,
                      const nlohmann::json& metadata = nlohmann::json::object());

/// Writes `tensors` into `dir` as model-0000i-of-0000n.safetensors shards of at most
/// `max_shard_bytes` each (a larger single tensor gets its own shard) plus
/// model.safetensors.index.json ({"metadata": {"total_size": bytes}, "weight_map": {...}}).
/// With one shard the file is named model.safetensors and no index is written.
/// `dir` must exist. Returns the file names written (relative to `dir`).
std::vector<std::string> save_safetensors_sharded(const std::string& dir,
                                                  const std::vector<TensorRef>& tensors, DType dtype,
                                                  uint64_t max_shard_bytes);

}  // namespace rp
