#include "cli/signal_exit.hpp"

#include <semaphore.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "base/atomic_file.hpp"

namespace rp {
namespace {

/// The exit is under way (a handler set it); lock-free.
std::atomic<bool> g_exiting{false};
/// Posted by a handler (sem_post is async-signal-safe) to wake the ExitThread.
sem_t g_exit_wake;
/// The ExitThread's thread, while one is alive.
std::thread g_exit_thread;
/// What the handler's remove_unfinished_temporaries removed.
std::atomic<size_t> g_removed_by_handler{0};
/// Called by the exit thread with the count of what was removed, before it exits; null: none.
std::atomic<void (*)(size_t removed)> g_report{nullptr};
/// replacements_done() when the ExitOnStopSignals began.
std::atomic<uint64_t> g_replacements_before{0};

void on_stop_signal(int) { exit_from_handler(nullptr, 0); }

/// The one line of a one-shot writer ended by a stop signal: what became of its output.
void report_one_shot(size_t removed) {
  const char* what = removed > 0 ? "the unfinished output was removed, nothing else changed"
                     : replacements_done() > g_replacements_before.load()
                         ? "the output had already been written in full and is kept"
                         : "nothing had been written, nothing changed";
  fmt::print(stderr, "{}roundpipe: interrupted: {}\n", ::isatty(2) == 1 ? "\n" : "", what);
  std::fflush(stderr);
}

}  // namespace

ExitThread::ExitThread() {
  ::sem_init(&g_exit_wake, 0, 0);
  g_exit_thread = std::thread([] {
    while (::sem_wait(&g_exit_wake) != 0) {}
    if (!g_exiting.load()) return;  // the command ended without a stop signal's exit
    size_t removed = g_removed_by_handler.load() + remove_unfinished_folders();
    // now also the folders recorded for what just went (a save's state/), empty by now
    removed += remove_unfinished_temporaries();
    if (auto report = g_report.load()) report(removed);
    std::_Exit(130);
  });
}

ExitThread::~ExitThread() {
  if (g_exiting.load())
    for (;;) ::pause();  // the exit thread ends the process
  ::sem_post(&g_exit_wake);
  g_exit_thread.join();
  ::sem_destroy(&g_exit_wake);
}

void exit_from_handler(const char* line, size_t n) noexcept {
  const int saved_errno = errno;
  if (g_exiting.exchange(true)) std::_Exit(130);  // the exit thread is slow: now
  if (line != nullptr && ::write(2, line, n) < 0) {
    // nothing to do: stderr is gone
  }
  g_removed_by_handler.store(remove_unfinished_temporaries());  // a half-written file of ours goes with us
  ::sem_post(&g_exit_wake);  // and the exit thread removes our half-written folders
  errno = saved_errno;
}

ExitOnStopSignals::ExitOnStopSignals()
    : handlers_((g_replacements_before.store(replacements_done()), g_report.store(report_one_shot),
                 std::array<int, 3>{SIGINT, SIGTERM, SIGHUP}),
                on_stop_signal) {}

ExitOnStopSignals::~ExitOnStopSignals() = default;

}  // namespace rp
