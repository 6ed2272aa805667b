// Chunking and window packing of bulk transfers (they fill the activation gaps): large tensors are cut
// into chunks, and the chunks of a stage's weights are spread over the idle windows between
// the activation transfers of the stage that computes meanwhile, with longest-processing-
// time-first (LPT) packing so that no window is flooded. Pure functions, no actors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rp {

/// A byte range [offset, offset + bytes) of one tensor.
struct Chunk {
  size_t offset = 0;
  size_t bytes = 0;
};

/// Cuts `bytes` into consecutive chunks of `chunk_bytes` (the last one may be shorter).
/// `chunk_bytes` 0 means no chunking: one chunk of `bytes`. `bytes` 0 gives no chunks.
/// The chunks cover [0, bytes) exactly, in order, without overlap.
std::vector<Chunk> split_chunks(size_t bytes, size_t chunk_bytes);

/// The result of packing items into windows.
struct WindowPacking {
  std::vector<int> window_of;  ///< per item (input order): its window, in [0, windows)
  std::vector<double> load;    ///< per window: the sum of its items' sizes
  /// Largest window load (the makespan of the packing).
  double makespan() const;
};

/// LPT packing: items sorted by size, largest first (ties: lower index first), each put
/// into the window with the least load so far (ties: the lower window). With equal windows
/// this is Graham's LPT rule: makespan <= (4/3 - 1/(3 windows)) * the optimum.
/// Throws std::invalid_argument if `windows` < 1.
WindowPacking lpt_pack(const std::vector<double>& sizes, int windows);

/// The order in which to issue packed items: by window, then by input index.
std::vector<int> window_issue_order(const WindowPacking& p);

}  // namespace rp
