#include "scheduler/stage_peak.hpp"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace rp {

PeakEstimate predict_peak(const std::vector<StageEstimate>& stages, const PartitionOptions& opt) {
  const int S = int(stages.size());
  const int G = opt.gpus;
  if (S == 0 || G < 1) throw std::invalid_argument(fmt::format("predict_peak: {} stages on {} GPUs", S, G));
  const int64_t cap = opt.memory_cap;
  auto at = [&](int64_t i) -> const StageEstimate& { return stages[size_t(((i % S) + S) % S)]; };
  auto fits = [&](int64_t b) { return cap <= 0 || b <= cap; };
  PeakEstimate r;
  for (int s = 0; s < S; ++s) {
    const StageEstimate& cur = at(s);
    const StageEstimate& next = at(s + G);
    const int64_t work = cur.work_bytes, retained = at(s - G).retained_bytes;
    // the next task's weights, or (a weightless next task) its working set and the weights of the one after
    // it
    const int64_t ahead =
        next.weight_bytes > 0 ? next.weight_bytes : next.work_bytes + at(s + 2 * G).weight_bytes;
    const int64_t full = retained + work + ahead;
    // early start: the current task's last micro-batch computes while its other slot is the next task's
    const int64_t early = opt.micro_batches >= 2 && next.weight_bytes > 0
                              ? work - cur.slot_bytes + next.slot_bytes + next.weight_bytes
                              : 0;
    int64_t p = full;
    if (!fits(full))  // the new task or the prefetch waits for the retired task to drain
      p = std::max(fits(retained + work) ? retained + work : work, fits(work + ahead) ? work + ahead : work);
    if (early > 0 && fits(early)) p = std::max(p, early);
    r.max_work = std::max(r.max_work, work);
    r.unbounded = std::max(r.unbounded, std::max(full, early));
    if (p > r.bytes) {
      r.bytes = p;
      r.stage = s;
    }
  }
  return r;
}

std::vector<char> prefetch_refused(const std::vector<StageEstimate>& stages, const PartitionOptions& opt) {
  const int S = int(stages.size());
  const int G = opt.gpus;
  if (S == 0 || G < 1)
    throw std::invalid_argument(fmt::format("prefetch_refused: {} stages on {} GPUs", S, G));
  const int64_t cap = opt.memory_cap;
  auto at = [&](int64_t i) -> const StageEstimate& { return stages[size_t(((i % S) + S) % S)]; };
  std::vector<char> out(size_t(S), 0);
  if (cap <= 0) return out;
  for (int s = 0; s < S; ++s) {
    const int64_t w = at(s).weight_bytes;
    if (w == 0) continue;
    const StageEstimate& prev = at(s - G);
    bool refused = prev.work_bytes + w > cap;
    if (refused && prev.weight_bytes == 0)  // prefetched behind the weightless stage, beside its predecessor
      refused = at(s - 2 * G).work_bytes + prev.work_bytes + w > cap;
    out[size_t(s)] = refused ? 1 : 0;
  }
  return out;
}

}  // namespace rp
