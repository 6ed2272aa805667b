// The MPI implementation of rp::Replicas (roundpipe/replicas.hpp): one communication thread
// initialises MPI (MPI_THREAD_FUNNELED: it is the only thread that ever calls MPI), takes
// requests from a queue, drives them with nonblocking point-to-point calls and polls; the
// callers (optimizer shards, the trainer) never touch MPI.
//
// Tags: 1 heartbeat, 2 bye (this rank is done: stop expecting its heartbeats), 3 abort (this
// rank failed; the text follows), 4 allgather, 16 + 2 key + phase for a gradient sum (phase 0:
// every rank's copy of shard r to rank r, phase 1: the summed shard r from rank r to all).
// Messages of one (source, tag) are matched in the order they were sent (MPI's
// non-overtaking rule), and a key's sums are issued in the same order on every rank, so
// consecutive steps of one group reuse the same tags safely.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "roundpipe/replicas.hpp"

namespace rp {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTagHeartbeat = 1, kTagBye = 2, kTagAbort = 3, kTagGather = 4, kTagGrad = 16;
constexpr int kAbortChars = 1024;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string mpi_error_text(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  return std::string(buf, size_t(len));
}

/// One gradient sum in flight.
struct SumOp {
  int key = 0;
  float* data = nullptr;
  int64_t n = 0;
  std::string what;
  std::function<void(const std::string&)> done;
  int phase = -1;  // -1 queued, 0 shards to their owners, 1 summed shards to everyone
  std::vector<MPI_Request> reqs;
  std::vector<std::vector<float>> inbox;  // phase 0: every rank's copy of this rank's shard
};

/// One allgather of the trainer's scalars.
struct GatherOp {
  std::vector<double> values;
  std::promise<std::vector<std::vector<double>>> result;
  bool started = false;
  std::vector<MPI_Request> reqs;
  std::vector<std::vector<double>> got;
};

class MpiReplicas final : public Replicas {
 public:
  explicit MpiReplicas(double timeout_s) : timeout_s_(timeout_s > 0 ? timeout_s : 60) {
    std::future<std::string> ready = ready_.get_future();
    thread_ = std::thread([this] { run(); });
    const std::string err = ready.get();
    if (!err.empty()) {
      thread_.join();
      throw std::runtime_error(err);
    }
  }
  ~MpiReplicas() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void sum_async(int key, float* data, int64_t n, std::string what,
                 std::function<void(const std::string&)> done) override {
    auto op = std::make_unique<SumOp>();
    op->key = key, op->data = data, op->n = n, op->what = std::move(what), op->done = std::move(done);
    std::string err;
    {
      std::lock_guard lk(mu_);
      if (failed_.empty()) incoming_.push_back(std::move(op));
      else err = failed_;
    }
    if (!err.empty()) return op->done(err);
    cv_.notify_all();
  }

  std::vector<std::vector<double>> allgather(const std::vector<double>& values) override {
    auto op = std::make_shared<GatherOp>();
    op->values = values;
    auto f = op->result.get_future();
    {
      std::lock_guard lk(mu_);
      if (!failed_.empty()) throw ReplicaFailure(failed_);
      gathers_in_.push_back(op);
    }
    cv_.notify_all();
    return f.get();  // throws ReplicaFailure when the exchange fails
  }

  void abort(const std::string& error) override {
    {
      std::lock_guard lk(mu_);
      if (!failed_.empty() || abort_text_) return;
      abort_text_ = error;
    }
    cv_.notify_all();
    // the thread sends it (at most a few seconds) and fails itself; wait for that
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, std::chrono::seconds(5), [this] { return !failed_.empty(); });
  }

  ReplicaStats stats() const override {
    std::lock_guard lk(mu_);
    return stats_;
  }
  std::string failure() const override {
    std::lock_guard lk(mu_);
    return failed_;
  }

 private:
  // ---- the communication thread ---------------------------------------------------------
  void run();
  std::string init();
  void poll();
  void start(SumOp& op);
  bool advance(SumOp& op);
  bool advance(GatherOp& op);
  void heartbeats();
  void check_peers();
  void fail(const std::string& what);
  void send_abort(const std::string& text);
  void finish();
  /// MPI_Testall over `reqs`: true when all completed; an MPI error fails the run.
  bool test_all(std::vector<MPI_Request>& reqs, const char* doing);
  int64_t begin(int64_t n, int r) const { return n * r / size_; }
  int64_t len(int64_t n, int r) const { return begin(n, r + 1) - begin(n, r); }

  const double timeout_s_;
  int rank_ = 0, size_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::promise<std::string> ready_;
  std::thread thread_;

  mutable std::mutex mu_;  // guards the members below up to the thread's own state
  std::condition_variable cv_;
  std::deque<std::unique_ptr<SumOp>> incoming_;
  std::deque<std::shared_ptr<GatherOp>> gathers_in_;
  std::optional<std::string> abort_text_;
  std::string failed_;
  bool stop_ = false;
  ReplicaStats stats_;

  // the thread's own state
  std::deque<std::unique_ptr<SumOp>> active_;
  std::deque<std::shared_ptr<GatherOp>> gathers_;
  std::vector<int> hb_in_, bye_in_;
  std::vector<std::vector<char>> abort_in_;
  std::vector<MPI_Request> hb_req_, bye_req_, abort_req_, sends_;
  std::vector<Clock::time_point> last_seen_;
  std::vector<bool> said_bye_;
  Clock::time_point last_hb_;
  bool bye_sent_ = false;
  bool had_active_ = false;
  Clock::time_point last_poll_;
  int hb_token_ = 0;
};

std::string MpiReplicas::init() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return "MPI was already initialised by someone else in this process";
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    return "MPI_Init_thread failed";
  if (provided < MPI_THREAD_FUNNELED) return "the MPI library does not support MPI_THREAD_FUNNELED";
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  const size_t N = size_t(size_);
  hb_in_.assign(N, 0), bye_in_.assign(N, 0), abort_in_.assign(N, std::vector<char>(kAbortChars, 0));
  hb_req_.assign(N, MPI_REQUEST_NULL), bye_req_.assign(N, MPI_REQUEST_NULL),
      abort_req_.assign(N, MPI_REQUEST_NULL);
  last_seen_.assign(N, Clock::now());
  said_bye_.assign(N, false);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    MPI_Irecv(&hb_in_[size_t(p)], 1, MPI_INT, p, kTagHeartbeat, comm_, &hb_req_[size_t(p)]);
    MPI_Irecv(&bye_in_[size_t(p)], 1, MPI_INT, p, kTagBye, comm_, &bye_req_[size_t(p)]);
    MPI_Irecv(abort_in_[size_t(p)].data(), kAbortChars, MPI_CHAR, p, kTagAbort, comm_,
              &abort_req_[size_t(p)]);
  }
  last_hb_ = Clock::now() - std::chrono::hours(1);
  return "";
}

void MpiReplicas::run() {
  const std::string err = init();
  ready_.set_value(err);
  if (!err.empty()) return;
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock lk(mu_);
      const auto wait = active_.empty() && gathers_.empty() && incoming_.empty() && gathers_in_.empty()
                            ? std::chrono::microseconds(5000)
                            : std::chrono::microseconds(100);
      cv_.wait_for(lk, wait);
      while (!incoming_.empty()) active_.push_back(std::move(incoming_.front())), incoming_.pop_front();
      while (!gathers_in_.empty())
        gathers_.push_back(std::move(gathers_in_.front())), gathers_in_.pop_front();
      stopping = stop_;
      if (abort_text_ && failed_.empty()) {
        const std::string text = *abort_text_;
        lk.unlock();
        send_abort(text);
        continue;
      }
    }
    if (!failure().empty()) {
      fail(failure());       // fails what arrived since
      if (stopping) return;  // peers may be gone: no MPI_Finalize (mpirun reports the exit)
      continue;
    }
    poll();
    if (stopping && active_.empty() && gathers_.empty() && failure().empty()) return finish();
  }
}

void MpiReplicas::poll() {
  // wall time with a sum in flight: since the last poll, if one was in flight then
  const auto now = Clock::now();
  if (had_active_) {
    std::lock_guard lk(mu_);
    stats_.busy_s += std::chrono::duration<double>(now - last_poll_).count();
  }
  last_poll_ = now;
  for (auto it = active_.begin(); it != active_.end() && failure().empty();) {
    if ((*it)->phase < 0) start(**it);
    if (failure().empty() && advance(**it)) {
      (*it)->done("");
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = gathers_.begin(); it != gathers_.end() && failure().empty();) {
    if (advance(**it)) {
      (*it)->result.set_value(std::move((*it)->got));
      it = gathers_.erase(it);
    } else {
      ++it;
    }
  }
  if (failure().empty()) heartbeats();
  if (failure().empty()) check_peers();
  had_active_ = !active_.empty();
}

void MpiReplicas::start(SumOp& op) {
  const int me = rank_;
  if (len(op.n, 0) + 1 >= INT_MAX)
    return fail(fmt::format("{}: {} values are too many for one message", op.what, op.n));
  op.phase = 0;
  op.inbox.assign(size_t(size_), {});
  for (int q = 0; q < size_; ++q) {
    if (q == me) continue;
    op.inbox[size_t(q)].resize(size_t(len(op.n, me)));
    op.reqs.emplace_back();
    MPI_Irecv(op.inbox[size_t(q)].data(), int(len(op.n, me)), MPI_FLOAT, q, kTagGrad + 2 * op.key, comm_,
              &op.reqs.back());
    op.reqs.emplace_back();
    MPI_Isend(op.data + begin(op.n, q), int(len(op.n, q)), MPI_FLOAT, q, kTagGrad + 2 * op.key, comm_,
              &op.reqs.back());
  }
}

bool MpiReplicas::advance(SumOp& op) {
  if (!test_all(op.reqs, op.what.c_str())) return false;
  if (op.phase == 1) {
    std::lock_guard lk(mu_);
    stats_.reductions++;
    stats_.bytes_reduced += double(op.n) * 4;
    stats_.bytes_sent += double(op.n - len(op.n, rank_)) * 4 + double(len(op.n, rank_)) * 4 * (size_ - 1);
    return true;
  }
  // phase 0 done: sum this rank's shard in rank order, its own copy in its place
  const int me = rank_;
  float* mine = op.data + begin(op.n, me);
  const int64_t m = len(op.n, me);
  std::vector<const float*> src(static_cast<size_t>(size_));
  for (int q = 0; q < size_; ++q) src[size_t(q)] = q == me ? mine : op.inbox[size_t(q)].data();
  for (int64_t i = 0; i < m; ++i) {
    float s = src[0][i];
    for (int q = 1; q < size_; ++q) s += src[size_t(q)][i];
    mine[i] = s;
  }
  op.inbox.clear();
  op.phase = 1;
  for (int q = 0; q < size_; ++q) {
    if (q == me) continue;
    op.reqs.emplace_back();
    MPI_Isend(mine, int(m), MPI_FLOAT, q, kTagGrad + 2 * op.key + 1, comm_, &op.reqs.back());
    op.reqs.emplace_back();
    MPI_Irecv(op.data + begin(op.n, q), int(len(op.n, q)), MPI_FLOAT, q, kTagGrad + 2 * op.key + 1, comm_,
              &op.reqs.back());
  }
  return false;
}

bool MpiReplicas::advance(GatherOp& op) {
  const int k = int(op.values.size());
  if (!op.started) {
    op.started = true;
    op.got.assign(size_t(size_), std::vector<double>(size_t(k)));
    op.got[size_t(rank_)] = op.values;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      op.reqs.emplace_back();
      MPI_Irecv(op.got[size_t(q)].data(), k, MPI_DOUBLE, q, kTagGather, comm_, &op.reqs.back());
      op.reqs.emplace_back();
      MPI_Isend(op.values.data(), k, MPI_DOUBLE, q, kTagGather, comm_, &op.reqs.back());
    }
  }
  return test_all(op.reqs, "an exchange of the trainer's step results");
}

bool MpiReplicas::test_all(std::vector<MPI_Request>& reqs, const char* doing) {
  if (reqs.empty()) return true;
  int flag = 0;
  const int rc = MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) {
    fail(fmt::format("replica {}: MPI failed during {}: {}", rank_, doing, mpi_error_text(rc)));
    return false;
  }
  if (flag) reqs.clear();
  return flag != 0;
}

void MpiReplicas::heartbeats() {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const size_t i = size_t(p);
    int flag = 0;
    while (hb_req_[i] != MPI_REQUEST_NULL && MPI_Test(&hb_req_[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
           flag) {
      last_seen_[i] = Clock::now();
      MPI_Irecv(&hb_in_[i], 1, MPI_INT, p, kTagHeartbeat, comm_, &hb_req_[i]);
    }
    if (bye_req_[i] != MPI_REQUEST_NULL && MPI_Test(&bye_req_[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
        flag)
      said_bye_[i] = true;
    if (abort_req_[i] != MPI_REQUEST_NULL &&
        MPI_Test(&abort_req_[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
      abort_in_[i].back() = 0;
      return fail(fmt::format("replica {} failed: {}", p, abort_in_[i].data()));
    }
  }
  // our own heartbeats, about four per timeout (at most one a second)
  const double period = std::min(1.0, timeout_s_ / 4);
  if (!bye_sent_ && since(last_hb_) >= period) {
    last_hb_ = Clock::now();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || said_bye_[size_t(p)]) continue;
      sends_.emplace_back();
      MPI_Isend(&hb_token_, 1, MPI_INT, p, kTagHeartbeat, comm_, &sends_.back());
    }
  }
  for (auto it = sends_.begin(); it != sends_.end();) {
    int flag = 0;
    const int rc = MPI_Test(&*it, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
      return fail(fmt::format("replica {}: MPI failed sending a heartbeat: {}", rank_, mpi_error_text(rc)));
    it = flag ? sends_.erase(it) : it + 1;
  }
}

void MpiReplicas::check_peers() {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || said_bye_[size_t(p)]) continue;
    const double silent = since(last_seen_[size_t(p)]);
    if (silent <= timeout_s_) continue;
    std::string doing = "while idle";
    if (!active_.empty()) doing = "while summing " + active_.front()->what;
    else if (!gathers_.empty()) doing = "during an exchange of step results";
    return fail(
        fmt::format("replica {} sent nothing for {:.1f} s {} (it died, hangs or its network is down; "
                    "replica_timeout_s is {:g})",
                    p, silent, doing, timeout_s_));
  }
}

void MpiReplicas::fail(const std::string& what) {
  {
    std::lock_guard lk(mu_);
    if (failed_.empty()) failed_ = what;
  }
  note_replica_failure(what);  // for the stop-signal handler (a no-op after the first)
  cv_.notify_all();
  for (auto& op : active_) op->done(what);
  active_.clear();
  for (auto& g : gathers_) g->result.set_exception(std::make_exception_ptr(ReplicaFailure(what)));
  gathers_.clear();
}

void MpiReplicas::send_abort(const std::string& text) {
  std::vector<char> msg(text.begin(), text.end());
  msg.resize(std::min<size_t>(msg.size(), kAbortChars - 1));
  msg.push_back(0);
  std::vector<MPI_Request> reqs;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    reqs.emplace_back();
    MPI_Isend(msg.data(), int(msg.size()), MPI_CHAR, p, kTagAbort, comm_, &reqs.back());
  }
  const auto t0 = Clock::now();
  int flag = 0;
  while (!reqs.empty() && since(t0) < 3 &&
         MPI_Testall(int(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE) == MPI_SUCCESS && !flag)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  fail(fmt::format("replica {} failed: {}", rank_, text));
}

/// A clean end: tell every peer, wait until each said the same (still watching their
/// heartbeats: a peer that dies now is not waited for), withdraw the receives, finalise.
void MpiReplicas::finish() {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    sends_.emplace_back();
    MPI_Isend(&hb_token_, 1, MPI_INT, p, kTagBye, comm_, &sends_.back());
  }
  bye_sent_ = true;
  for (;;) {
    heartbeats();
    if (failure().empty()) check_peers();
    if (!failure().empty()) return;  // no MPI_Finalize with a peer gone
    bool all = sends_.empty();
    for (int p = 0; p < size_; ++p) all = all && (p == rank_ || said_bye_[size_t(p)]);
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto* reqs : {&hb_req_, &abort_req_, &bye_req_})
    for (MPI_Request& r : *reqs)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      }
  MPI_Comm_free(&comm_);
  MPI_Finalize();
}

}  // namespace

bool mpi_available() { return true; }

std::shared_ptr<Replicas> mpi_replicas(double timeout_s) {
  static std::mutex mu;
  static std::shared_ptr<Replicas> world;
  std::lock_guard lk(mu);
  if (!world) world = std::make_shared<MpiReplicas>(timeout_s);
  return world;
}

}  // namespace rp
