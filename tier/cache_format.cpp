#include "tier/cache_format.hpp"

#include <bit>
#include <cstring>
#include <stdexcept>
#include <unordered_set>

#include <fmt/format.h>

#include "base/checksum.hpp"
#include "base/error_text.hpp"

namespace rp::tier::format {
namespace {

static_assert(std::endian::native == std::endian::little, "the tier cache is written little-endian");

template <class T>
void put(std::vector<std::byte>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_bytes(std::vector<std::byte>& out, const std::string& s) {
  put<uint32_t>(out, uint32_t(s.size()));
  const size_t at = out.size();
  out.resize(at + s.size());
  std::memcpy(out.data() + at, s.data(), s.size());
}

template <class T>
T get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

Layout plan_layout(const std::string& key, const std::vector<CacheEntrySpec>& specs, uint64_t block_bytes) {
  if (block_bytes < kDirectAlign || block_bytes % kDirectAlign != 0 || block_bytes > (uint64_t(1) << 30))
    throw std::invalid_argument(
        fmt::format("tier cache: checksum blocks of {} bytes, expected a multiple of {} up to 1 GiB",
                    block_bytes, kDirectAlign));
  if (key.size() > kMaxKeyBytes)
    throw std::invalid_argument(
        fmt::format("tier cache: source key of {} bytes, at most {}", key.size(), kMaxKeyBytes));
  if (specs.size() > UINT32_MAX) throw std::invalid_argument("tier cache: more than 2^32 - 1 entries");
  Layout l;
  l.block_bytes = block_bytes;
  std::unordered_set<std::string> seen;
  l.header_used = kPreambleBytes + key.size() + 8;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    if (s.name.empty() || s.name.size() > kMaxNameBytes)
      throw std::invalid_argument(fmt::format("tier cache: entry {} has a name of {} bytes, expected 1..{}",
                                              i, s.name.size(), kMaxNameBytes));
    if (!seen.insert(s.name).second)
      throw std::invalid_argument(
          fmt::format("tier cache: entry {} repeats the name '{}'", i, excerpt(s.name)));
    if (s.bytes > (uint64_t(1) << 50))
      throw std::invalid_argument(
          fmt::format("tier cache: entry '{}' of {} bytes is larger than 2^50", excerpt(s.name), s.bytes));
    l.header_used += 4 + s.name.size() + 24 + 8 * block_count(s.bytes, block_bytes);
  }
  l.header_bytes = align_up(l.header_used);
  if (l.header_bytes > kMaxHeaderBytes)
    throw std::invalid_argument(
        fmt::format("tier cache: a header of {} bytes (the names and the key), at most {}", l.header_bytes,
                    kMaxHeaderBytes));
  uint64_t at = l.header_bytes;
  for (const auto& s : specs) {
    l.entries.push_back({s.name, at, s.bytes, 0, std::vector<uint64_t>(block_count(s.bytes, block_bytes))});
    at += align_up(s.bytes);
    if (at > kMaxFileBytes)
      throw std::invalid_argument(
          fmt::format("tier cache: the entries up to '{}' need more than 2^56 bytes", excerpt(s.name)));
  }
  l.file_bytes = at;
  return l;
}

std::vector<std::byte> encode_header(const std::string& key, const Layout& l) {
  std::vector<std::byte> h;
  h.reserve(l.header_bytes);
  h.resize(sizeof(kMagic));
  std::memcpy(h.data(), kMagic, sizeof(kMagic));
  put<uint32_t>(h, kCacheFormatVersion);
  put<uint32_t>(h, uint32_t(l.entries.size()));
  put<uint64_t>(h, l.header_bytes);
  put<uint64_t>(h, l.file_bytes);
  put<uint64_t>(h, l.header_used);
  put<uint64_t>(h, l.block_bytes);
  put_bytes(h, key);
  for (const auto& e : l.entries) {
    put_bytes(h, e.name);
    put<uint64_t>(h, e.offset);
    put<uint64_t>(h, e.bytes);
    put<uint64_t>(h, e.checksum);
    for (const uint64_t b : e.block_checksums) put<uint64_t>(h, b);
  }
  put<uint64_t>(h, checksum64(h.data(), h.size()));
  if (h.size() != l.header_used)
    throw std::logic_error(
        fmt::format("tier cache: header of {} bytes, planned {}", h.size(), l.header_used));
  h.resize(l.header_bytes, std::byte{0});
  return h;
}

void EntryChecksums::update(const std::byte* p, size_t n) {
  whole_.update(p, n);
  while (n > 0) {
    const size_t take = size_t(std::min<uint64_t>(n, block_bytes_ - in_block_));
    block_.update(p, take);
    p += take, n -= take, in_block_ += take;
    if (in_block_ == block_bytes_) {
      blocks_.push_back(block_.digest());
      block_.reset();
      in_block_ = 0;
    }
  }
}

uint64_t EntryChecksums::finish(std::vector<uint64_t>& blocks) {
  if (in_block_ > 0) blocks_.push_back(block_.digest());
  blocks = std::move(blocks_);
  return whole_.digest();
}

bool decode_preamble(const std::byte* p, Preamble& out) {
  if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0) return false;
  out.version = get<uint32_t>(p + 8);
  out.entry_count = get<uint32_t>(p + 12);
  out.header_bytes = get<uint64_t>(p + 16);
  out.file_bytes = get<uint64_t>(p + 24);
  out.header_used = get<uint64_t>(p + 32);
  out.block_bytes = get<uint64_t>(p + 40);
  out.key_bytes = get<uint32_t>(p + 48);
  return true;
}

std::string decode_entries(const std::byte* p, const Preamble& pre, std::string& key,
                           std::vector<CacheEntry>& entries) {
  const uint64_t end = pre.header_used - 8;  // the checksum
  uint64_t at = kPreambleBytes;
  if (pre.key_bytes > end - at)
    return fmt::format("source key of {} bytes runs past the header", pre.key_bytes);
  key.assign(reinterpret_cast<const char*>(p + at), pre.key_bytes);
  at += pre.key_bytes;
  entries.clear();
  if (pre.block_bytes < kDirectAlign || pre.block_bytes % kDirectAlign != 0 ||
      pre.block_bytes > (uint64_t(1) << 30))
    return fmt::format("checksum blocks of {} bytes, expected a multiple of {} up to 1 GiB", pre.block_bytes,
                       kDirectAlign);
  if (pre.file_bytes % kDirectAlign != 0 || pre.file_bytes > kMaxFileBytes ||
      pre.file_bytes < pre.header_bytes)
    return fmt::format("a file size of {} bytes is not a multiple of {} from {} to 2^56", pre.file_bytes,
                       kDirectAlign, pre.header_bytes);
  uint64_t next = pre.header_bytes;  // entries follow each other, in order, padded
  for (uint32_t i = 0; i < pre.entry_count; ++i) {
    if (end - at < 4) return fmt::format("entry {} runs past the header", i);
    const uint32_t n = get<uint32_t>(p + at);
    at += 4;
    if (n == 0 || n > kMaxNameBytes || end - at < uint64_t(n) + 24)
      return fmt::format("entry {} (name of {} bytes) runs past the header", i, n);
    CacheEntry e;
    e.name.assign(reinterpret_cast<const char*>(p + at), n);
    at += n;
    e.offset = get<uint64_t>(p + at);
    e.bytes = get<uint64_t>(p + at + 8);
    e.checksum = get<uint64_t>(p + at + 16);
    at += 24;
    if (e.offset != next)
      return fmt::format("entry {} ('{}') at offset {}, expected {}", i, excerpt(e.name), e.offset, next);
    if (e.bytes > pre.file_bytes - e.offset || align_up(e.bytes) > pre.file_bytes - e.offset)
      return fmt::format("entry {} ('{}') of {} bytes at offset {} ends past the file's {} bytes", i,
                         excerpt(e.name), e.bytes, e.offset, pre.file_bytes);
    const uint64_t blocks = block_count(e.bytes, pre.block_bytes);
    if ((end - at) / 8 < blocks)
      return fmt::format("entry {} ('{}'): its {} block checksums run past the header", i, excerpt(e.name),
                         blocks);
    e.block_checksums.resize(blocks);
    for (auto& b : e.block_checksums) b = get<uint64_t>(p + at), at += 8;
    next = e.offset + align_up(e.bytes);
    entries.push_back(std::move(e));
  }
  if (at != end) return fmt::format("{} bytes after the entry table", end - at);
  if (next != pre.file_bytes)
    return fmt::format("the entries end at {}, the header says the file has {} bytes", next, pre.file_bytes);
  return "";
}

}  // namespace rp::tier::format
