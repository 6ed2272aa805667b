// TensorBoard scalar event files, written without TensorFlow or a protobuf library.
//
// An event file is a sequence of TFRecords (tensorflow/core/lib/io/record_writer.cc):
//   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data |
//   uint32 masked_crc32c(data),   masked_crc(x) = ((c >> 15) | (c << 17)) + 0xa282ead8,
//   c = CRC-32C of x (base/checksum.hpp).
// Each record's data is an Event protobuf (tensorflow/core/util/event.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// written field by field (protobuf wire format: varint keys and lengths, fixed64 doubles,
// fixed32 floats). The first event carries file_version "brain.Event:2", as TensorFlow's.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

namespace rp {

/// The TFRecord framing of `data`.
std::string tfrecord(const std::string& data);
/// An Event with one scalar summary value.
std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value);
/// The first Event of a file: wall_time and file_version "brain.Event:2".
std::string version_event(double wall_time);

/// Appends scalar events to a new event file in a log folder (what `tensorboard --logdir`
/// reads). Not thread-safe.
class TensorBoardWriter {
 public:
  /// Creates folder `dir` and the file "events.out.tfevents.<unix seconds>.<host>.<pid>"
  /// with its version event. Throws std::runtime_error("<path>: ...") when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  /// One scalar at `step`, wall time now. Written through at once (flushed).
  void scalar(const std::string& tag, double value, int64_t step);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace rp
