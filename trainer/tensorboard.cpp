#include "trainer/tensorboard.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>

#include "base/checksum.hpp"

namespace rp {
namespace {

uint32_t masked_crc(const std::string& s) {
  const uint32_t c = crc32c(s.data(), s.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

template <class T>
void put_le(std::string& out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(char((uint64_t(v) >> (8 * i)) & 0xFF));
}
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_double(std::string& out, int field, double v) {  // wire type 1: fixed64
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_varint(out, uint64_t(field) << 3 | 1);
  put_le(out, bits);
}
void put_bytes(std::string& out, int field, const std::string& v) {  // wire type 2: length-delimited
  put_varint(out, uint64_t(field) << 3 | 2);
  put_varint(out, v.size());
  out += v;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string tfrecord(const std::string& data) {
  std::string len;
  put_le(len, uint64_t(data.size()));
  std::string out = len;
  put_le(out, masked_crc(len));
  out += data;
  put_le(out, masked_crc(data));
  return out;
}

std::string scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  put_varint(v, uint64_t(2) << 3 | 5);  // simple_value: fixed32
  put_le(v, bits);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e;
  put_double(e, 1, wall_time);
  put_varint(e, uint64_t(2) << 3 | 0);  // step: varint
  put_varint(e, uint64_t(step));
  put_bytes(e, 5, summary);
  return e;
}

std::string version_event(double wall_time) {
  std::string e;
  put_double(e, 1, wall_time);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error(fmt::format("{}: cannot create the TensorBoard folder ({})", dir, ec.message()));
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double t = now_s();
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir, int64_t(t), host, ::getpid());
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw std::runtime_error(path_ + ": cannot write");
  out_ << tfrecord(version_event(t));
  out_.flush();
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  out_ << tfrecord(scalar_event(now_s(), step, tag, float(value)));
  out_.flush();
  if (!out_) throw std::runtime_error(path_ + ": write failed (disk full?)");
}

}  // namespace rp
