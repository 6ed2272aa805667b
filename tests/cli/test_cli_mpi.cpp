// `mpirun -np N roundpipe train SPEC.json`: data-parallel replicas over MPI on loopback, CPU
// backend. N replicas give the single process's losses and weights for the same global batch
// (to float rounding: the gradient is summed per replica, then over replicas in rank order);
// a replica that is killed or hangs ends the job with one clear error in bounded time.
// Skipped, with the reason, when mpirun is missing or this build has no MPI.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "formats/safetensors.hpp"
#include "roundpipe/replicas.hpp"
#include "tests/cli/cli_util.hpp"

namespace {

using namespace rp::clitest;
using Clock = std::chrono::steady_clock;

const char* kData =
    "{\"text\": \"In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep.\"}\n"
    "{\"prompt\": \"Say hi\", \"completion\": \" hi there\"}\n"
    "{\"text\": \"And God said, Let there be light: and there was light. And God saw the light, that it was "
    "good: and God divided the light from the darkness.\"}\n"
    "{\"prompt\": \"Count\", \"completion\": \" one two three four five six seven\"}\n";

/// Why MPI tests cannot run here ("" when they can).
std::string mpi_missing() {
  if (!rp::mpi_available()) return "this build has no MPI (install libopenmpi-dev and configure again)";
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) return "mpirun not found (install openmpi-bin)";
  return "";
}

/// `mpirun -np n` (root, oversubscribed 2-core CI machines, loopback TCP only) and its options.
std::string mpirun_options(int n) {
  return "mpirun -np " + std::to_string(n) +
         " --oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo "
         "--mca oob_tcp_if_include lo ";
}
/// mpirun_options(n) around roundpipe.
std::string mpirun(int n) { return mpirun_options(n) + std::string(RP_BUILD_DIR) + "/roundpipe "; }

CliRun run_cmd(const std::string& cmd, const fs::path& dir) {
  const std::string full =
      cmd + " > " + (dir / "out.txt").string() + " 2> " + (dir / "err.txt").string() + " < /dev/null";
  const int rc = std::system(full.c_str());
  return {WEXITSTATUS(rc), slurp(dir / "out.txt"), slurp(dir / "err.txt")};
}

/// Six passes of two sequences per step (a multiple of 1, 2 and 3 replicas), clipping on
/// (the global norm must agree), staleness-1 async, one virtual GPU per replica. `extra` adds keys
/// or replaces these (a spec file may not give a key twice).
std::string spec_json(const fs::path& d, int steps, const std::string& extra = "",
                      const std::string& model = "tiny") {
  return nlohmann::json::parse(
             "{\"model\": \"" + (d / model).string() + "\", \"data\": \"" + (d / "data.jsonl").string() +
             "\", \"seq_len\": 16, \"sequences_per_step\": 12, \"micro_batches\": 2, \"accumulation\": 6, "
             "\"steps\": " +
             std::to_string(steps) +
             ", \"backend\": \"cpu\", \"workers\": 1, \"save_dtype\": \"f32\", \"tensorboard\": false, "
             "\"seed\": "
             "5, "
             "\"optimizer\": {\"lr\": 0.02, \"max_grad_norm\": 0.5, \"weight_decay\": 0.1}" +
             extra + "}")
      .dump();
}

/// metrics.csv: column `col` (1 loss, 2 target tokens, 6 grad norm) per step.
std::vector<double> column(const fs::path& csv, int col) {
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);
  std::vector<double> out;
  while (std::getline(f, line)) {
    size_t a = 0;
    for (int i = 0; i < col; ++i) a = line.find(',', a) + 1;
    out.push_back(std::stod(line.substr(a, line.find(',', a) - a)));
  }
  return out;
}
std::vector<double> losses(const fs::path& csv) { return column(csv, 1); }
std::string header(const fs::path& csv) {
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);
  return line;
}

void expect_close_weights(const fs::path& a, const fs::path& b) {
  const auto ta = rp::load_safetensors((a / "model.safetensors").string());
  const auto tb = rp::load_safetensors((b / "model.safetensors").string());
  ASSERT_EQ(ta.size(), tb.size());
  double max_diff = 0, max_moved = 0;
  for (const auto& [name, x] : ta) {
    const auto& y = tb.at(name);
    ASSERT_EQ(x.data.size(), y.data.size()) << name;
    for (size_t i = 0; i < x.data.size(); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(x.data[i] - y.data[i])));
      max_moved = std::max(max_moved, double(std::fabs(x.data[i] - 0.02f)));  // tiny_model starts at 0.02
    }
  }
  EXPECT_GT(max_moved, 1e-3) << "the run must train";
  EXPECT_LT(max_diff, 2e-5) << a << " vs " << b;
}

TEST(CliMpi, TwoAndThreeReplicasEqualOneProcess) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_json(d, 3));
  CliRun one = roundpipe("train " + (d / "spec.json").string() + " --output-dir " + (d / "one").string(), d);
  ASSERT_EQ(one.code, 0) << one.err << one.out;
  const std::vector<double> l1 = losses(d / "one/metrics.csv");
  ASSERT_EQ(l1.size(), 3u);
  EXPECT_NE(l1[0], l1[2]);
  for (int n : {2, 3}) {
    const fs::path out = d / ("np" + std::to_string(n));
    CliRun r =
        run_cmd(mpirun(n) + "train " + (d / "spec.json").string() + " --output-dir " + out.string(), d);
    ASSERT_EQ(r.code, 0) << r.err << r.out;
    EXPECT_NE(r.out.find("on " + std::to_string(n) + " replicas"), std::string::npos) << r.out;
    const std::vector<double> ln = losses(out / "metrics.csv");  // written once, by replica 0
    ASSERT_EQ(ln.size(), l1.size()) << n;
    // replicas add the seconds each step waited for its gradient sums as a last column
    EXPECT_EQ(header(out / "metrics.csv"), header(d / "one/metrics.csv") + ",reduce_wait_s") << n;
    for (double w : column(out / "metrics.csv", 15)) {  // after epoch (14)
      EXPECT_GE(w, 0.0) << n;
      EXPECT_LT(w, 30.0) << n;
    }
    for (size_t t = 0; t < l1.size(); ++t)
      EXPECT_NEAR(ln[t], l1[t], 2e-5 * std::fabs(l1[t]) + 1e-6) << n << " step " << t;
    // the global batch's target tokens and gradient norm (before clipping): the gradient is the
    // sum over every replica's passes divided by the global token count
    EXPECT_EQ(column(out / "metrics.csv", 2), column(d / "one/metrics.csv", 2)) << n;
    const std::vector<double> g1 = column(d / "one/metrics.csv", 6), gn = column(out / "metrics.csv", 6);
    ASSERT_EQ(gn.size(), g1.size());
    for (size_t t = 0; t < g1.size(); ++t) {
      EXPECT_GT(g1[t], 0) << t;
      EXPECT_NEAR(gn[t], g1[t], 1e-4 * g1[t]) << n << " step " << t;
    }
    expect_close_weights(d / "one/final", out / "final");
  }
  // the 2-replica checkpoint resumes on 3 replicas and on one process alike
  write(d / "spec5.json", spec_json(d, 5, ", \"save_every\": 3"));
  CliRun a =
      run_cmd(mpirun(2) + "train " + (d / "spec5.json").string() + " --output-dir " + (d / "a").string(), d);
  ASSERT_EQ(a.code, 0) << a.err << a.out;
  CliRun b = run_cmd(mpirun(3) + "train " + (d / "spec5.json").string() + " --output-dir " +
                         (d / "b").string() + " --resume " + (d / "a/checkpoint-3").string(),
                     d);
  ASSERT_EQ(b.code, 0) << b.err << b.out;
  expect_close_weights(d / "a/final", d / "b/final");
  fs::remove_all(d);
}

// Early stopping and save_total_limit on replicas: they decide with replica 0's evaluation, so
// two replicas stop after the same step as one process (a threshold no evaluation can beat ends
// the run at the third evaluation, patience 2), replica 0 alone rotates (checkpoint-1 goes unless
// it is the best), and the folders left are the same.
TEST(CliMpi, TwoReplicasStopEarlyAndRotateAsOneProcess) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json",
        spec_json(d, 6,
                  ", \"eval_fraction\": 0.25, \"eval_every\": 1, \"save_every\": 1, "
                  "\"save_total_limit\": 1, \"early_stopping\": {\"patience\": 2, \"threshold\": 10}"));
  const CliRun one =
      roundpipe("train " + (d / "spec.json").string() + " --output-dir " + (d / "one").string(), d);
  ASSERT_EQ(one.code, 0) << one.err << one.out;
  const CliRun two =
      run_cmd(mpirun(2) + "train " + (d / "spec.json").string() + " --output-dir " + (d / "two").string(), d);
  ASSERT_EQ(two.code, 0) << two.err << two.out;
  for (const CliRun* r : {&one, &two}) {
    EXPECT_NE(r->out.find("early stopping at step 3:"), std::string::npos) << r->out << r->err;
    EXPECT_NE(r->out.find("done: 3 steps"), std::string::npos) << r->out;
  }
  auto folders = [](const fs::path& out) {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(out))
      if (e.path().filename().string().rfind("checkpoint-", 0) == 0 || e.path().filename() == "final")
        v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(folders(d / "one"), folders(d / "two"));
  const auto left = folders(d / "one");
  EXPECT_TRUE(std::count(left.begin(), left.end(), "checkpoint-2") == 1 && left.size() <= 3) << left.size();
  expect_close_weights(d / "one/final", d / "two/final");
  fs::remove_all(d);
}

/// Occurrences of `what` in `text`.
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// A mixture-of-experts model: the step's router statistics (the load-balancing loss and the
// tokens routed to each expert) cover every replica's passes, as in one process training them
// all; the evaluation (of the whole set, on every replica) is printed and written once.
TEST(CliMpi, TwoReplicasReportTheRouterStatisticsOfOneProcess) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  tiny_model(d, /*moe=*/true);
  write(d / "data.jsonl", kData);
  write(d / "spec.json",
        spec_json(d, 3, ", \"eval_every\": 1, \"eval_data\": \"" + (d / "data.jsonl").string() + "\"",
                  "tiny-moe"));
  CliRun one = roundpipe("train " + (d / "spec.json").string() + " --output-dir " + (d / "one").string(), d);
  ASSERT_EQ(one.code, 0) << one.err << one.out;
  CliRun two =
      run_cmd(mpirun(2) + "train " + (d / "spec.json").string() + " --output-dir " + (d / "two").string(), d);
  ASSERT_EQ(two.code, 0) << two.err << two.out;
  const fs::path m1 = d / "one/metrics.csv", m2 = d / "two/metrics.csv";
  // metrics.csv columns: 1 loss (the load-balancing term included), 9 eval loss (every step),
  // 11 aux_loss, 12 expert_load_min, 13 expert_load_max (multiples of the even load, 4 decimals)
  for (int col : {1, 9, 11, 12, 13}) {
    const std::vector<double> a = column(m1, col), b = column(m2, col);
    ASSERT_EQ(a.size(), 3u) << col;
    ASSERT_EQ(b.size(), a.size()) << col;
    for (size_t t = 0; t < a.size(); ++t) {
      if (col != 12) {  // an expert may get no token
        EXPECT_GT(a[t], 0) << "column " << col << " step " << t;
      }
      EXPECT_NEAR(b[t], a[t], 2e-5 * std::fabs(a[t]) + 2e-4) << "column " << col << " step " << t;
    }
  }
  EXPECT_EQ(column(m2, 2), column(m1, 2));  // global target tokens
  // evaluation: one "eval before training" line and one eval line per evaluated step
  EXPECT_EQ(count(one.err + one.out, "eval before training"), 1u) << one.err;
  EXPECT_EQ(count(two.err + two.out, "eval before training"), 1u) << two.err;
  EXPECT_EQ(count(two.err + two.out, "| eval loss"), count(one.err + one.out, "| eval loss")) << two.out;
  EXPECT_GE(count(one.err + one.out, "| eval loss"), 1u) << one.out;
  expect_close_weights(d / "one/final", d / "two/final");
  fs::remove_all(d);
}

TEST(CliMpi, AccumulationNotAMultipleOfTheReplicasIsOneLine) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_json(d, 1));
  CliRun r =
      run_cmd(mpirun(4) + "train " + (d / "spec.json").string() + " --output-dir " + (d / "o").string(), d);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("key 'accumulation': 6 passes per step cannot be split over 4 replicas"),
            std::string::npos)
      << r.err;
  fs::remove_all(d);
}

TEST(CliMpi, OnePassPerStepOverTwoReplicasIsOneLine) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_json(d, 1, ", \"accumulation\": 1, \"sequences_per_step\": 2"));
  CliRun r =
      run_cmd(mpirun(2) + "train " + (d / "spec.json").string() + " --output-dir " + (d / "o").string(), d);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("key 'accumulation': 1 pass per step cannot be split over 2 replicas"),
            std::string::npos)
      << r.err;
  fs::remove_all(d);
}

// The README's ready-made 2-replica job starts and trains (2 steps here).
TEST(CliMpi, ExampleTwoReplicaSpecTrains) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  if (const std::string why = default_assets_missing(); !why.empty()) GTEST_SKIP() << why;
  const fs::path root = RP_SOURCE_DIR;
  auto d = tmpdir();
  CliRun r =
      run_cmd("cd " + root.string() + " && " + mpirun(2) + "train examples/specs/replicas2.json --steps 2 " +
                  "--output-dir " + (d / "o").string(),
              d);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses(d / "o/metrics.csv").size(), 2u) << r.err;
  fs::remove_all(d);
}

// A build without MPI says so in one line when replicas are asked for (here: when this build
// has MPI, "on" in a single process is a job of one replica that trains like a single process).
TEST(CliMpi, AskingForMpiWithoutItIsOneLine) {
  auto d = tmpdir();
  tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_json(d, 2));
  CliRun r =
      roundpipe("train " + (d / "spec.json").string() + " --mpi on --output-dir " + (d / "o").string(), d);
  if (rp::mpi_available()) {
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(losses(d / "o/metrics.csv").size(), 2u);
  } else {
    expect_one_line_error(r, "key 'mpi': \"on\" asks for MPI but this roundpipe was built without MPI");
  }
  fs::remove_all(d);
}

/// The pid of replica `rank` of the job writing into `out` (its environment names the rank,
/// its command line the output folder), or -1.
pid_t replica_pid(int rank, const fs::path& out) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp(e.path() / "cmdline"), env = slurp(e.path() / "environ");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    // roundpipe itself, not mpirun or a shell around it
    if (cmd.rfind(std::string(RP_BUILD_DIR) + "/roundpipe train", 0) != 0 ||
        cmd.find(out.string()) == std::string::npos)
      continue;
    if (env.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos)
      return pid_t(std::stoi(name));
  }
  return -1;
}

/// Starts a long 2-replica run in the background, waits until it trains, sends `sig` to
/// replica 1 and returns how long mpirun took to end after that (and its output in `r`).
/// `launcher_flags` go to mpirun; `victim_pid` gets replica 1's pid.
double disrupt_replica(const fs::path& d, int sig, CliRun& r, const std::string& launcher_flags = "",
                       pid_t* victim_pid = nullptr) {
  tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_json(d, 100000, ", \"replica_timeout_s\": 5"));
  const fs::path out = d / "o";
  const std::string cmd = "(" + mpirun_options(2) + launcher_flags + " " + std::string(RP_BUILD_DIR) +
                          "/roundpipe train " + (d / "spec.json").string() + " --output-dir " + out.string() +
                          " > " + (d / "out.txt").string() + " 2> " + (d / "err.txt").string() +
                          " < /dev/null; echo $? > " + (d / "rc.txt").string() + ") &";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  const auto t0 = Clock::now();
  while (losses(out / "metrics.csv").size() < 2 && Clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const pid_t victim = replica_pid(1, out);
  EXPECT_GT(victim, 0) << "replica 1 not found";
  if (victim_pid) *victim_pid = victim;
  const auto t1 = Clock::now();
  if (victim > 0) ::kill(victim, sig);
  while (!fs::exists(d / "rc.txt") && Clock::now() - t1 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rc.txt written
  const double seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  r = {std::atoi(slurp(d / "rc.txt").c_str()), slurp(d / "out.txt"), slurp(d / "err.txt")};
  if (victim > 0 && sig == SIGSTOP) ::kill(victim, SIGKILL);
  return seconds;
}

TEST(CliMpi, KilledReplicaEndsTheJobWithOneErrorInBoundedTime) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  CliRun r;
  const double s = disrupt_replica(d, SIGKILL, r);
  EXPECT_LT(s, 30) << r.err;
  EXPECT_NE(r.code, 0) << r.err;
  // mpirun reports the dead rank; a survivor that got there first names it too
  const bool named =
      r.err.find("rank 1") != std::string::npos || r.err.find("replica 1") != std::string::npos;
  EXPECT_TRUE(named) << r.err;
  // mpirun's SIGTERM to the survivor must not promise a checkpoint it cannot agree on
  EXPECT_EQ(r.err.find("then saving a checkpoint"), std::string::npos) << r.err;
  fs::remove_all(d);
}

// Killed with SIGKILL, a replica cannot say anything; mpirun then sends SIGTERM to the others.
// The survivor names it in one line (rank, host, pid), and with `mpirun -q` that line is all
// the user sees: Open MPI's own multi-line report of the dead rank is suppressed.
TEST(CliMpi, AKilledReplicaIsNamedInOneLineByTheSurvivor) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  CliRun r;
  pid_t victim = -1;
  const double s = disrupt_replica(d, SIGKILL, r, "-q", &victim);
  EXPECT_LT(s, 30) << r.err;
  EXPECT_NE(r.code, 0) << r.err;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string line =
      "roundpipe: replica 1 (" + std::string(host) + ", pid " + std::to_string(victim) +
      ") ended unexpectedly; mpirun is ending the job, so replica 0 stops without saving";
  EXPECT_NE(r.err.find(line), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("-----"), std::string::npos)
      << "Open MPI's report was not suppressed by -q: " << r.err;
  EXPECT_EQ(r.err.find("then saving a checkpoint"), std::string::npos) << r.err;
  fs::remove_all(d);
}

TEST(CliMpi, HungReplicaIsNamedAfterReplicaTimeout) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  CliRun r;
  const double s = disrupt_replica(d, SIGSTOP, r);  // alive for mpirun, silent for its peer
  EXPECT_LT(s, 30) << r.err;
  EXPECT_NE(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("roundpipe: error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("replica 1 sent nothing for"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(d / "o/metrics.csv"));
  fs::remove_all(d);
}

}  // namespace

namespace {

// ---- a graceful stop of every replica --------------------------------------------------

enum class StopBy { term_to_mpirun, usr1_to_mpirun, term_to_replica_1 };

/// What a stopped 2-replica job left: mpirun's exit status and output, each replica's own
/// exit status ("replica <r> exit <status>" lines) and the seconds from the signal to the end.
struct Stopped {
  CliRun r;
  std::string codes;
  double seconds = 0;
};

/// Starts a long 2-replica run (a checkpoint every 50 steps) with each replica inside a shell
/// that records its exit status, waits until it trained past the first checkpoint, then
/// stops it `how`. mpirun's own SIGTERM ends the job the Open MPI way: the ranks get SIGTERM
/// only after odls_base_sigkill_timeout seconds (8 here) and SIGKILL as long after.
Stopped stop_job(const fs::path& d, StopBy how) {
  tiny_model(d);
  write(d / "data.jsonl", kData);
  write(d / "spec.json", spec_json(d, 100000, ", \"replica_timeout_s\": 10, \"save_every\": 50"));
  // the trap keeps the shell alive through the signal (the process group gets it) so that it
  // records roundpipe's status
  write(d / "rank.sh",
        "trap : TERM INT USR1\n\"$@\"\nrc=$?\necho \"replica $OMPI_COMM_WORLD_RANK exit $rc\" >> "
        "\"$RP_EXIT_CODES\"\nexit $rc\n");
  const fs::path out = d / "o";
  const std::string cmd = "exec " + mpirun_options(2) +
                          "--mca odls_base_sigkill_timeout 8 -x RP_EXIT_CODES=" + (d / "codes.txt").string() +
                          " sh " + (d / "rank.sh").string() + " " + RP_BUILD_DIR + "/roundpipe train " +
                          (d / "spec.json").string() + " --output-dir " + out.string() + " > " +
                          (d / "out.txt").string() + " 2> " + (d / "err.txt").string() + " < /dev/null";
  // the test's own child: its pid is mpirun's (exec), waited for with waitpid
  const pid_t job = ::fork();
  if (job == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  Stopped s;
  EXPECT_GT(job, 0);
  if (job <= 0) return s;
  const auto t0 = Clock::now();
  while (losses(out / "metrics.csv").size() < 60 && Clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t1 = Clock::now();
  if (how == StopBy::term_to_replica_1) {
    const pid_t victim = replica_pid(1, out);
    EXPECT_GT(victim, 0) << "replica 1 not found";
    if (victim > 0) ::kill(victim, SIGTERM);
  } else {
    ::kill(job, how == StopBy::term_to_mpirun ? SIGTERM : SIGUSR1);
  }
  int status = 0;
  while (::waitpid(job, &status, WNOHANG) == 0) {
    if (Clock::now() - t1 > std::chrono::seconds(90)) {  // a hang: end it, and fail below
      ::kill(job, SIGKILL);
      ::waitpid(job, &status, 0);
      ADD_FAILURE() << "the job did not end within 90 s of the stop";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  s.seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  s.r = {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), slurp(d / "out.txt"),
         slurp(d / "err.txt")};
  s.codes = slurp(d / "codes.txt");
  return s;
}

/// Both replicas exited 130 after the same step N (the rows of metrics.csv); replica 0 kept
/// every checkpoint whole, nothing half written is left, and checkpoint-N resumes (one
/// process, two more steps).
void expect_stopped_together(const fs::path& d, const Stopped& s, bool lines) {
  EXPECT_NE(s.codes.find("replica 0 exit 130"), std::string::npos) << s.codes << s.r.err;
  EXPECT_NE(s.codes.find("replica 1 exit 130"), std::string::npos) << s.codes << s.r.err;
  const fs::path out = d / "o";
  const size_t n = losses(out / "metrics.csv").size();
  ASSERT_GE(n, 60u);
  const std::string after = "interrupted after " + std::to_string(n) + " steps (stop asked of replica";
  if (lines) {  // one closing line per replica, the same step on both
    EXPECT_NE(s.r.err.find("roundpipe: replica 0 of 2: " + after), std::string::npos) << s.r.err;
    EXPECT_NE(s.r.err.find("roundpipe: replica 1 of 2: " + after), std::string::npos) << s.r.err;
    EXPECT_EQ(count(s.r.err, "interrupted after "), 2u) << s.r.err;
  }
  EXPECT_FALSE(fs::exists(out / "final")) << "a stopped run is not final";
  const fs::path last = out / ("checkpoint-" + std::to_string(n));
  ASSERT_TRUE(fs::exists(last / "model.safetensors")) << last;
  size_t checkpoints = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string name = e.path().filename();
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "left half written: " << name;
    if (name.rfind("checkpoint-", 0) != 0) continue;
    ++checkpoints;
    EXPECT_TRUE(fs::exists(e.path() / "model.safetensors")) << name;
    EXPECT_TRUE(fs::exists(e.path() / "config.json")) << name;
  }
  EXPECT_EQ(checkpoints, n / 50 + (n % 50 != 0)) << "the periodic ones and the stop's";
  CliRun res =
      roundpipe("train " + (d / "spec.json").string() + " --mpi off --steps " + std::to_string(n + 2) +
                    " --output-dir " + (d / "resumed").string() + " --resume " + last.string(),
                d);
  ASSERT_EQ(res.code, 0) << res.err;
  EXPECT_EQ(losses(d / "resumed/metrics.csv").size(), 2u) << "steps " << n + 1 << " and " << n + 2;
  EXPECT_TRUE(fs::exists(d / "resumed/final/model.safetensors"));
}

// SIGTERM to one replica only (a scheduler or a person signalling one process): the others
// learn of it at the next step's close and all stop there.
TEST(CliMpi, SigtermToOneReplicaStopsEveryReplicaAfterTheSameStep) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  const Stopped s = stop_job(d, StopBy::term_to_replica_1);
  EXPECT_EQ(s.r.code, 130) << s.r.err;  // mpirun passes on the ranks' status
  EXPECT_LT(s.seconds, 30) << s.r.err;
  EXPECT_NE(s.r.err.find("stop asked of replica 1;"), std::string::npos) << s.r.err;
  expect_stopped_together(d, s, /*lines=*/true);
  fs::remove_all(d);
}

// SIGUSR1 to mpirun: Open MPI forwards it to every rank at once and leaves the job alone.
TEST(CliMpi, Sigusr1ToMpirunStopsEveryReplicaAfterTheSameStep) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  const Stopped s = stop_job(d, StopBy::usr1_to_mpirun);
  EXPECT_EQ(s.r.code, 130) << s.r.err;
  EXPECT_LT(s.seconds, 30) << s.r.err;
  expect_stopped_together(d, s, /*lines=*/true);
  fs::remove_all(d);
}

// SIGTERM to mpirun (Ctrl-C on it likewise): Open MPI ends the job itself, stops forwarding
// the ranks' output and exits 1 whatever they return; the ranks get SIGTERM after
// odls_base_sigkill_timeout seconds and still stop together, keep the checkpoints and exit 130.
TEST(CliMpi, SigtermToMpirunStopsEveryReplicaAfterTheSameStep) {
  if (const std::string why = mpi_missing(); !why.empty()) GTEST_SKIP() << why;
  auto d = tmpdir();
  const Stopped s = stop_job(d, StopBy::term_to_mpirun);
  EXPECT_NE(s.r.code, 0) << s.r.err;
  EXPECT_LT(s.seconds, 60) << s.r.err;
  expect_stopped_together(d, s, /*lines=*/false);
  fs::remove_all(d);
}

}  // namespace
