// Activation spill (FrozenTierOptions::spill_layers): the saved inputs x[b][m] of a few layers
// (PassActivations::x) live in one hidden file on the tier's disk instead of host memory. One
// ActivationSpill per session owns the file, small pools of host staging buffers per worker and
// one I/O thread that serves the workers' reads and writes.
//
//   forward stage computed m   stage_write(worker)      a write buffer (none free: the worker
//                                                        defers the download until one is)
//                              download into buffer(t)  then write(t, record, done)
//   I/O thread                 pwrite the record        the write buffer goes back; done(t, "")
//   worker                     SpillDone                the output counts as downloaded: only
//                                                        now ActReady goes to the next stage
//   task prepared              read(worker, record)     queued, one per spilled input and micro-batch
//   I/O thread                 a read buffer, pread     once the record holds that pass's data
//   worker                     SpillDone                micro-batch m may upload from data(t);
//                              upload landed: release(t)
//
// I/O: a record is read in pieces of at most 1 MiB, 8 in flight, through the disk tier's engine
// (tier/io_engine.hpp: io_uring, or a pool of pread threads where it cannot be set up) and written
// with one pwrite (O_DIRECT: the kernel splits it into requests in flight at once).
//
// The file: opened with O_TMPFILE in the folder (mkstemp and an immediate unlink where O_TMPFILE is
// refused), so it has no name and the kernel frees it when the process ends, however it ends. One
// record per (activation set, spilled layer, micro-batch), act_bytes rounded up to 4 KiB, at
// offset record_index x record_bytes; O_DIRECT where the file system allows it.
//
// Ordering. Requests are served in the order they came, except that a request that cannot be
// served yet does not hold up the ones behind it:
//  - a read waits until its record holds the data of its pass (the write of that pass completed):
//    a task is prepared (and asks for its reads) before the stage that writes its inputs may have
//    computed them, on another worker or, one stage ahead, on the same one. Global pass numbers
//    only grow, so a record holding a later pass's data means the data was overwritten before it
//    was read: the read fails (a broken invariant, never a silent wrong value).
//  - a read also waits for a free read buffer of its worker, and a worker's reads are served in
//    its order (they are the order its tasks upload in), so a later micro-batch never takes the
//    buffer an earlier one needs;
//  - writes never wait (their data is in their buffer already), and they use their own buffers,
//    so a forward stage's outputs never wait on buffers held by a prefetched task's reads.
// Passes sharing one set of records (one worker: PassActivations shared by the pass slots) are
// safe as their host buffers are: the worker runs every read of pass p (its uploads) before the
// stage of pass p+1 that overwrites the record computes.
//
// Failures: a failed read or write calls done with one line naming the spill file's folder, the
// layer, the micro-batch and the file offset. Thread-safety: every public call may come from any
// thread. stop() drops the queued requests (their callbacks never run) and joins the thread; call
// it once no worker can touch a buffer any more.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tier/buffer_ring.hpp"
#include "tier/file_io.hpp"
#include "tier/io_engine.hpp"

namespace rp {

/// Test hook: called before each spill read (write false) or write with its index among the
/// session's reads (or writes), 0, 1, ..., and its file offset; a non-zero return fails it with
/// that errno.
using SpillFault = std::function<int(bool write, uint64_t index, uint64_t offset)>;
/// A SpillFault that fails read `n` (0-based) with `err`.
SpillFault fail_nth_spill_read(uint64_t n, int err);

/// One record: the saved input of `layer` for `micro_batch` in activation set `set`
/// (PassActivations::spill_set), as pass `pass` wrote it.
struct SpillRecord {
  int set = 0;
  int layer = 0;
  int64_t micro_batch = 0;
  int64_t pass = 0;
};

struct SpillConfig {
  std::string folder;       ///< the spill file's folder (it must exist)
  std::vector<int> layers;  ///< the spilled layers (each 1..num_layers-1, distinct)
  int num_layers = 0;
  int sets = 1;  ///< activation sets (pass slots not sharing their activations)
  int64_t micro_batches = 1;
  size_t act_bytes = 0;  ///< one saved input
  int workers = 1;
  /// Staging buffers per worker and direction. Reads get at least layers.size() (a backward stage
  /// uploads up to that many spilled inputs per micro-batch, all held at once).
  size_t staging = 4;
  bool direct = true;  ///< O_DIRECT where the file system allows it
  SpillFault fault;
};

class ActivationSpill {
 public:
  /// Called on the I/O thread with the request's ticket and "" or the one-line error.
  using Done = std::function<void(uint64_t ticket, const std::string& error)>;

  /// Checks the folder's free space, creates the hidden file and the staging buffers (from
  /// `allocator`) and starts the thread. Throws std::invalid_argument for a bad config and
  /// std::runtime_error ("frozen_tier.spill_layers: ...") for a folder that cannot hold the file.
  ActivationSpill(SpillConfig config, tier::HostAllocator allocator);
  ~ActivationSpill();
  ActivationSpill(const ActivationSpill&) = delete;
  ActivationSpill& operator=(const ActivationSpill&) = delete;

  bool spilled(int layer) const {
    return layer >= 0 && size_t(layer) < index_.size() && index_[size_t(layer)] >= 0;
  }
  /// A free write buffer of `worker` (its ticket), or nullopt when all are in use.
  std::optional<uint64_t> stage_write(int worker);
  /// The buffer of a staged write or of a delivered read (nullptr for an unknown ticket).
  std::byte* buffer(uint64_t ticket) const;
  /// Queues the write of a staged buffer (stage_write's ticket) into record `r`; its buffer goes
  /// back when the write is done, before `done` runs.
  void write(uint64_t ticket, const SpillRecord& r, Done done);
  /// Queues a read of record `r` for `worker`; `done` runs once it is in a read buffer (held
  /// until release) or failed (nothing held). Returns the ticket.
  uint64_t read(int worker, const SpillRecord& r, Done done);
  /// Gives back a delivered read's buffer or a staged write never queued, or drops a read not
  /// served yet (its callback never runs). Unknown tickets: nothing.
  void release(uint64_t ticket);
  void stop();

  const std::string& folder() const { return cfg_.folder; }
  const std::vector<int>& layers() const { return cfg_.layers; }
  uint64_t file_bytes() const { return file_bytes_; }
  /// Bytes of the file the disk has not allocated yet (a sparse file where the file system
  /// cannot reserve it): still free on the disk, but promised to the spill.
  uint64_t unallocated_bytes() const;
  size_t record_bytes() const { return record_bytes_; }
  /// Records read back and written so far (failed ones included); any thread.
  uint64_t records_read() const { return reads_.load(); }
  uint64_t records_written() const { return writes_.load(); }
  bool direct() const { return direct_; }
  /// The reads' engine: "io_uring" or "pread pool (N threads)".
  std::string engine() const { return engine_->name(); }
  /// Staging buffers over all workers and both directions.
  size_t staging_buffers() const;

 private:
  struct Request {
    uint64_t ticket = 0;
    bool write = false;
    int worker = 0;
    SpillRecord rec;
    Done done;
  };
  struct Pool {
    std::unique_ptr<tier::BufferRing> reads, writes;
  };
  void open_file();
  size_t record_index(const SpillRecord& r) const;
  std::string where(const SpillRecord& r) const;
  std::optional<size_t> next_servable() const;  // under m_
  void serve(std::stop_token st);
  std::string run(Request& r, std::byte* buf);
  int read_record(std::byte* buf, uint64_t offset);

  SpillConfig cfg_;
  std::vector<int> index_;  ///< per layer: its place in cfg_.layers, -1 when not spilled
  size_t record_bytes_ = 0;
  uint64_t file_bytes_ = 0;
  bool direct_ = false;
  tier::Fd fd_;
  std::unique_ptr<tier::IoEngine> engine_;  ///< the reads (driven by the thread only)
  std::vector<Pool> pools_;                 ///< per worker
  mutable std::mutex m_;
  std::condition_variable_any cv_;
  std::deque<Request> queue_;
  std::map<uint64_t, tier::BufferRing::Lease> held_;  ///< staged writes and delivered reads
  std::vector<int64_t> written_;                      ///< per record: the pass it holds, -1: none
  uint64_t next_ticket_ = 1;
  std::atomic<uint64_t> reads_{0}, writes_{0};  ///< records read / written (counted by the thread)
  uint64_t serving_ = 0;                        ///< the read being served now (0: none)
  bool serving_dropped_ = false, stopped_ = false;
  std::jthread thread_;  ///< last: stopped and joined first
};

/// A stage task's reads of spilled inputs (Task::spill_reads): per micro-batch the layers and
/// tickets, and which have landed. Gives every ticket back when reset or destroyed (a task that
/// goes away). Used by its worker's thread only.
class SpillReads {
 public:
  SpillReads() = default;
  SpillReads(SpillReads&& o) noexcept : spill_(o.spill_), per_mb_(std::move(o.per_mb_)) { o.per_mb_.clear(); }
  SpillReads& operator=(SpillReads&& o) noexcept {
    if (this != &o) {
      reset();  // its own tickets go back first
      spill_ = o.spill_;
      per_mb_ = std::move(o.per_mb_);
      o.per_mb_.clear();
    }
    return *this;
  }
  SpillReads(const SpillReads&) = delete;
  SpillReads& operator=(const SpillReads&) = delete;
  ~SpillReads() { reset(); }
  void start(ActivationSpill* spill, int64_t micro_batches);
  void add(int64_t m, int layer, uint64_t ticket);
  /// Marks the read `ticket` of micro-batch m landed; false when it is not this task's.
  bool landed(int64_t m, uint64_t ticket);
  /// Every spilled input of micro-batch m is in a read buffer (true when it has none).
  bool ready(int64_t m) const;
  /// The read buffer holding layer's saved input of m (nullptr: not spilled for this task).
  const std::byte* source(int64_t m, int layer) const;
  /// m's inputs are on the device: its read buffers go back.
  void release(int64_t m);
  void reset();

 private:
  struct Entry {
    int layer = 0;
    uint64_t ticket = 0;
    bool landed = false;
  };
  ActivationSpill* spill_ = nullptr;
  std::vector<std::vector<Entry>> per_mb_;
};

}  // namespace rp
