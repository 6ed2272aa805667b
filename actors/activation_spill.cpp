#include "actors/activation_spill.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "base/counted.hpp"

namespace rp {
namespace {

constexpr double kGiB = double(uint64_t(1) << 30);
constexpr unsigned kReadDepth = 8;              ///< pieces of a record's read in flight
constexpr size_t kReadPiece = size_t(1) << 20;  ///< one piece at most (a multiple of 4096)

/// An unnamed file in `folder`: O_TMPFILE, else mkostemp and unlink at once. O_DIRECT first where
/// `direct`, then buffered. -1 with errno set when neither works; `*direct` says what was opened.
int open_hidden(const std::string& folder, bool* direct) {
  const int base = O_RDWR | O_CLOEXEC;
  for (bool d : {true, false}) {
    if (d && !*direct) continue;
    const int fd = ::open(folder.c_str(), O_TMPFILE | base | (d ? O_DIRECT : 0), 0600);
    if (fd >= 0) {
      *direct = d;
      return fd;
    }
    if (errno == EACCES || errno == ENOENT || errno == ENOTDIR || errno == EROFS || errno == ENOSPC)
      return -1;
  }
  for (bool d : {true, false}) {  // O_TMPFILE refused by the file system (or an old kernel)
    if (d && !*direct) continue;
    std::string name = folder + "/.roundpipe-spill-XXXXXX";
    const int fd = ::mkostemp(name.data(), O_CLOEXEC | (d ? O_DIRECT : 0));
    if (fd < 0) continue;
    ::unlink(name.c_str());  // nameless from here on: freed when the process ends
    *direct = d;
    return fd;
  }
  return -1;
}

}  // namespace

SpillFault fail_nth_spill_read(uint64_t n, int err) {
  return [n, err](bool write, uint64_t index, uint64_t) { return !write && index == n ? err : 0; };
}

ActivationSpill::ActivationSpill(SpillConfig config, tier::HostAllocator allocator)
    : cfg_(std::move(config)) {
  if (cfg_.layers.empty() || cfg_.sets < 1 || cfg_.micro_batches < 1 || cfg_.act_bytes == 0 ||
      cfg_.workers < 1 || cfg_.staging < 1)
    throw std::invalid_argument("activation spill: empty configuration");
  index_.assign(size_t(std::max(cfg_.num_layers, 0)), -1);
  for (size_t i = 0; i < cfg_.layers.size(); ++i) {
    const int l = cfg_.layers[i];
    if (l < 1 || l >= cfg_.num_layers || index_[size_t(l)] >= 0)
      throw std::invalid_argument(fmt::format("activation spill: bad spilled layer {}", l));
    index_[size_t(l)] = int(i);
  }
  record_bytes_ = size_t(tier::align_up(cfg_.act_bytes));
  const uint64_t records = uint64_t(cfg_.sets) * cfg_.layers.size() * uint64_t(cfg_.micro_batches);
  file_bytes_ = records * record_bytes_;
  open_file();  // refuses a file the folder has no room for before anything is allocated
  written_.assign(size_t(records), -1);
  engine_ = tier::make_io_engine(tier::IoEngineKind::automatic, kReadDepth);
  const size_t reads = std::max(cfg_.staging, cfg_.layers.size());
  for (int w = 0; w < cfg_.workers; ++w) {
    Pool p;
    p.reads = std::make_unique<tier::BufferRing>(reads, record_bytes_, allocator);
    p.writes = std::make_unique<tier::BufferRing>(cfg_.staging, record_bytes_, allocator);
    pools_.push_back(std::move(p));
  }
  thread_ = std::jthread([this](std::stop_token st) { serve(st); });
}

ActivationSpill::~ActivationSpill() {
  stop();
  held_.clear();  // before the pools: every lease goes back to its ring
}

// Free space first (one line with the bytes needed and free), then the hidden file, reserved
// whole where the file system can (so a write never finds the disk full).
void ActivationSpill::open_file() {
  struct statvfs vfs {};
  if (::statvfs(cfg_.folder.c_str(), &vfs) != 0)
    throw std::runtime_error(
        fmt::format("frozen_tier.spill_layers: cannot use the folder {} for the spill file: {}", cfg_.folder,
                    std::strerror(errno)));
  const uint64_t free_bytes = uint64_t(vfs.f_bavail) * uint64_t(vfs.f_frsize);
  const auto refuse = [&](uint64_t avail) {
    return std::runtime_error(fmt::format(
        "frozen_tier.spill_layers: {} need a spill file of {} bytes ({:.2f} GiB) in {}, but only {} "
        "bytes ({:.2f} GiB) are free (expected fewer layers or a folder on a larger disk)",
        counted(cfg_.layers.size(), "layer"), file_bytes_, double(file_bytes_) / kGiB, cfg_.folder, avail,
        double(avail) / kGiB));
  };
  if (free_bytes < file_bytes_) throw refuse(free_bytes);
  bool direct = cfg_.direct;
  fd_.reset(open_hidden(cfg_.folder, &direct));
  if (fd_.get() < 0)
    throw std::runtime_error(
        fmt::format("frozen_tier.path: cannot create the activation spill's file in its folder {}: {} "
                    "(expected a writable "
                    "folder on a local disk)",
                    cfg_.folder, std::strerror(errno)));
  direct_ = direct;
  if (::fallocate(fd_.get(), 0, 0, off_t(file_bytes_)) != 0) {
    if (errno == ENOSPC) throw refuse(free_bytes);
    if (::ftruncate(fd_.get(), off_t(file_bytes_)) != 0)  // no fallocate here: a sparse file
      throw std::runtime_error(fmt::format("frozen_tier.spill_layers: cannot size the spill file in {}: {}",
                                           cfg_.folder, std::strerror(errno)));
  }
}

uint64_t ActivationSpill::unallocated_bytes() const {
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) return file_bytes_;
  const uint64_t allocated = uint64_t(st.st_blocks) * 512;
  return allocated >= file_bytes_ ? 0 : file_bytes_ - allocated;
}

size_t ActivationSpill::staging_buffers() const {
  size_t n = 0;
  for (const Pool& p : pools_) n += p.reads->count() + p.writes->count();
  return n;
}

size_t ActivationSpill::record_index(const SpillRecord& r) const {
  if (!spilled(r.layer) || r.set < 0 || r.set >= cfg_.sets || r.micro_batch < 0 ||
      r.micro_batch >= cfg_.micro_batches)
    throw std::logic_error(fmt::format("activation spill: no record for layer {} micro-batch {} set {}",
                                       r.layer, r.micro_batch, r.set));
  return (size_t(r.set) * cfg_.layers.size() + size_t(index_[size_t(r.layer)])) * size_t(cfg_.micro_batches) +
         size_t(r.micro_batch);
}

std::string ActivationSpill::where(const SpillRecord& r) const {
  return fmt::format("layer {} micro-batch {} (offset {}) of the spill file in {}", r.layer, r.micro_batch,
                     uint64_t(record_index(r)) * record_bytes_, cfg_.folder);
}

std::optional<uint64_t> ActivationSpill::stage_write(int worker) {
  std::optional<tier::BufferRing::Lease> l = pools_.at(size_t(worker)).writes->try_acquire();
  if (!l) return std::nullopt;
  std::lock_guard lk(m_);
  const uint64_t t = next_ticket_++;
  held_.emplace(t, std::move(*l));
  return t;
}

std::byte* ActivationSpill::buffer(uint64_t ticket) const {
  std::lock_guard lk(m_);
  auto it = held_.find(ticket);
  return it == held_.end() ? nullptr : it->second.data();
}

void ActivationSpill::write(uint64_t ticket, const SpillRecord& r, Done done) {
  record_index(r);  // checks it
  std::lock_guard lk(m_);
  if (stopped_) return;
  queue_.push_back(Request{ticket, true, 0, r, std::move(done)});
  cv_.notify_all();
}

uint64_t ActivationSpill::read(int worker, const SpillRecord& r, Done done) {
  record_index(r);
  if (worker < 0 || size_t(worker) >= pools_.size())
    throw std::logic_error(fmt::format("activation spill: no worker {}", worker));
  std::lock_guard lk(m_);
  const uint64_t t = next_ticket_++;
  if (stopped_) return t;
  queue_.push_back(Request{t, false, worker, r, std::move(done)});
  cv_.notify_all();
  return t;
}

void ActivationSpill::release(uint64_t ticket) {
  tier::BufferRing::Lease gone;
  Done dropped;
  {
    std::lock_guard lk(m_);
    if (auto it = held_.find(ticket); it != held_.end()) {
      gone = std::move(it->second);
      held_.erase(it);
    } else if (ticket == serving_) {
      serving_dropped_ = true;  // the thread gives its buffer back when the read is done
    } else {
      auto q =
          std::find_if(queue_.begin(), queue_.end(), [&](const Request& r) { return r.ticket == ticket; });
      if (q != queue_.end()) {
        dropped = std::move(q->done);
        queue_.erase(q);
      }
    }
  }
  gone.release();
  { std::lock_guard lk(m_); }  // the thread, deciding under m_, sees the buffer free or is woken
  cv_.notify_all();
}

void ActivationSpill::stop() {
  std::deque<Request> dropped;
  {
    std::lock_guard lk(m_);
    if (stopped_ && !thread_.joinable()) return;
    stopped_ = true;
    dropped.swap(queue_);
  }
  thread_.request_stop();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  dropped.clear();  // the callbacks (and the actor handles they hold) go here
}

// The oldest request that can be served now: a write, or a read whose record holds its pass (or
// a later one: it fails) with a free buffer of its worker and no older read of that worker queued.
std::optional<size_t> ActivationSpill::next_servable() const {
  std::vector<char> blocked(pools_.size(), 0);
  for (size_t i = 0; i < queue_.size(); ++i) {
    const Request& r = queue_[i];
    if (r.write) return i;
    if (blocked[size_t(r.worker)]) continue;
    blocked[size_t(r.worker)] = 1;
    const int64_t holds = written_[record_index(r.rec)];
    if (holds >= r.rec.pass && pools_[size_t(r.worker)].reads->available() > 0) return i;
  }
  return std::nullopt;
}

void ActivationSpill::serve(std::stop_token st) {
  while (!st.stop_requested()) {
    Request r;
    tier::BufferRing::Lease lease;
    std::byte* buf = nullptr;
    {
      std::unique_lock lk(m_);
      std::optional<size_t> i;
      if (!cv_.wait(lk, st, [&] { return (i = next_servable()).has_value(); })) return;
      r = std::move(queue_[*i]);
      queue_.erase(queue_.begin() + std::ptrdiff_t(*i));
      if (r.write) {
        auto it = held_.find(r.ticket);
        if (it == held_.end()) continue;  // released before it was queued: nothing to write
        lease = std::move(it->second);
        held_.erase(it);
      } else {
        // only this thread takes read buffers, and next_servable saw one free
        std::optional<tier::BufferRing::Lease> l = pools_[size_t(r.worker)].reads->try_acquire();
        if (!l) throw std::logic_error("activation spill: a read buffer counted free was not");
        lease = std::move(*l);
        serving_ = r.ticket;
        serving_dropped_ = false;
      }
      buf = lease.data();
    }
    std::string error = run(r, buf);
    bool dropped = false;  // the reader gave the read up while it was served
    {
      std::lock_guard lk(m_);
      serving_ = 0;
      dropped = !r.write && serving_dropped_;
      if (r.write && error.empty()) written_[record_index(r.rec)] = r.rec.pass;
      if (!r.write && error.empty() && !dropped) held_.emplace(r.ticket, std::move(lease));
    }
    lease.release();  // a write's buffer, a failed or dropped read's
    if (dropped) continue;
    r.done(r.ticket, error);
  }
}

// One read or write of a whole record: "" or the one-line error.
std::string ActivationSpill::run(Request& r, std::byte* buf) {
  const uint64_t offset = uint64_t(record_index(r.rec)) * record_bytes_;
  const char* verb = r.write ? "writing" : "reading";
  if (!r.write) {
    std::lock_guard lk(m_);
    if (written_[record_index(r.rec)] > r.rec.pass)
      return fmt::format(
          "activation spill: reading {}: it holds pass {}, not pass {} (overwritten before read)",
          where(r.rec), written_[record_index(r.rec)], r.rec.pass);
  }
  const uint64_t index = r.write ? writes_++ : reads_++;
  int err = cfg_.fault ? cfg_.fault(r.write, index, offset) : 0;
  std::string why;  // the engine itself failed (io_uring_wait_cqe)
  try {
    if (err == 0)
      err = r.write ? tier::pwrite_full(fd_.get(), buf, record_bytes_, offset) : read_record(buf, offset);
  } catch (const std::exception& x) {
    why = x.what();
  }
  if (err == 0 && why.empty()) return "";
  return fmt::format("activation spill: {} {}: {}", verb, where(r.rec),
                     why.empty() ? std::strerror(err) : why);
}

// The whole record in pieces through the engine: 0 or the first errno (ENODATA for a short read).
// Returns only once no piece is in flight (none may land in the buffer later).
int ActivationSpill::read_record(std::byte* buf, uint64_t offset) {
  size_t next = 0;
  int err = 0;
  for (;;) {
    while (err == 0 && next < record_bytes_ && engine_->in_flight() < engine_->depth()) {
      const size_t n = std::min(kReadPiece, record_bytes_ - next);
      engine_->submit(tier::IoRead{next, fd_.get(), buf + next, n, offset + next});
      next += n;
    }
    if (engine_->in_flight() == 0) return err;
    const tier::IoCompletion c = engine_->wait();
    const size_t want = std::min(kReadPiece, record_bytes_ - size_t(c.id));
    if (err == 0 && c.result < 0) err = int(-c.result);
    if (err == 0 && size_t(c.result) < want) err = ENODATA;
  }
}

void SpillReads::start(ActivationSpill* spill, int64_t micro_batches) {
  reset();
  spill_ = spill;
  per_mb_.assign(size_t(micro_batches), {});
}

void SpillReads::add(int64_t m, int layer, uint64_t ticket) {
  per_mb_.at(size_t(m)).push_back({layer, ticket});
}

bool SpillReads::landed(int64_t m, uint64_t ticket) {
  if (m < 0 || size_t(m) >= per_mb_.size()) return false;
  for (Entry& e : per_mb_[size_t(m)])
    if (e.ticket == ticket && !e.landed) return e.landed = true;
  return false;
}

bool SpillReads::ready(int64_t m) const {
  if (m < 0 || size_t(m) >= per_mb_.size()) return true;
  return std::all_of(per_mb_[size_t(m)].begin(), per_mb_[size_t(m)].end(),
                     [](const Entry& e) { return e.landed; });
}

const std::byte* SpillReads::source(int64_t m, int layer) const {
  if (m < 0 || size_t(m) >= per_mb_.size()) return nullptr;
  for (const Entry& e : per_mb_[size_t(m)])
    if (e.layer == layer) return spill_->buffer(e.ticket);
  return nullptr;
}

void SpillReads::release(int64_t m) {
  if (m < 0 || size_t(m) >= per_mb_.size()) return;
  for (const Entry& e : per_mb_[size_t(m)]) spill_->release(e.ticket);
  per_mb_[size_t(m)].clear();
}

void SpillReads::reset() {
  if (spill_)
    for (size_t m = 0; m < per_mb_.size(); ++m) release(int64_t(m));
  per_mb_.clear();
}

}  // namespace rp
