#pragma once
// Ending the process on a stop signal without leaving half-written output behind, shared by the
// commands that write folders: `train` (its second stop signal) and the one-shot writers
// (`convert`, `merge`, `export-gguf`), whose first stop signal ends them.
//
// A half-written folder of replace_folder can only be removed outside a signal handler
// (remove_unfinished_folders allocates), so a handler wakes ExitThread, which removes it, then
// the folders a writer recorded for a signal (RecordedFolders, once empty), and ends the process
// with status 130.
#include <array>
#include <csignal>
#include <cstddef>

namespace rp {

/// The thread that ends the process after exit_from_handler. One may be alive at a time. While
/// one is, the thread that would end the process otherwise (returning from the command, or an
/// error the removal caused) waits for that exit instead when the exit is under way.
class ExitThread {
 public:
  ExitThread();
  ~ExitThread();
  ExitThread(const ExitThread&) = delete;
  ExitThread& operator=(const ExitThread&) = delete;
};

/// From a signal handler while an ExitThread is alive: writes `line` (`n` bytes; none when null)
/// to stderr, removes this process's unfinished temporary files (remove_unfinished_temporaries)
/// and wakes the ExitThread, which removes the unfinished folders and exits with 130. Called again while
/// that exit is under way (a slow removal, a third Ctrl-C), it exits with 130 at once.
/// Async-signal-safe.
void exit_from_handler(const char* line, size_t n) noexcept;

/// Installs `handler` for `signals` while alive, then restores the previous handlers. A SIGHUP
/// ignored when the object is made (nohup) stays ignored: the process outlives its terminal.
template <size_t N>
class SignalHandlers {
 public:
  SignalHandlers(const std::array<int, N>& signals, void (*handler)(int)) : signals_(signals) {
    for (size_t i = 0; i < N; ++i) {
      prev_[i] = std::signal(signals_[i], handler);
      if (signals_[i] == SIGHUP && prev_[i] == SIG_IGN) std::signal(SIGHUP, SIG_IGN);
    }
  }
  ~SignalHandlers() {
    for (size_t i = 0; i < N; ++i) std::signal(signals_[i], prev_[i]);
  }
  SignalHandlers(const SignalHandlers&) = delete;
  SignalHandlers& operator=(const SignalHandlers&) = delete;

 private:
  std::array<int, N> signals_;
  std::array<void (*)(int), N> prev_{};
};

/// For a command that writes its output once (`convert`, `merge`, `export-gguf`): while alive,
/// SIGINT, SIGTERM or SIGHUP ends the process with status 130, removing the unfinished
/// temporaries and folders of its replace_file / replace_folder calls (a move into place under
/// way finishes first), then one line on stderr says which happened: "roundpipe: interrupted: "
/// + "the unfinished output was removed, nothing else changed", "the output had already been
/// written in full and is kept" or "nothing had been written, nothing changed". Without it the
/// default action would leave a half-written output until the next writer into the same place
/// cleans it. One at a time.
class ExitOnStopSignals {
 public:
  ExitOnStopSignals();
  ~ExitOnStopSignals();
  ExitOnStopSignals(const ExitOnStopSignals&) = delete;
  ExitOnStopSignals& operator=(const ExitOnStopSignals&) = delete;

 private:
  ExitThread exit_;  // destroyed after the handlers are restored: no signal reaches it then
  SignalHandlers<3> handlers_;
};

}  // namespace rp
