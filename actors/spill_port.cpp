#include "actors/spill_port.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "actors/stage_task.hpp"

namespace rp {
namespace {

/// The layers whose saved input t uploads per micro-batch (Worker::issue_uploads).
std::vector<int> uploaded_inputs(const Task& t) {
  std::vector<int> out;
  for (int l : t.layers)
    if (stage_uploads_input(t.rs.stage, l)) out.push_back(l);
  return out;
}

}  // namespace

void SpillPort::request_reads(Task& t, WorkerActor me) {
  if (!spill_) return;
  std::vector<int> layers;
  for (int l : uploaded_inputs(t))
    if (spill_->spilled(l)) layers.push_back(l);
  if (layers.empty()) return;
  t.spill_reads.start(spill_, t.M);
  const int set = t.rs.buffers->activations->spill_set;
  for (int64_t m = 0; m < t.M; ++m)
    for (int l : layers) {
      const uint64_t id = t.id;
      const uint64_t ticket = spill_->read(worker_, SpillRecord{set, l, m, t.rs.pass},
                                           [me, id, m, l](uint64_t tk, const std::string& err) {
                                             caf::anon_send(me, SpillDone{id, m, l, false, tk, err});
                                           });
      t.spill_reads.add(m, l, ticket);
    }
}

bool SpillPort::read_done(Task* t, const SpillDone& d) {
  if (t && t->spill_reads.landed(d.micro_batch, d.ticket)) return true;
  spill_->release(d.ticket);
  return false;
}

const void* SpillPort::input(const Task& t, int layer, int64_t m) const {
  if (spilled(layer)) {
    if (const std::byte* b = t.spill_reads.source(m, layer)) return b;
    throw std::logic_error(
        fmt::format("activation spill: layer {} micro-batch {} uploads with no read of it", layer, m));
  }
  return t.rs.buffers->x[size_t(layer)][size_t(m)].data();
}

void SpillPort::output(const Task& t, int64_t m, int layer, const void* src) {
  waiting_.push_back(Waiting{t.id, m, layer, src, t.rs.buffers->act_bytes});
}

void SpillPort::issue(const Live& live, const Download& down) {
  while (!waiting_.empty()) {
    const Waiting w = waiting_.front();
    if (!live(w.task)) {  // gone (a failed worker): its slot is gone too
      waiting_.pop_front();
      continue;
    }
    const std::optional<uint64_t> ticket = spill_->stage_write(worker_);
    if (!ticket) return;  // a write that completes gives a buffer back, then this runs again
    waiting_.pop_front();
    staged_[{w.task, w.m, w.layer}] = *ticket;
    down(spill_->buffer(*ticket), w.src, w.bytes, CopyTag{CopyKind::spill_output, w.task, w.m, w.layer});
  }
}

void SpillPort::output_landed(Task* t, const CopyTag& tag, WorkerActor me) {
  auto it = staged_.find({tag.task, tag.micro_batch, tag.group});
  if (it == staged_.end()) return;
  const uint64_t ticket = it->second;
  staged_.erase(it);
  if (!t) return spill_->release(ticket);
  const SpillRecord r{t->rs.buffers->activations->spill_set, tag.group, tag.micro_batch, t->rs.pass};
  spill_->write(ticket, r,
                [me, id = tag.task, m = tag.micro_batch, l = tag.group](uint64_t tk, const std::string& e) {
                  caf::anon_send(me, SpillDone{id, m, l, true, tk, e});
                });
}

void SpillPort::clear() {
  if (!spill_) return;
  for (auto& [k, ticket] : staged_) spill_->release(ticket);
  staged_.clear();
  waiting_.clear();
}

}  // namespace rp
