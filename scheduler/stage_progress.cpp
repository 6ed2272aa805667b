#include "scheduler/stage_progress.hpp"

#include <stdexcept>

#include <fmt/format.h>

namespace rp {

const char* StageProgress::describe(Wait w) {
  switch (w) {
    case Wait::none: return "may start";
    case Wait::finished: return "all done";
    case Wait::input: return "waits for its input from the previous stage";
    case Wait::slot: return "waits for its slot (early start)";
    case Wait::slot_inputs: return "waits for the slot's previous micro-batch to compute";
    case Wait::not_current: return "waits for the task to become current";
    case Wait::weights: return "waits for the stage's weights";
    case Wait::uploads: return "waits for its inputs to upload";
    case Wait::slot_outputs: return "waits for the slot's previous outputs to download";
  }
  return "?";
}

StageProgress::StageProgress(int64_t micro_batches, int slots)
    : M_(micro_batches),
      slots_(slots),
      held_(size_t(slots > 0 ? slots : 0), 0),
      up_pending_(size_t(micro_batches > 0 ? micro_batches : 0), 0),
      down_pending_(up_pending_.size(), 0),
      up_done_(up_pending_.size(), 0),
      comp_done_(up_pending_.size(), 0),
      down_done_(up_pending_.size(), 0) {
  if (micro_batches < 0 || slots < 1)
    throw std::invalid_argument(fmt::format(
        "StageProgress: expected micro_batches >= 0 and slots >= 1, got {} and {}", micro_batches, slots));
}

int64_t StageProgress::last_in_slot(int j) const { return M_ > j ? (M_ - 1 - j) / slots_ * slots_ + j : -1; }

void StageProgress::hold_slot(int j) { held_.at(size_t(j)) = 1; }

StageProgress::Wait StageProgress::upload_wait(bool input_ready) const {
  const int64_t m = next_up_;
  if (m >= M_) return Wait::finished;
  if (!holds_slot(slot_of(m))) return Wait::slot;
  if (m >= slots_ && !comp_done_[size_t(m - slots_)]) return Wait::slot_inputs;
  if (!input_ready) return Wait::input;
  return Wait::none;
}

int64_t StageProgress::upload_issued(int copies) {
  if (next_up_ >= M_) throw std::logic_error("StageProgress: upload issued after the last micro-batch");
  const int64_t m = next_up_++;
  up_pending_[size_t(m)] = copies;
  if (copies == 0) {
    up_done_[size_t(m)] = 1;
    ++n_up_;
  }
  return m;
}

bool StageProgress::upload_copy_done(int64_t m) {
  if (m < 0 || m >= next_up_ || up_pending_[size_t(m)] <= 0)
    throw std::logic_error(
        fmt::format("StageProgress: an input copy of micro-batch {} landed that was not issued", m));
  if (--up_pending_[size_t(m)] > 0) return false;
  up_done_[size_t(m)] = 1;
  ++n_up_;
  return true;
}

StageProgress::Wait StageProgress::compute_wait(bool current, bool weights_ready) const {
  const int64_t m = next_comp_;
  if (m >= M_) return Wait::finished;
  if (!current) return Wait::not_current;
  if (!weights_ready) return Wait::weights;
  if (!up_done_[size_t(m)]) return Wait::uploads;
  if (m >= slots_ && !down_done_[size_t(m - slots_)]) return Wait::slot_outputs;
  return Wait::none;
}

int64_t StageProgress::compute_issued() {
  if (next_comp_ >= M_) throw std::logic_error("StageProgress: compute issued after the last micro-batch");
  return next_comp_++;
}

void StageProgress::computed(int64_t m, int copies) {
  if (m < 0 || m >= next_comp_ || comp_done_[size_t(m)])
    throw std::logic_error(
        fmt::format("StageProgress: micro-batch {} computed twice or before it was issued", m));
  comp_done_[size_t(m)] = 1;
  ++n_comp_;
  down_pending_[size_t(m)] = copies;
  if (copies == 0) {
    down_done_[size_t(m)] = 1;
    ++n_down_;
  }
}

bool StageProgress::download_copy_done(int64_t m) {
  if (m < 0 || m >= M_ || !comp_done_[size_t(m)] || down_pending_[size_t(m)] <= 0)
    throw std::logic_error(
        fmt::format("StageProgress: an output copy of micro-batch {} landed that was not issued", m));
  if (--down_pending_[size_t(m)] > 0) return false;
  down_done_[size_t(m)] = 1;
  ++n_down_;
  return true;
}

int StageProgress::uploads_in_flight() const {
  int n = 0;
  for (int64_t m = 0; m < next_up_; ++m) n += up_pending_[size_t(m)] > 0 && !up_done_[size_t(m)];
  return n;
}

int StageProgress::downloads_in_flight() const {
  int n = 0;
  for (int64_t m = 0; m < M_; ++m) n += comp_done_[size_t(m)] && !down_done_[size_t(m)];
  return n;
}

bool StageProgress::slot_finished(int j) const {
  const int64_t last = last_in_slot(j);
  return last < 0 || down_done_[size_t(last)];
}

std::string StageProgress::describe(bool input_ready, bool current, bool weights_ready) const {
  std::vector<std::string> p;
  p.push_back(
      fmt::format("{}/{} uploaded, {}/{} computed, {}/{} downloaded", n_up_, M_, n_comp_, M_, n_down_, M_));
  const int64_t running = next_comp_ - n_comp_;
  if (running > 0) p.push_back(fmt::format("micro-batch {} computing", n_comp_));
  if (const Wait w = compute_wait(current, weights_ready); w != Wait::finished && w != Wait::none)
    p.push_back(fmt::format("compute of micro-batch {} {}", next_comp_, describe(w)));
  if (const Wait w = upload_wait(input_ready); w != Wait::finished && w != Wait::none)
    p.push_back(fmt::format("upload of micro-batch {} {}", next_up_, describe(w)));
  if (const int n = uploads_in_flight()) p.push_back(fmt::format("{} micro-batch input(s) uploading", n));
  if (const int n = downloads_in_flight())
    p.push_back(fmt::format("{} micro-batch output(s) downloading", n));
  return fmt::format("{}", fmt::join(p, ", "));
}

}  // namespace rp
