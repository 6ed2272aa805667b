// The disk tier's cache file: the frozen base weights of a LoRA run, written once in their
// storage form as named entries (one per frozen matrix group) and read back per stage with
// O_DIRECT (tier/direct_reader.hpp).
//
// Layout (little-endian; every entry 4096-aligned so O_DIRECT can read it whole):
//   0   magic "RPTIERC\n" (8 bytes)
//   8   u32 format version (kCacheFormatVersion)
//   12  u32 entry count
//   16  u64 header bytes: where the first entry starts (a multiple of 4096)
//   24  u64 file bytes: the whole file's size (a multiple of 4096)
//   32  u64 header used: the bytes of the header proper, its checksum included
//   40  u64 checksum block bytes B (a multiple of 4096)
//   48  u32 source key length, then the source key (the caller's string naming the source
//       weights, their storage format and layout: a file for another key is stale; a key made
//       of fields "<what>: <part>, <part>, ..." joined by "; " has the stale reason name the
//       first field and part that differ)
//       per entry: u32 name length, name, u64 offset, u64 bytes, u64 checksum (checksum64,
//       XXH3-64, of the entry's bytes, padding excluded), then ceil(bytes / B) u64 block
//       checksums (checksum64 of the entry's bytes [k B, min((k + 1) B, bytes)): a range read
//       of whole blocks is verified too)
//       u64 header checksum: checksum64 of the header from byte 0 up to this field
//       zero padding up to header bytes
//   then each entry at its offset, zero-padded to a multiple of 4096.
//
// Guarantees: a cache file is written through base/atomic_file.hpp's replace_file (a
// temporary "<path>.tmp-<pid>" with an owner marker, fsync, rename), so `path` is the old
// version or the complete new one, never a partial file; a failed build (a fill that throws,
// a write error, a full disk) leaves no cache file and no temporary of its own behind.
// Builders that share a path are serialised by flock on "<path>.lock" (an empty file, removed
// by the run that created it when it is done, or by base/atomic_file.hpp's
// remove_unfinished_temporaries on a stop signal); a second builder waits, then finds the first
// one's valid file and reuses it. A CacheFile keeps its file descriptors, so a reader of an old
// file keeps reading the old bytes (its inode) while a rebuild renames a new file over the path.
//
// Thread-safety: a CacheFile is immutable after open; its methods may be called from any
// threads at once (reads use pread). build_cache and ensure_cache may run in several threads
// or processes at once for the same path (ensure_cache serialises them; build_cache alone does
// not take the lock).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tier/buffer_ring.hpp"

namespace rp::tier {

inline constexpr uint32_t kCacheFormatVersion = 1;
/// The default size of the blocks an entry's block checksums cover (8 bytes of header each).
inline constexpr uint64_t kDefaultChecksumBlockBytes = uint64_t(4) << 20;

/// What the caller asks to store: an entry's name (unique, non-empty, at most 4096 bytes) and
/// its size in bytes (may be 0).
struct CacheEntrySpec {
  std::string name;
  uint64_t bytes = 0;
};

/// One entry of an opened cache file.
struct CacheEntry {
  std::string name;
  uint64_t offset = 0;    ///< bytes from the file's start, a multiple of 4096
  uint64_t bytes = 0;     ///< the entry's own bytes (padding excluded)
  uint64_t checksum = 0;  ///< checksum64 (XXH3-64) of those bytes
  /// checksum64 of each block of CacheFile::checksum_block_bytes() (the last one shorter)
  std::vector<uint64_t> block_checksums;
  /// The bytes an O_DIRECT read of the whole entry covers (and the buffer it needs).
  uint64_t padded_bytes() const { return align_up(bytes); }
};

/// What open found: valid (file set), missing (no such file), stale (a cache of another
/// source key or format version: rebuild it) or damaged (truncated, bad magic, bad header
/// checksum, an entry table that does not fit the file: rebuild it and say so).
enum class CacheState { valid, missing, stale, damaged };
const char* to_string(CacheState s);

class CacheFile;

struct CacheOpenResult {
  CacheState state = CacheState::missing;
  /// One line naming the file and what is wrong ("<path>: truncated: 8192 bytes, the header
  /// says 16384"); empty when valid.
  std::string reason;
  std::shared_ptr<const CacheFile> file;  ///< set when valid
  /// A file exists at the path that is not a tier cache (shorter than the 8-byte magic, or
  /// without it): a build never replaces it (ensure_cache refuses with one line).
  bool foreign = false;
  /// A file is at the path that cannot be opened for reading (no read permission, a loop of
  /// symbolic links): the reason says "cannot be read (<strerror>)"; foreign too (never replaced).
  bool unreadable = false;
};

class CacheFile {
 public:
  /// Opens `path` and checks its header (magic, version, header checksum, entry table, file
  /// size) against `source_key`. Never throws for a bad file (the state says it); throws
  /// std::bad_alloc only. Entry checksums are not read here: the reader verifies each entry
  /// as it reads it, verify_all() the whole file.
  static CacheOpenResult open(const std::string& path, const std::string& source_key);

  ~CacheFile();
  CacheFile(const CacheFile&) = delete;
  CacheFile& operator=(const CacheFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& source_key() const { return key_; }
  const std::vector<CacheEntry>& entries() const { return entries_; }
  /// Entry i; std::out_of_range naming the file when i >= entries().size().
  const CacheEntry& entry(size_t i) const;
  /// The index of the entry called `name`, nullopt if none.
  std::optional<size_t> find(std::string_view name) const;
  uint64_t file_bytes() const { return file_bytes_; }
  uint64_t header_bytes() const { return header_bytes_; }
  /// The size of the blocks each entry's block_checksums cover.
  uint64_t checksum_block_bytes() const { return block_bytes_; }
  /// Whether the entries are exactly `specs` (names and sizes, in order).
  bool matches(const std::vector<CacheEntrySpec>& specs) const;

  /// A read-only descriptor of the opened inode (buffered reads).
  int fd() const { return fd_; }
  /// The same inode opened with O_DIRECT, or -1 when the file system refused it
  /// (direct_refused() says why, e.g. "O_DIRECT: Invalid argument").
  int direct_fd() const { return direct_fd_; }
  const std::string& direct_refused() const { return direct_refused_; }

  /// Reads entry i into `dst` (at least its bytes long) with buffered preads and verifies
  /// its checksum. Throws std::runtime_error: a short read ("<path>: entry '<name>' at offset
  /// N: short read ...") or a mismatch (checksum_mismatch).
  void read_entry(size_t i, std::span<std::byte> dst) const;
  /// Reads every entry and verifies its checksum and its block checksums (buffered, 8 MiB at a
  /// time, the page cache dropped behind the reads); throws as read_entry at the first bad one.
  void verify_all() const;
  /// "<path>: entry '<name>' at offset N (B bytes): checksum mismatch (stored X, read Y)".
  std::string checksum_mismatch(size_t i, uint64_t got) const;
  /// "<path>: entry '<name>' at offset N: block k (bytes a..b of the entry): checksum mismatch
  /// (stored X, read Y)".
  std::string block_mismatch(size_t i, uint64_t block, uint64_t got) const;
  /// The first block of `data` (bytes [offset, offset + bytes) of entry i, offset a multiple of
  /// the block size) whose checksum differs, as block_mismatch's line; "" when all match. The
  /// range must end at a block boundary or at the entry's end.
  std::string check_blocks(size_t i, uint64_t offset, const std::byte* data, uint64_t bytes) const;

 private:
  CacheFile() = default;
  std::string path_, key_;
  std::vector<CacheEntry> entries_;
  uint64_t file_bytes_ = 0, header_bytes_ = 0, block_bytes_ = 0;
  int fd_ = -1, direct_fd_ = -1;
  std::string direct_refused_;
};

/// Fills part of an entry: writes bytes [offset, offset + out.size()) of entry `entry` (an
/// index into the specs) into `out`. Called for each entry in order, in chunks in order.
/// May throw: the build stops, removes its temporary and rethrows.
using CacheFill = std::function<void(size_t entry, uint64_t offset, std::span<std::byte> out)>;

struct CacheBuildOptions {
  /// Free bytes for an unprivileged user in folder `dir` (default: statvfs f_bavail x
  /// f_frsize). Tests inject a small number.
  std::function<uint64_t(const std::string& dir)> free_bytes;
  /// Bytes of that free space already promised to another file in the folder that has not
  /// taken its blocks yet (the activation spill's file where the file system could not reserve
  /// it): the cache needs its own size beyond them. `reserved_for` names that file in a refusal.
  uint64_t reserved_bytes = 0;
  std::string reserved_for = "the activation spill's file";
  /// The fill's chunk (a multiple of 4096, at least 4096): the host memory a build uses.
  size_t chunk_bytes = size_t(8) << 20;
  /// The blocks each entry's block checksums cover (a multiple of 4096 up to 1 GiB).
  uint64_t checksum_block_bytes = kDefaultChecksumBlockBytes;
  /// Write with O_DIRECT where the file system allows it (else buffered + fdatasync +
  /// posix_fadvise(DONTNEED) per chunk, so a build never fills the page cache).
  bool direct = true;
  /// Test hook, called before each write with its file offset and length: a non-zero return
  /// fails that write with that errno (as ENOSPC or EIO would).
  std::function<int(uint64_t offset, size_t bytes)> write_fault;
  /// ensure_cache: called with one line when another process or thread holds the builders'
  /// lock, before waiting for it (null: wait silently).
  std::function<void(const std::string& line)> on_wait;
  /// ensure_cache: read a file it would reuse whole first (CacheFile::verify_all), still
  /// holding the builders' lock; a bad entry makes it damaged (rebuilt, or refused like any
  /// damaged file: behind a symbolic link), the mismatch being the reason.
  bool verify_reused = false;
};

/// The size a cache file of `specs` with `source_key` has (header plus padded entries).
/// Throws std::invalid_argument for bad specs (an empty or duplicate name, a name over 4096
/// bytes, a key over 1 MiB, a bad block size).
uint64_t cache_file_bytes(const std::string& source_key, const std::vector<CacheEntrySpec>& specs,
                          uint64_t checksum_block_bytes = kDefaultChecksumBlockBytes);

/// How a build wrote: with O_DIRECT, or buffered and why ("O_DIRECT: Invalid argument").
struct CacheBuildReport {
  uint64_t bytes = 0;
  bool direct = false;
  std::string buffered_reason;
};

/// Writes the cache file `path` atomically (see the guarantees above). Before anything is
/// written, checks that the folder has cache_file_bytes() free and else throws
/// std::runtime_error("<path>: not enough disk space for the tier cache: needs N bytes
/// (x GiB), <dir> has M bytes (y GiB) free"). Write failures throw std::runtime_error
/// ("<path>: writing N bytes at offset O failed: <strerror>"); an exception from `fill`
/// propagates unchanged. Takes no lock (ensure_cache does).
CacheBuildReport build_cache(const std::string& path, const std::string& source_key,
                             const std::vector<CacheEntrySpec>& specs, const CacheFill& fill,
                             const CacheBuildOptions& options = {});

/// "<path>.lock": the file builders of `path` lock.
std::string cache_lock_path(const std::string& path);

struct EnsureResult {
  std::shared_ptr<const CacheFile> file;  ///< valid, with the entries asked for
  bool built = false;                     ///< false: an existing valid file was reused
  std::string rebuilt_because;            ///< built: the open's reason (missing/stale/damaged)
  /// built over a file that was at the path once the builders' lock was held (rebuilt_because
  /// says why it could not be used); false: the path held none then
  bool replaced = false;
  /// another run held the builders' lock first: what was found is what the path held after it
  bool waited = false;
};

/// ensure_cache's refusal of what is at `path` (a file that is not a tier cache, a symbolic link
/// to one that needs a rebuild): the line says already what to do and that nothing was written.
struct PathRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The valid cache file for (`source_key`, `specs`) at `path`: takes the builders' lock
/// (waits for another builder), reuses a valid file whose entries match `specs` (whatever its
/// checksum block size and however it was written: options only shape a new build; with
/// options.verify_reused, only once every entry's checksum held), else builds
/// one with build_cache and opens it. Before building it removes the leftovers of dead
/// builders of `path` (base/atomic_file.hpp clean_stale_temporaries: marked ones only). Throws
/// as build_cache, or std::runtime_error when the folder or the lock cannot be made, when
/// `path` holds a file that is not a tier cache ("<path>: exists and is not a roundpipe tier
/// cache; ..."; it is left alone) or is a symbolic link to a cache that needs a rebuild (a
/// valid one is reused through it), both as PathRefused, or when the new file does not open as
/// valid.
/// Whatever it throws, the folders it made for `path` are removed again while they are empty.
EnsureResult ensure_cache(const std::string& path, const std::string& source_key,
                          const std::vector<CacheEntrySpec>& specs, const CacheFill& fill,
                          const CacheBuildOptions& options = {});

}  // namespace rp::tier
