// Test support: run a piece of a test under a watchdog, so a run that hangs aborts the test
// program with a message naming it instead of hanging CI.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace rp::test {

/// Runs `fn` (one whole session) under a watchdog: a run must finish or fail, and one still
/// going after `limit` hangs; the program then aborts naming `what`. The limit is a bound for
/// a hang, not a timing assertion: these runs take well under a second.
template <class F>
auto bounded(const std::string& what, F&& fn, std::chrono::seconds limit = std::chrono::seconds(60)) {
  struct Watchdog {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::thread th;
    Watchdog(const std::string& what, std::chrono::seconds limit) {
      th = std::thread([this, what, limit] {
        std::unique_lock lk(mu);
        if (!cv.wait_for(lk, limit, [this] { return done; })) {
          std::fprintf(stderr, "%s: neither finished nor failed within %lld s: the run hangs\n", what.c_str(),
                       static_cast<long long>(limit.count()));
          std::abort();
        }
      });
    }
    ~Watchdog() {
      {
        std::lock_guard lk(mu);
        done = true;
      }
      cv.notify_all();
      th.join();
    }
  } dog(what, limit);
  return fn();
}

}  // namespace rp::test
