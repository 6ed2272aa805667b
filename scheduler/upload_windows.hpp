// The parameter uploads of one stage task as a window schedule (uploads fill activation gaps).
//
// A stage's weights are prefetched while the previous stage computes. Its groups are cut
// into chunks (split_chunks) and the chunks are packed with LPT (lpt_pack) into the idle
// windows between that previous stage's per-micro-batch activation uploads: window 0 is
// open at once, and each completed activation upload of the computing stage opens the
// next one. A chunk is issued once its window is open *and* its group's shard granted the
// read (rule 1), in window order, so the prefetch is spread over the stage and no window is
// flooded. A task that is not prefetched has one window: everything goes at once.
// Pure bookkeeping (no actors, no clocks); the worker sends what it returns.
#pragma once
#include <cstddef>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "scheduler/chunk_plan.hpp"

namespace rp {

class UploadWindows {
 public:
  struct Piece {
    int group = 0;
    Chunk chunk;     ///< byte range of the group's buffer
    int window = 0;  ///< window it is packed into
  };
  /// `groups`: (group id, bytes) of the task's weights, ids distinct; `chunk_bytes` 0 = one
  /// piece per group (a group of 0 bytes still gets one empty piece); `windows` >= 1.
  /// Throws std::invalid_argument for windows < 1 or a repeated group id.
  UploadWindows(const std::vector<std::pair<int, size_t>>& groups, size_t chunk_bytes, int windows);

  /// Group g may be read now: returns its pieces in open windows, in issue order (each piece
  /// is returned exactly once over all calls). Unknown or already granted groups: nothing.
  std::vector<Piece> grant(int g);
  /// Opens the next window (no-op when all are open): returns the granted groups' pieces in it.
  std::vector<Piece> open_next();
  /// Opens every remaining window: returns the granted groups' pieces not issued yet.
  std::vector<Piece> open_all();
  /// Records that one issued piece of group g completed; returns true when it was g's last.
  /// Throws std::logic_error for more completions than g has pieces.
  bool piece_done(int g);

  /// Number of windows the pieces are packed into.
  int windows() const { return windows_; }
  /// Windows open so far (1 at construction, up to windows()).
  int open_windows() const { return open_; }
  /// Every piece, in issue order (by window, then group order, then offset).
  const std::vector<Piece>& pieces() const { return pieces_; }
  /// Bytes packed into each window.
  const std::vector<double>& window_bytes() const { return load_; }

 private:
  std::vector<Piece> collect();  ///< granted, open, not yet issued pieces (marks them issued)
  std::vector<Piece> pieces_;
  std::vector<char> issued_;
  std::vector<double> load_;
  std::map<int, int> remaining_;  ///< per group: pieces not completed yet
  std::set<int> granted_;
  int windows_ = 1;
  int open_ = 1;
};

}  // namespace rp
