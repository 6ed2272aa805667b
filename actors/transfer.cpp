#include "actors/transfer.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <queue>

#include <fmt/format.h>

#include "actors/link_arbiter.hpp"
#include "actors/messages.hpp"
#include "scheduler/chunk_plan.hpp"
#include "trace/tracer.hpp"

namespace rp {
namespace {

struct Pending {
  CopyRequest req;
  uint64_t seq;
  double t_enq;
  bool operator<(const Pending& o) const {  // std::priority_queue is a max-heap
    if (req.priority != o.req.priority) return req.priority > o.req.priority;
    if (req.order != o.req.order) return req.order > o.req.order;
    return seq > o.seq;
  }
};

/// A copy whose chunks are being issued or are in flight.
struct Job {
  CopyRequest req;
  std::vector<Chunk> chunks;
  size_t next = 0;     ///< next chunk to issue
  int inflight = 0;    ///< chunks issued, not completed
  double t_ready = 0;  ///< when the next chunk became ready (enqueue, then last completion)
  std::string error;
};

struct TransferState {
  std::priority_queue<Pending> queue;
  std::map<uint64_t, Job> jobs;     ///< started, not finished
  std::optional<uint64_t> current;  ///< the job whose chunks are being issued
  int chunks_inflight = 0;
  bool awaiting_wake = false;  ///< the arbiter holds our wake-up callback
  uint64_t seq = 0;
  static inline const char* name = "transfer";
};

using TransferPointer = TransferActor::stateful_pointer<TransferState>;

class Transfer {
 public:
  Transfer(TransferPointer self, Stream* stream, std::string name, TransferOptions opt)
      : self_(self), stream_(stream), name_(std::move(name)), opt_(std::move(opt)) {}

  double now() const { return opt_.tracer ? opt_.tracer->now() : 0.0; }

  void enqueue(CopyRequest&& r) {
    if (opt_.faults.fire_copy(FaultInjection::Site::transfer_handler, opt_.worker, r.what))
      throw std::runtime_error(FaultInjection::what("request for the " + describe(r.what)));
    auto& st = self_->state;
    if (!opt_.bulk && opt_.arbiter) opt_.arbiter->activation_enqueued();
    st.queue.push(Pending{std::move(r), st.seq++, now()});
    pump();
  }

  /// Issues what the rules allow: see transfer.hpp.
  void pump() {
    auto& st = self_->state;
    const bool yield = opt_.bulk && opt_.priorities;
    for (;;) {
      if (!st.current && st.queue.empty()) return;
      if (yield) {
        // decide before picking a copy, so a more urgent one that arrives meanwhile goes first
        if (st.chunks_inflight >= std::max(1, opt_.bulk_inflight) || st.awaiting_wake) return;
        if (opt_.arbiter) {
          caf::actor_addr me = self_->address();
          if (!opt_.arbiter->try_bulk([me] {
                if (auto a = caf::actor_cast<TransferActor>(me)) caf::anon_send(a, LinkIdle{});
              })) {
            st.awaiting_wake = true;
            return;
          }
        }
      } else if (!st.current && int(st.jobs.size()) >= std::max(1, opt_.max_inflight)) {
        return;
      }
      if (!st.current) {
        Pending p = st.queue.top();
        st.queue.pop();
        Job j;
        j.chunks = split_chunks(p.req.bytes, opt_.bulk ? opt_.chunk_bytes : 0);
        if (j.chunks.empty()) j.chunks.push_back(Chunk{0, 0});
        j.t_ready = p.t_enq;
        j.req = std::move(p.req);
        st.jobs.emplace(p.seq, std::move(j));
        st.current = p.seq;
      }
      if (!yield && opt_.bulk && opt_.arbiter) opt_.arbiter->bulk_issued();
      const uint64_t id = *st.current;
      Job& j = st.jobs.at(id);
      const size_t k = j.next++;
      if (j.next == j.chunks.size()) st.current.reset();
      issue(id, j, k);
    }
  }

  void issue(uint64_t id, Job& j, size_t k) {
    std::unique_lock<std::mutex> gate_lock;
    if (opt_.gate) {
      gate_lock = std::unique_lock<std::mutex>(opt_.gate->m);
      if (opt_.gate->closed) return;  // the worker is freeing its buffers: never issue again
    }
    auto& st = self_->state;
    const Chunk c = j.chunks[k];
    const CopyRequest& r = j.req;
    j.inflight++;
    st.chunks_inflight++;
    if (k == 0 && opt_.faults.fire_copy(FaultInjection::Site::transfer, opt_.worker, r.what)) {
      // the copy fails on the stream, as a device copy error would
      stream_->launch([what = FaultInjection::what(name_ + ": copy of the " + describe(r.what))] {
        throw std::runtime_error(what);
      });
    } else if (r.dir == CopyDir::h2d) {
      stream_->copy_h2d(static_cast<char*>(r.dst) + c.offset, static_cast<const char*>(r.src) + c.offset,
                        c.bytes);
    } else {
      stream_->copy_d2h(static_cast<char*>(r.dst) + c.offset, static_cast<const char*>(r.src) + c.offset,
                        c.bytes);
    }
    const double t_issue = now();
    const size_t n = j.chunks.size();
    auto me = caf::actor_cast<TransferActor>(self_);
    auto arb = opt_.arbiter;
    const bool bulk = opt_.bulk;
    Tracer* tr = opt_.tracer;
    const double queued_us = (t_issue - j.t_ready) * 1e6;
    std::string name = name_;
    // Runs on the stream's callback thread: whatever happens here, StreamDone goes out, so
    // the copy never stays outstanding.
    stream_->then([=](const std::string& err) {
      std::string e = err;
      double t_done = 0.0;
      try {
        t_done = tr ? tr->now() : 0.0;
        if (tr) {
          std::vector<std::pair<std::string, double>> args{{"bytes", double(c.bytes)},
                                                           {"queued_us", queued_us}};
          if (n > 1) {
            args.emplace_back("chunk", double(k));
            args.emplace_back("chunks", double(n));
          }
          tr->interval(
              name,
              n > 1 ? fmt::format("copy {} B ({}/{})", c.bytes, k + 1, n) : fmt::format("copy {} B", c.bytes),
              t_issue, t_done, std::move(args));
        }
        // Free the link before the actor hears of it: the bulk actor may go on at once.
        if (arb) {
          if (bulk) arb->bulk_completed();
          else arb->activation_completed();
        }
      } catch (const std::exception& ex) {
        if (e.empty()) e = name + ": " + ex.what();
      }
      caf::anon_send(me, StreamDone{id, k, t_done, std::move(e)});
    });
  }

  void done(StreamDone& d) {
    auto& st = self_->state;
    st.chunks_inflight--;
    auto it = st.jobs.find(d.id);
    if (it == st.jobs.end()) return pump();
    Job& j = it->second;
    j.inflight--;
    j.t_ready = std::max(j.t_ready, d.t_done);
    if (!d.error.empty() && j.error.empty()) {
      j.error = std::move(d.error);
      j.next = j.chunks.size();  // issue no more of this copy
      if (st.current == d.id) st.current.reset();
    }
    if (j.next == j.chunks.size() && j.inflight == 0) {
      if (j.req.reply_to) self_->send(j.req.reply_to, CopyDone{j.req.what, std::move(j.error)});
      st.jobs.erase(it);
    }
    pump();
  }

  void idle() {
    self_->state.awaiting_wake = false;
    pump();
  }

 private:
  TransferPointer self_;
  Stream* stream_;
  std::string name_;
  TransferOptions opt_;
};

TransferActor::behavior_type transfer_impl(TransferPointer self, Stream* stream, std::string name,
                                           TransferOptions opt) {
  auto t = std::make_shared<Transfer>(self, stream, name, std::move(opt));
  // an exception in a handler ends the actor with its text (the worker monitors it)
  self->set_exception_handler([name](std::exception_ptr& x) -> caf::error {
    return failure_reason(name + ": " + exception_text(x));
  });
  return {
      [t](CopyRequest& r) { t->enqueue(std::move(r)); },
      [t](StreamDone& d) { t->done(d); },
      [t](LinkIdle) { t->idle(); },
  };
}

}  // namespace

TransferActor spawn_transfer_actor(caf::actor_system& sys, Stream& stream, std::string name,
                                   TransferOptions opt) {
  return sys.spawn(transfer_impl, &stream, std::move(name), std::move(opt));
}

}  // namespace rp

namespace rp {

WorkerTransfers spawn_worker_transfers(caf::actor_system& sys, Device& d, int index,
                                       const TransferSettings& s, Tracer* tracer,
                                       const FaultInjection& faults) {
  WorkerTransfers w;
  w.h2d = std::make_shared<LinkArbiter>();
  w.d2h = std::make_shared<LinkArbiter>();
  w.gate = std::make_shared<CopyGate>();
  auto spawn = [&](StreamKind k, bool bulk, std::shared_ptr<LinkArbiter> arb) {
    TransferOptions o;
    o.max_inflight = bulk ? 1 : 2;
    o.bulk = bulk;
    o.arbiter = std::move(arb);
    o.priorities = s.priorities;
    o.chunk_bytes = s.chunk_bytes;
    o.bulk_inflight = s.bulk_inflight;
    o.tracer = tracer;
    o.gate = w.gate;
    o.worker = index;
    o.faults = faults;
    return spawn_transfer_actor(sys, d.stream(k), fmt::format("worker{}.{}", index, stream_name(k)),
                                std::move(o));
  };
  w.act_up = spawn(StreamKind::act_up, false, w.h2d);
  w.param_up = spawn(StreamKind::param_up, true, w.h2d);
  w.act_down = spawn(StreamKind::act_down, false, w.d2h);
  w.grad_down = spawn(StreamKind::grad_down, true, w.d2h);
  return w;
}

}  // namespace rp
