#include "actors/transfer.hpp"

#include <queue>

#include "actors/messages.hpp"
#include "actors/tracer.hpp"

namespace rp {
namespace {

struct StreamDone {
  uint64_t id;
  std::string error;
};

struct Pending {
  CopyRequest req;
  uint64_t seq;
  bool operator<(const Pending& o) const {  // std::priority_queue is a max-heap
    if (req.priority != o.req.priority) return req.priority > o.req.priority;
    if (req.order != o.req.order) return req.order > o.req.order;
    return seq > o.seq;
  }
};

struct TransferState {
  std::priority_queue<Pending> queue;
  std::unordered_map<uint64_t, CopyRequest> inflight;
  uint64_t seq = 0;
  static inline const char* name = "transfer";
};

}  // namespace
}  // namespace rp

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(rp::StreamDone)

namespace rp {
namespace {

caf::behavior transfer_impl(caf::stateful_actor<TransferState>* self, Stream* stream, std::string name,
                            int max_inflight, Tracer* tracer) {
  auto issue = [=] {
    auto& st = self->state;
    while (!st.queue.empty() && int(st.inflight.size()) < max_inflight) {
      Pending p = st.queue.top();
      st.queue.pop();
      uint64_t id = p.seq;
      CopyRequest& r = st.inflight.emplace(id, std::move(p.req)).first->second;
      double t0 = tracer ? tracer->now() : 0;
      if (r.dir == CopyDir::h2d)
        stream->copy_h2d(r.dst, r.src, r.bytes);
      else
        stream->copy_d2h(r.dst, r.src, r.bytes);
      auto me = caf::actor_cast<caf::actor>(self);
      auto after = r.after;
      size_t bytes = r.bytes;
      stream->then([me, id, after, tracer, t0, name, bytes](const std::string& err) {
        std::string e = err;
        if (e.empty() && after) {
          try {
            after();
          } catch (const std::exception& ex) {
            e = name + ": " + ex.what();
          }
        }
        if (tracer) tracer->interval(name, fmt::format("copy {} B", bytes), t0, tracer->now());
        caf::anon_send(me, StreamDone{id, std::move(e)});
      });
    }
  };
  return {
      [=](CopyRequest& r) {
        self->state.queue.push(Pending{std::move(r), self->state.seq++});
        issue();
      },
      [=](StreamDone& d) {
        auto it = self->state.inflight.find(d.id);
        if (it == self->state.inflight.end()) return;
        CopyRequest r = std::move(it->second);
        self->state.inflight.erase(it);
        if (r.reply_to) self->send(r.reply_to, CopyDone{r.token, std::move(d.error)});
        issue();
      },
  };
}

}  // namespace

caf::actor spawn_transfer_actor(caf::actor_system& sys, Stream& stream, std::string name, int max_inflight,
                                Tracer* tracer) {
  return sys.spawn(transfer_impl, &stream, std::move(name), max_inflight, tracer);
}

}  // namespace rp
