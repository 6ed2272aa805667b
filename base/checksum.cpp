#include "base/checksum.hpp"

#include <new>

#include <xxhash.h>

namespace rp {

uint64_t checksum64(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

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
