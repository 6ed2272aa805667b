// A check run as a user without privileges: root reads, writes and enters whatever the
// permission bits say, so a test of a "Permission denied" path runs its check, as root, in a
// child process that drops to nobody (uid and gid 65534); as any other user, here.
#pragma once
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <string>

namespace rp::testing {

/// What `check` returns (or "threw: <what>"), run unprivileged; kNoDrop when root could not
/// become nobody (the caller skips, saying so).
inline constexpr const char* kNoDrop = "(cannot drop to an unprivileged user)";
inline std::string as_unprivileged(const std::function<std::string()>& check) {
  const auto guarded = [&]() -> std::string {
    try {
      return check();
    } catch (const std::exception& e) {
      return std::string("threw: ") + e.what();
    }
  };
  if (::geteuid() != 0) return guarded();
  int fds[2];
  if (::pipe(fds) != 0) return kNoDrop;
  const pid_t child = ::fork();
  if (child < 0) return kNoDrop;
  if (child == 0) {
    ::close(fds[0]);
    const bool dropped = ::setgroups(0, nullptr) == 0 && ::setgid(65534) == 0 && ::setuid(65534) == 0;
    const std::string out = dropped ? guarded() : kNoDrop;
    for (size_t at = 0; at < out.size();) {
      const ssize_t n = ::write(fds[1], out.data() + at, out.size() - at);
      if (n <= 0) break;
      at += size_t(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return out;
}

}  // namespace rp::testing
