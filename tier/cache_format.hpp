// The cache file's header as bytes (layout in tier/cache_file.hpp): what the builder writes
// and the opener parses. Internal to tier/.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/checksum.hpp"
#include "tier/cache_file.hpp"

namespace rp::tier::format {

inline constexpr char kMagic[8] = {'R', 'P', 'T', 'I', 'E', 'R', 'C', '\n'};
/// magic, version, entry count, header bytes, file bytes, header used, checksum block bytes,
/// key length
inline constexpr size_t kPreambleBytes = 52;
inline constexpr size_t kMaxNameBytes = 4096;
inline constexpr size_t kMaxKeyBytes = size_t(1) << 20;
/// A header larger than this is damaged, whatever it says (open reads the header into memory;
/// 256 MiB holds over 60,000 entries of the longest names).
inline constexpr uint64_t kMaxHeaderBytes = uint64_t(256) << 20;
/// The largest file the format describes (offsets stay far from overflowing).
inline constexpr uint64_t kMaxFileBytes = uint64_t(1) << 56;

/// Where everything goes: the entries with their offsets (checksums 0, block checksums
/// sized), the header's size (used and padded) and the file's. Throws std::invalid_argument
/// for bad specs or a block size that is not a multiple of 4096 up to 1 GiB.
struct Layout {
  std::vector<CacheEntry> entries;
  uint64_t header_used = 0, header_bytes = 0, file_bytes = 0, block_bytes = 0;
};
Layout plan_layout(const std::string& key, const std::vector<CacheEntrySpec>& specs, uint64_t block_bytes);

/// The checksum blocks of an entry of `bytes` bytes.
inline uint64_t block_count(uint64_t bytes, uint64_t block_bytes) {
  return (bytes + block_bytes - 1) / block_bytes;
}

/// The header (header_bytes long, zero-padded) for `layout` with the entries' checksums.
std::vector<std::byte> encode_header(const std::string& key, const Layout& layout);

/// What a valid header holds.
struct Parsed {
  std::string key;
  std::vector<CacheEntry> entries;
  uint64_t file_bytes = 0, header_bytes = 0, block_bytes = 0;
};

/// An entry's checksum and block checksums, fed its bytes in order in pieces of any size.
class EntryChecksums {
 public:
  explicit EntryChecksums(uint64_t block_bytes) : block_bytes_(block_bytes) {}
  void update(const std::byte* p, size_t n);
  /// The whole checksum; the block checksums into `blocks`.
  uint64_t finish(std::vector<uint64_t>& blocks);

 private:
  uint64_t block_bytes_, in_block_ = 0;
  Checksum whole_, block_;
  std::vector<uint64_t> blocks_;
};

/// The preamble's fields.
struct Preamble {
  uint32_t version = 0, entry_count = 0, key_bytes = 0;
  uint64_t header_bytes = 0, file_bytes = 0, header_used = 0, block_bytes = 0;
};
/// Reads the preamble of `p` (kPreambleBytes); false when the magic is not ours.
bool decode_preamble(const std::byte* p, Preamble& out);

/// Parses the header proper (`used` bytes, its checksum already verified) into `key` and
/// `entries`; returns "" or what is wrong ("entry 3: offset 4100 is not a multiple of 4096").
std::string decode_entries(const std::byte* p, const Preamble& pre, std::string& key,
                           std::vector<CacheEntry>& entries);

}  // namespace rp::tier::format
