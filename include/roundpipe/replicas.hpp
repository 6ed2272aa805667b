// Data-parallel replicas: N processes, each a whole RoundPipe pipeline over its own devices
// with its own share of every step's passes, whose gradients are summed before each update.
//
// `Replicas` is the communication the runtime needs and nothing else; the MPI implementation
// (roundpipe/replicas.hpp's mpi_replicas(), built when CMake finds MPI) runs every MPI call on
// one dedicated thread fed by a queue, so no actor ever blocks on the network.
//
// Reduction order (deterministic, the same on every replica and in every run): a gradient of
// n floats is cut into N contiguous shards, shard r = [n*r/N, n*(r+1)/N). Rank r receives
// every rank's copy of shard r and sums them in rank order, ((g_0 + g_1) + g_2) + ... (its own
// copy in its place), then sends the sum to every rank: all ranks end with the same bits.
// MPI_Allreduce is not used: its order is unspecified.
//
// Failures: every peer is sent a heartbeat each `heartbeat_s`; a peer that is silent for
// `timeout_s` (killed, hung, its host gone) fails every reduction in flight and every later
// call with one line naming the rank ("replica 1 sent nothing for 10.0 s (...)").
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace rp {

/// Counters of the communication since start (for benchmarks and the log).
struct ReplicaStats {
  int64_t reductions = 0;    ///< gradient reductions completed
  double bytes_reduced = 0;  ///< sum of their gradients' sizes (n * 4 bytes each)
  double bytes_sent = 0;     ///< bytes this rank sent for them (2 (N-1)/N of bytes_reduced)
  double busy_s = 0;         ///< wall time with at least one reduction in flight
};

class Replicas {
 public:
  virtual ~Replicas() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Sums `n` fp32 values at `data` over the replicas in place, in the order above. Returns at
  /// once; `done("")` (or `done(error line)`) is called on the communication thread when the
  /// sum is in `data` on this rank. `key` names the buffer and must be the same on every rank
  /// for the same reduction (the runtime passes the parameter group); reductions of one key
  /// must be issued in the same order on every rank, reductions of different keys in any
  /// order. `data` must stay valid and untouched until done is called. `what` names it in
  /// errors ("group 3 of step 5").
  virtual void sum_async(int key, float* data, int64_t n, std::string what,
                         std::function<void(const std::string& error)> done) = 0;
  /// Every rank's `values`, in rank order (a small exchange for the trainer: loss sums, token
  /// counts, agreement). Blocks the calling thread (never call it from an actor); every rank
  /// must make the same sequence of calls. Throws ReplicaFailure.
  virtual std::vector<std::vector<double>> allgather(const std::vector<double>& values) = 0;
  /// This replica failed with `error`: tells every peer (their calls then fail with "replica
  /// <rank> failed: <error>") and fails this rank's own calls; waits at most a few seconds.
  virtual void abort(const std::string& error) = 0;
  virtual ReplicaStats stats() const = 0;
  /// The first failure seen ("" while healthy).
  virtual std::string failure() const = 0;
};

/// The communication of a replica failed (a peer died or hangs, or MPI reported an error).
struct ReplicaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// True when this program was built with MPI (CMake found it).
bool mpi_available();
/// True when the process was started by an MPI launcher (mpirun / mpiexec: OMPI_COMM_WORLD_SIZE,
/// PMI_SIZE or PMIX_RANK in the environment).
bool launched_by_mpi();
/// The process's MPI world (MPI is initialised on the first call, on the communication thread,
/// MPI_THREAD_FUNNELED; finalised at exit). `timeout_s`: a peer silent this long fails the
/// run; the first call's value holds. Throws std::runtime_error when built without MPI.
std::shared_ptr<Replicas> mpi_replicas(double timeout_s = 60);

/// Records the first replica failure this process saw (`line`, e.g. "replica 1 sent nothing
/// for 10.0 s ..."; cut to 1023 bytes) for replica_failure_line(); later calls are ignored.
void note_replica_failure(const std::string& line);
/// That failure as a NUL-terminated line, or nullptr while none was seen. Async-signal-safe
/// (one atomic load): the stop-signal handler of `roundpipe train` names the dead replica.
const char* replica_failure_line();
/// This process's rank from the MPI launcher's environment (OMPI_COMM_WORLD_RANK, PMI_RANK,
/// PMIX_RANK), or -1 outside a launcher; readable before MPI is initialised.
int launcher_rank();

/// Another replica the same launcher process started on this host.
struct LocalReplica {
  int rank = -1;  ///< its launcher rank
  int pid = 0;    ///< its process id
};
/// The other replicas on this host: processes with this process's parent (mpirun or its
/// per-host daemon) and a launcher rank in their environment, read from /proc (Linux). Empty
/// outside a launcher or where /proc cannot be read. Call once every replica has started (MPI
/// initialised): a replica that dies later can then be named by its pid (the stop-signal
/// handler of `roundpipe train` does, when mpirun ends the job because of it).
std::vector<LocalReplica> local_replicas();

}  // namespace rp
