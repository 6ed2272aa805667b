// 64-bit checksums of binary state files: XXH3-64 (xxHash 0.8, XXH3_64bits, seed 0;
// https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md). Detects corruption, not
// tampering.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace rp {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor ~0; RFC 3720
/// B.4) of `bytes` bytes at `data`, continuing from `crc` (the result of the bytes before;
/// 0 to start). crc32c("123456789") = 0xE3069283. TFRecord framing (TensorBoard) uses it.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

/// XXH3_64bits of `bytes` bytes at `data`.
uint64_t checksum64(const void* data, size_t bytes);

/// A checksum fed in pieces: digest() equals checksum64 of everything update() was given
/// since construction or the last reset().
class Checksum {
 public:
  Checksum();
  ~Checksum();
  Checksum(Checksum&&) noexcept;
  Checksum& operator=(Checksum&&) noexcept;
  Checksum(const Checksum&) = delete;
  Checksum& operator=(const Checksum&) = delete;

  void update(const void* data, size_t bytes);
  uint64_t digest() const;
  void reset();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace rp
