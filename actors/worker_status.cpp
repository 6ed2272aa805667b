#include "actors/worker_status.hpp"

#include <fmt/format.h>

namespace rp {

std::string describe(const WorkerSnapshot& w) {
  std::vector<std::string> p;
  auto name = [](const Task& t) {
    return fmt::format("{} stage {} of pass {} (step {})", stage_kind_name(t.rs.stage.kind), t.rs.stage_index,
                       t.rs.pass, t.rs.step);
  };
  auto progress = [&](const Task& t, bool current) {
    const int64_t m = t.progress.next_upload();
    return t.progress.describe(m < t.M && w.input_ready && w.input_ready(t, m), current,
                               t.params_pending == 0);
  };
  if (w.failed) p.push_back("failed");
  if (const Task* t = w.current) {
    p.push_back(fmt::format("current {}: {}{}{}", name(*t), progress(*t, true),
                            t->params_pending > 0
                                ? fmt::format(", weights of {} group(s) pending", t->params_pending)
                                : std::string(),
                            t->work_ready ? std::string() : std::string(", work buffers not allocated")));
  } else {
    p.push_back("no current task");
  }
  if (w.alloc_wait) p.push_back("its start waits for a draining task to free device memory");
  for (const Task* t : w.prefetching)
    p.push_back(fmt::format("prefetching {}: weights of {} group(s) pending, {}", name(*t), t->params_pending,
                            progress(*t, false)));
  for (const Task* t : w.draining)
    p.push_back(fmt::format("draining {}: {} of {} outputs down, {} gradient(s) pending", name(*t),
                            t->progress.downloads_done(), t->M, t->grads_pending));
  if (w.queued > 0) p.push_back(fmt::format("{} stage task(s) queued", w.queued));
  if (w.outstanding && !w.outstanding->empty()) {
    std::vector<std::string> c;
    for (auto& [tag, n] : *w.outstanding)
      c.push_back(n > 1 ? fmt::format("{} x {}", n, describe(tag)) : describe(tag));
    p.push_back(fmt::format("copies outstanding: {}", fmt::join(c, ", ")));
  }
  return fmt::format("worker {}: {}", w.index, fmt::join(p, "; "));
}

}  // namespace rp
