#include "scheduler/upload_windows.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace rp {

UploadWindows::UploadWindows(const std::vector<std::pair<int, size_t>>& groups, size_t chunk_bytes,
                             int windows)
    : windows_(windows) {
  if (windows < 1)
    throw std::invalid_argument("UploadWindows: windows must be >= 1, got " + std::to_string(windows));
  std::vector<Piece> all;
  for (auto& [g, bytes] : groups) {
    if (remaining_.count(g))
      throw std::invalid_argument("UploadWindows: group " + std::to_string(g) + " given twice");
    std::vector<Chunk> cs = split_chunks(bytes, chunk_bytes);
    if (cs.empty()) cs.push_back(Chunk{0, 0});
    remaining_[g] = int(cs.size());
    for (auto& c : cs) all.push_back(Piece{g, c, 0});
  }
  std::vector<double> sizes;
  for (auto& p : all) sizes.push_back(double(p.chunk.bytes));
  WindowPacking pk = lpt_pack(sizes, windows);
  for (size_t i = 0; i < all.size(); ++i) all[i].window = pk.window_of[i];
  load_ = pk.load;
  for (int i : window_issue_order(pk)) pieces_.push_back(all[size_t(i)]);
  issued_.assign(pieces_.size(), 0);
}

std::vector<UploadWindows::Piece> UploadWindows::collect() {
  std::vector<Piece> out;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    if (issued_[i] || p.window >= open_ || !granted_.count(p.group)) continue;
    issued_[i] = 1;
    out.push_back(p);
  }
  return out;
}

std::vector<UploadWindows::Piece> UploadWindows::grant(int g) {
  if (!remaining_.count(g) || !granted_.insert(g).second) return {};
  return collect();
}

std::vector<UploadWindows::Piece> UploadWindows::open_next() {
  if (open_ >= windows_) return {};
  ++open_;
  return collect();
}

std::vector<UploadWindows::Piece> UploadWindows::open_all() {
  open_ = windows_;
  return collect();
}

bool UploadWindows::piece_done(int g) {
  auto it = remaining_.find(g);
  if (it == remaining_.end() || it->second <= 0)
    throw std::logic_error("UploadWindows: more completions than pieces for group " + std::to_string(g));
  return --it->second == 0;
}

}  // namespace rp
