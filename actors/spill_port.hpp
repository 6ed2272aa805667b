// A worker's side of the activation spill (WorkerContext::spill, actors/activation_spill.hpp):
// which saved inputs of a stage task are on disk, and the downloads of spilled outputs into the
// spill's write buffers, which wait in order while all of the worker's buffers are in use.
//
//   prepare(task)           request_reads       every spilled input the task uploads, micro-batch
//                                               by micro-batch; each read answers with SpillDone
//   may_upload(m)           Task::spill_reads   m's reads must have landed (input_ready)
//   issue_uploads(m)        input()             a spilled input uploads from its read buffer
//   on_computed(m), forward output()            a spilled output goes to a write buffer
//   CopyKind::spill_output  output_landed()     the write is queued; its SpillDone counts the
//                                               output downloaded (then ActReady follows)
//   SpillDone (write)       issue()             waiting outputs take the buffer it gave back
//
// Used by its worker's thread only.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <tuple>

#include "actors/activation_spill.hpp"
#include "actors/messages.hpp"

namespace rp {

/// Whether stage `st` uploads layer b's saved input (Worker::issue_uploads): a backward stage every
/// layer of it but layer 0, a forward stage or the tail its first layer when that is not 0.
inline bool stage_uploads_input(const Stage& st, int b) {
  if (b <= 0) return false;
  return st.kind == StageKind::backward ? st.first <= b && b <= st.last : st.first == b;
}

struct Task;

class SpillPort {
 public:
  /// Issues a device-to-host copy of `bytes` from `src` into `dst` tagged `tag`.
  using Download = std::function<void(void* dst, const void* src, size_t bytes, const CopyTag& tag)>;
  /// The live task with this id, or null.
  using Live = std::function<Task*(uint64_t id)>;

  SpillPort(ActivationSpill* spill, int worker) : spill_(spill), worker_(worker) {}
  bool on() const { return spill_ != nullptr; }
  bool spilled(int layer) const { return spill_ && spill_->spilled(layer); }

  /// Asks for the reads of every spilled input t uploads (forward and tail stages: the input of
  /// their first layer; backward stages: each layer's saved input), in micro-batch order.
  void request_reads(Task& t, WorkerActor me);
  /// A read answered: true when it is t's and landed (t may upload more); false when it was given
  /// back (t gone or not its read).
  bool read_done(Task* t, const SpillDone& d);
  /// The host source of layer l's saved input of micro-batch m: its read buffer when spilled
  /// (std::logic_error when t has none: a broken invariant, not a silent copy).
  const void* input(const Task& t, int layer, int64_t m) const;
  /// Forward stages: layer's saved input of micro-batch m (t's output at `src` on the device) goes
  /// to the spill; counted as one download of m, done once written.
  void output(const Task& t, int64_t m, int layer, const void* src);
  /// Downloads waiting outputs while the worker has free write buffers.
  void issue(const Live& live, const Download& down);
  /// A spilled output's download landed: queues its write (or gives the buffer back, task gone).
  void output_landed(Task* t, const CopyTag& tag, WorkerActor me);
  /// Gives back every write buffer and forgets waiting outputs (the worker ends).
  void clear();

 private:
  struct Waiting {
    uint64_t task = 0;
    int64_t m = 0;
    int layer = 0;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  ActivationSpill* spill_;
  int worker_;
  std::deque<Waiting> waiting_;
  std::map<std::tuple<uint64_t, int64_t, int>, uint64_t> staged_;  ///< (task, m, layer) -> write ticket
};

}  // namespace rp
