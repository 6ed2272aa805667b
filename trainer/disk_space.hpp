// Disk space for checkpoints: how much one takes, checked against the output file system
// before training and before each save, so a full disk stops the run at once with one line
// instead of losing every step at the final save.
#pragma once
#include <cstdint>
#include <string>

#include "roundpipe/model.hpp"
#include "roundpipe/spec.hpp"

namespace rp {

/// Bytes of one checkpoint folder of `layout` under `spec`: the weights in save_dtype
/// (model.safetensors), optimizer.bin (AdamW m and v, vmax with amsgrad, the fp32 master unless
/// save_dtype is f32, the low-precision copy in async mode, counted at 4 bytes a value),
/// plus 64 MiB for the tokenizer and the small files. An upper estimate.
uint64_t checkpoint_bytes(const ModelLayout& layout, const TrainSpec& spec);

/// Throws std::runtime_error("<dir>: <what> needs about X, the file system has Y free ...")
/// when free_disk_bytes(dir) < need. A checkpoint is written beside the one it replaces, so
/// one whole checkpoint of free space is needed at every save.
void require_disk_space(const std::string& dir, uint64_t need, const std::string& what);

}  // namespace rp
