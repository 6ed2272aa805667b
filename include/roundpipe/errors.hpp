// What RoundPipe throws. Every message is one line naming the file, key, flag or call and
// what was expected:
//   std::invalid_argument  bad input: a spec key, an option, a shape, a token id
//                          ("spec.json: key 'workers': expected an integer, got \"two\"")
//   std::runtime_error     files and data ("<file>: <what>"): missing, truncated, corrupted,
//                          another model's, I/O failures
//   std::logic_error       a call out of order (e.g. saving the optimizer state while steps
//                          are in flight)
//   the types below        failures of the runtime and the devices
#pragma once
#include <stdexcept>

namespace rp {

/// Thrown by Session::wait()/synchronize() (and so by the Trainer) when the runtime failed;
/// what() names the worker, stage, micro-batch and the failed operation.
struct RuntimeFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Thrown by the Trainer when training cannot go on: a non-finite loss or gradient norm (spec
/// "nonfinite": "stop"), too many skipped steps in a row, a loss scale at its floor, or
/// weights that turned non-finite before a checkpoint. Nothing of the failed step is saved;
/// earlier checkpoints are kept. what() names the step and what happened.
struct TrainingDiverged : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Thrown when an allocation would exceed a device's byte capacity.
struct DeviceOutOfMemory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Thrown for any failed device call (CUDA error text, call, file:line), or when the
/// requested backend has no device.
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace rp
