// Private: the worker actor's class (actors/worker.hpp), shared by actors/worker.cpp (its
// behaviour, and the stage tasks it starts, prefetches, retires and reports done) and
// actors/worker_copies.cpp (the copies it issues and what each completion does).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "actors/host_jobs.hpp"
#include "actors/messages.hpp"
#include "actors/spill_port.hpp"
#include "actors/stage_task.hpp"
#include "actors/transfer.hpp"
#include "actors/worker.hpp"
#include "scheduler/upload_windows.hpp"

namespace rp {

/// "forward stage 2 of pass 5, layers 3-4": the stage task `t` runs.
std::string stage_text(const Task& t);

class Worker : public WorkerActor::base {
 public:
  Worker(caf::actor_config& cfg, WorkerContext ctx);

  void on_exit() override;
  behavior_type make_behavior() override;

 private:
  using Key = std::tuple<int64_t, int, int64_t>;

  // the stage tasks (worker.cpp)
  std::string where() const;
  void fail(const std::string& what);
  Task* live(uint64_t id);
  void start_next();
  void begin_current();
  bool wait_for_memory();
  void early_start();
  void maybe_prefetch();
  void prefetch_behind();
  std::unique_ptr<Task> prepare(RunStage rs, int windows = 1);
  void pump();
  void maybe_finish();
  void grads_final(const GradsFinal& f);
  void drain_grad(Task& t, int g);
  void finish(uint64_t id);
  void retry_memory_wait();
  std::string status() const;

  // the copies and their completions (worker_copies.cpp)
  void copy(const TransferActor& via, CopyDir dir, void* dst, const void* src, size_t bytes, int prio,
            int64_t order, const CopyTag& what);
  void on_copy_done(const CopyDone& d);
  void spill_done(const SpillDone& d);
  void issue_spill_downloads();
  void frozen_fetched(const FrozenFetched& f);
  void send_pieces(Task& t, const std::vector<UploadWindows::Piece>& pieces);
  void weights_landed(uint64_t id, int g);
  void dequantized(const ComputeDone& c);
  void mark_uploaded(Task& t);
  void input_landed(uint64_t id, int64_t m);
  bool input_ready(const Task& t, int64_t m) const;
  bool may_upload(const Task& t) const;
  void issue_uploads(Task& t);
  void on_computed(int64_t m);
  void output_landed(uint64_t id, int64_t m);
  void on_downloaded(Task& t, int64_t m);
  void write_grad(uint64_t id, int g, bool overwrite);
  void gradient_staged(uint64_t id, int g);
  void gradient_landed(uint64_t id, int g);

  WorkerContext ctx_;
  const std::string me_ = fmt::format("worker{}", ctx_.index);  ///< this actor in traced messages
  TransferActor act_up_, act_down_, param_up_, grad_down_;
  std::shared_ptr<CopyGate> gate_;
  SpillPort spill_;  ///< the activation spill's side of this worker (inert without ctx_.spill)
  std::deque<RunStage> queue_;
  std::unique_ptr<Task> task_;                          ///< computing now
  std::unique_ptr<Task> next_;                          ///< prefetching its weights
  std::unique_ptr<Task> after_;                         ///< prefetching behind a weightless next_
  std::map<uint64_t, std::unique_ptr<Task>> draining_;  ///< writing back gradients
  uint64_t next_task_id_ = 1;
  /// later gradient contributions of a step (tied embeddings) and their additions on the host
  GradientStaging staging_{ctx_.device};
  std::set<Key> ready_;
  std::map<CopyTag, int> outstanding_;  ///< copies issued and not completed, by tag
  int64_t param_order_ = 0;             ///< parameter chunks leave in the order they are sent
  bool failed_ = false;
  bool alloc_wait_ = false;  ///< the next start waits for a draining task to free memory
};

}  // namespace rp
