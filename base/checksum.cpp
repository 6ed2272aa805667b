#include "base/checksum.hpp"

#include <array>
#include <new>

#include <xxhash.h>

namespace rp {

uint64_t checksum64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i) crc = table[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

struct Checksum::State {
  XXH3_state_t* st = XXH3_createState();
  State() {
    if (!st) throw std::bad_alloc();
    XXH3_64bits_reset(st);
  }
  ~State() { XXH3_freeState(st); }
};

Checksum::Checksum() : s_(std::make_unique<State>()) {}
Checksum::~Checksum() = default;
Checksum::Checksum(Checksum&&) noexcept = default;
Checksum& Checksum::operator=(Checksum&&) noexcept = default;

void Checksum::update(const void* data, size_t bytes) {
  if (bytes) XXH3_64bits_update(s_->st, data, bytes);
}
uint64_t Checksum::digest() const { return XXH3_64bits_digest(s_->st); }
void Checksum::reset() { XXH3_64bits_reset(s_->st); }

}  // namespace rp
