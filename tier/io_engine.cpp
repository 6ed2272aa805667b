#include "tier/io_engine.hpp"

#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace rp::tier {
namespace {

int g_init_failure_for_testing = 0;

void check_read(const IoRead& r, size_t in_flight, unsigned depth) {
  if (in_flight >= depth)
    throw std::logic_error(
        fmt::format("io engine: submit with {} reads in flight, depth {}", in_flight, depth));
  if (r.bytes > std::numeric_limits<unsigned>::max())
    throw std::invalid_argument(fmt::format("io engine: one read of {} bytes, at most {}", r.bytes,
                                            std::numeric_limits<unsigned>::max()));
}

class IoUringEngine final : public IoEngine {
 public:
  explicit IoUringEngine(unsigned depth) : depth_(depth) {
    const int rc =
        g_init_failure_for_testing ? -g_init_failure_for_testing : io_uring_queue_init(depth, &ring_, 0);
    if (rc < 0) throw std::runtime_error(fmt::format("io_uring_queue_init: {}", std::strerror(-rc)));
  }
  ~IoUringEngine() override {
    // the kernel may still write into the callers' buffers: wait for every read
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;  // the ring is unusable; queue_exit below waits for the kernel's reads
      take(cqe);
    }
    io_uring_queue_exit(&ring_);
  }
  void submit(const IoRead& r) override {
    check_read(r, in_flight_, depth_);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) throw std::logic_error("io_uring: no free submission entry below the queue depth");
    io_uring_prep_read(sqe, r.fd, r.dst, unsigned(r.bytes), r.offset);
    sqe->user_data = r.id;
    for (int attempt = 0;; ++attempt) {
      const int rc = io_uring_submit(&ring_);
      if (rc >= 0) break;
      if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && attempt < 100) continue;
      throw std::runtime_error(fmt::format("io_uring_submit: {}", std::strerror(-rc)));
    }
    ++in_flight_;
  }
  IoCompletion wait() override {
    if (in_flight_ == 0) throw std::logic_error("io_uring: wait with no read in flight");
    io_uring_cqe* cqe = nullptr;
    int rc;
    do rc = io_uring_wait_cqe(&ring_, &cqe);
    while (rc == -EINTR);
    if (rc < 0) throw std::runtime_error(fmt::format("io_uring_wait_cqe: {}", std::strerror(-rc)));
    return take(cqe);
  }
  std::optional<IoCompletion> poll() override {
    if (in_flight_ == 0) return std::nullopt;
    io_uring_cqe* cqe = nullptr;
    if (io_uring_peek_cqe(&ring_, &cqe) != 0 || !cqe) return std::nullopt;
    return take(cqe);
  }
  size_t in_flight() const override { return in_flight_; }
  unsigned depth() const override { return depth_; }
  std::string name() const override { return "io_uring"; }

 private:
  IoCompletion take(io_uring_cqe* cqe) {
    IoCompletion c{cqe->user_data, cqe->res};
    io_uring_cqe_seen(&ring_, cqe);
    --in_flight_;
    return c;
  }
  io_uring ring_{};
  unsigned depth_;
  size_t in_flight_ = 0;
};

class PreadPool final : public IoEngine {
 public:
  PreadPool(unsigned depth, unsigned threads) : depth_(depth) {
    threads = std::max(1u, std::min(threads, depth));
    for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~PreadPool() override {
    {
      std::unique_lock l(m_);
      done_cv_.wait(l, [&] { return todo_.empty() && busy_ == 0; });
      stop_ = true;
    }
    todo_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(const IoRead& r) override {
    check_read(r, in_flight_, depth_);
    {
      std::lock_guard l(m_);
      todo_.push_back(r);
    }
    ++in_flight_;
    todo_cv_.notify_one();
  }
  IoCompletion wait() override {
    if (in_flight_ == 0) throw std::logic_error("pread pool: wait with no read in flight");
    std::unique_lock l(m_);
    done_cv_.wait(l, [&] { return !done_.empty(); });
    return pop();
  }
  std::optional<IoCompletion> poll() override {
    std::lock_guard l(m_);
    if (done_.empty()) return std::nullopt;
    return pop();
  }
  size_t in_flight() const override { return in_flight_; }
  unsigned depth() const override { return depth_; }
  std::string name() const override { return fmt::format("pread pool ({} threads)", threads_.size()); }

 private:
  IoCompletion pop() {
    IoCompletion c = done_.front();
    done_.pop_front();
    --in_flight_;
    return c;
  }
  void run() {
    std::unique_lock l(m_);
    for (;;) {
      todo_cv_.wait(l, [&] { return stop_ || !todo_.empty(); });
      if (todo_.empty()) return;  // stop_ and nothing left
      const IoRead r = todo_.front();
      todo_.pop_front();
      ++busy_;
      l.unlock();
      ssize_t n;
      do n = ::pread(r.fd, r.dst, r.bytes, off_t(r.offset));
      while (n < 0 && errno == EINTR);
      const int64_t result = n < 0 ? -int64_t(errno) : int64_t(n);
      l.lock();
      --busy_;
      done_.push_back({r.id, result});
      done_cv_.notify_all();
    }
  }
  unsigned depth_;
  std::mutex m_;
  std::condition_variable todo_cv_, done_cv_;
  std::deque<IoRead> todo_;
  std::deque<IoCompletion> done_;
  size_t busy_ = 0;
  size_t in_flight_ = 0;  // only the driving thread touches it
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace

void set_io_uring_init_failure_for_testing(int err) { g_init_failure_for_testing = err; }

std::unique_ptr<IoEngine> make_io_engine(IoEngineKind kind, unsigned depth, unsigned pread_threads,
                                         std::string* fallback_reason) {
  if (depth < 1 || depth > 4096)
    throw std::invalid_argument(fmt::format("io engine: queue depth {}, expected 1..4096", depth));
  if (fallback_reason) fallback_reason->clear();
  if (kind == IoEngineKind::pread_pool) return std::make_unique<PreadPool>(depth, pread_threads);
  if (kind == IoEngineKind::io_uring) return std::make_unique<IoUringEngine>(depth);
  try {
    return std::make_unique<IoUringEngine>(depth);
  } catch (const std::runtime_error& e) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
      spdlog::warn("disk tier: io_uring unavailable ({}); reading with a pool of pread threads", e.what());
    if (fallback_reason) *fallback_reason = e.what();
    return std::make_unique<PreadPool>(depth, pread_threads);
  }
}

}  // namespace rp::tier
