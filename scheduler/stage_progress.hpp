// The per-micro-batch progress of one stage task on one worker, and the rules that decide
// what may happen next. A plain class (no threads, no device, no actors): the worker
// (actors/worker.cpp) runs its tasks by it, and the bubble simulator (scheduler/simulator.cpp)
// replays tasks by the same rules, so the two cannot drift apart.
//
// A task moves M micro-batches through `slots` double-buffer slots (micro-batch m uses slot
// m % slots), each micro-batch through three phases: its inputs are uploaded, its layers
// computed, its outputs downloaded. The rules:
//  - uploads go in micro-batch order; micro-batch m's inputs may be uploaded once
//    the predecessor stage's output m is on the host (stage 0: at once), the task holds
//    m's slot, and micro-batch m - slots (the slot's previous user) is computed: inputs
//    arrive one micro-batch ahead of the compute;
//  - computes go in micro-batch order, only in the worker's current task, once the stage's
//    weights are on the device, m's inputs are uploaded and micro-batch m - slots's outputs
//    are downloaded (its output buffers are free again);
//  - slot j is finished when the task will not touch it again: its last micro-batch there
//    is downloaded (or the task has none there);
//  - early start: the task after this one on the worker may take slot j (and upload into it)
//    once this task issued all its uploads and finished slot j, so the first uploads of the
//    next stage overlap this stage's last computes (the slot's memory changes hands);
//  - the task retires once every micro-batch is computed: its weights and scratch can go and
//    the next task becomes current while its last outputs still download;
//  - its outputs are done once every micro-batch is downloaded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rp {

class StageProgress {
 public:
  /// What keeps an upload or a compute from starting.
  enum class Wait : uint8_t {
    none,          ///< it may start now
    finished,      ///< every micro-batch went through this phase
    input,         ///< upload: the predecessor stage's output is not on the host yet
    slot,          ///< upload: the task does not hold the micro-batch's slot (yet)
    slot_inputs,   ///< upload: the slot's previous micro-batch is not computed yet
    not_current,   ///< compute: the task is not the worker's current one
    weights,       ///< compute: the stage's weights are not on the device yet
    uploads,       ///< compute: the micro-batch's inputs are not on the device yet
    slot_outputs,  ///< compute: the slot's previous micro-batch's outputs are still downloading
  };
  /// "waits for its input", ... (for status lines).
  static const char* describe(Wait w);

  StageProgress() = default;
  /// `micro_batches` >= 0 micro-batches through `slots` >= 1 slots. Throws std::invalid_argument.
  explicit StageProgress(int64_t micro_batches, int slots = 2);

  int64_t micro_batches() const { return M_; }
  int slots() const { return slots_; }
  int slot_of(int64_t m) const { return int(m % slots_); }
  /// The last micro-batch in slot j (-1: none).
  int64_t last_in_slot(int j) const;

  // ---- slots ---------------------------------------------------------------------------------
  /// The task holds slot j's buffers now (allocated, or handed over by early start).
  void hold_slot(int j);
  bool holds_slot(int j) const { return held_[size_t(j)] != 0; }
  /// The task gave slot j's buffers up (hand-over, retirement).
  void drop_slot(int j) { held_[size_t(j)] = 0; }

  // ---- uploads -------------------------------------------------------------------------------
  /// The next micro-batch to upload (M once all were issued).
  int64_t next_upload() const { return next_up_; }
  /// What keeps next_upload() from being issued now; `input_ready`: the predecessor's output
  /// of that micro-batch is on the host.
  Wait upload_wait(bool input_ready) const;
  /// next_upload()'s inputs were issued as `copies` copies (0: nothing to copy, it counts as
  /// uploaded at once). Returns the micro-batch.
  int64_t upload_issued(int copies);
  /// One input copy of micro-batch m landed; true when it was its last (m is uploaded now).
  bool upload_copy_done(int64_t m);

  // ---- computes ------------------------------------------------------------------------------
  int64_t next_compute() const { return next_comp_; }
  /// What keeps next_compute() from being issued now.
  Wait compute_wait(bool current, bool weights_ready) const;
  /// next_compute() was issued; returns the micro-batch.
  int64_t compute_issued();
  /// Micro-batch m's compute finished and its outputs go down as `copies` copies (0: nothing
  /// to copy, it counts as downloaded at once).
  void computed(int64_t m, int copies);
  /// One output copy of micro-batch m landed; true when it was its last (m is downloaded now).
  bool download_copy_done(int64_t m);

  // ---- state ---------------------------------------------------------------------------------
  bool uploaded(int64_t m) const { return up_done_[size_t(m)] != 0; }
  bool is_computed(int64_t m) const { return comp_done_[size_t(m)] != 0; }
  bool downloaded(int64_t m) const { return down_done_[size_t(m)] != 0; }
  int64_t uploads_done() const { return n_up_; }
  int64_t computes_done() const { return n_comp_; }
  int64_t downloads_done() const { return n_down_; }
  /// Copies issued and not landed yet (inputs, outputs).
  int uploads_in_flight() const;
  int downloads_in_flight() const;
  /// Every micro-batch computed: the task retires.
  bool retired() const { return n_comp_ == M_; }
  /// Every output downloaded.
  bool outputs_done() const { return n_down_ == M_; }
  /// The task will not touch slot j again.
  bool slot_finished(int j) const;
  /// Early start: the next task on the worker may take slot j now.
  bool may_hand_over(int j) const { return next_up_ == M_ && slot_finished(j); }

  /// "micro-batch 3 computing; 4 waits for its input; 1 upload, 2 downloads in flight"
  /// (`input_ready`, `current`, `weights_ready` as for upload_wait and compute_wait).
  std::string describe(bool input_ready, bool current, bool weights_ready) const;

 private:
  int64_t M_ = 0;
  int slots_ = 2;
  int64_t next_up_ = 0, next_comp_ = 0;
  int64_t n_up_ = 0, n_comp_ = 0, n_down_ = 0;
  std::vector<char> held_ = std::vector<char>(2, 0);
  std::vector<int> up_pending_, down_pending_;  ///< copies outstanding per micro-batch
  std::vector<char> up_done_, comp_done_, down_done_;
};

}  // namespace rp
