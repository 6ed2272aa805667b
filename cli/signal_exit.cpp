#include "cli/signal_exit.hpp"

#include <semaphore.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include "base/atomic_file.hpp"

namespace rp {
namespace {

/// The exit is under way (a handler set it); lock-free.
std::atomic<bool> g_exiting{false};
/// Posted by a handler (sem_post is async-signal-safe) to wake the ExitThread.
sem_t g_exit_wake;
/// The ExitThread's thread, while one is alive.
std::thread g_exit_thread;

void on_stop_signal(int) {
  static const char line[] =
      "\nroundpipe: interrupted: the unfinished output was removed, nothing else changed\n";
  const bool tty = ::isatty(2) == 1;  // async-signal-safe
  exit_from_handler(line + (tty ? 0 : 1), sizeof line - (tty ? 1 : 2));
}

}  // namespace

ExitThread::ExitThread() {
  ::sem_init(&g_exit_wake, 0, 0);
  g_exit_thread = std::thread([] {
    while (::sem_wait(&g_exit_wake) != 0) {}
    if (!g_exiting.load()) return;  // the command ended without a stop signal's exit
    remove_unfinished_folders();
    remove_unfinished_temporaries();  // now also the folders recorded for what just went (a save's state/)
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
  [[maybe_unused]] auto r = ::write(2, line, n);
  remove_unfinished_temporaries();  // a half-written file of ours goes with us
  ::sem_post(&g_exit_wake);         // and the exit thread removes our half-written folders
  errno = saved_errno;
}

ExitOnStopSignals::ExitOnStopSignals() : handlers_({SIGINT, SIGTERM, SIGHUP}, on_stop_signal) {}

}  // namespace rp
