// Reading a file a command was given (a spec, a trace, a --messages or --plan file, a model
// folder's JSON files) whole, without waiting forever on it: a device (/dev/zero never ends), a
// socket and a named pipe that no program writes to (its open waited for a writer forever) are
// refused with one line before anything is read. A pipe that has a writer (a shell's <(...),
// /dev/stdin fed by a pipe) is read as its writer sends it. A model file is read in pieces at
// offsets (PositionalFile), so a file that changes under the reader gives an error, not SIGBUS.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace rp {

/// The whole content of `path`. Throws std::invalid_argument with one line naming it:
///   "<path>: is a folder, expected <expected>"
///   "<path>: is a device, expected <expected>" (a character or block device)
///   "<path>: is a socket, expected <expected>"
///   "<path>: is a named pipe that no program writes to (reading it would wait forever), expected
///   <expected>"
///   "<path>: cannot open<opening> (<reason>)" / "<path>: cannot read (<reason>)"
/// `opening` names the file in the open error (" the spec file"), "" for none.
std::string read_input_file(const std::string& path, std::string_view expected,
                            std::string_view opening = "");

/// A regular file read at byte offsets with pread, never through a memory mapping: a file that
/// another program shrinks while it is read, or a disk that fails (EIO), gives a one-line error
/// where a read of a mapping dies of SIGBUS. After every read the file's size and modification
/// time are compared with those it had when this object was made, so a file rewritten in place
/// (`cp other in.gguf`, `dd conv=notrunc`) fails the read instead of giving a model mixed from
/// two files; a file replaced by rename (`mv new in.gguf`) is not this file and reads on as it
/// was. Not seen, as no check of the file's status can see them: a write that keeps the size
/// within the file system's timestamp tick of the open (coarse clocks: a few ms), a rewrite whose
/// writer sets the old modification time back (`touch -r`, `cp -p` / `rsync -t --inplace` of a
/// file with that same time), and stores through another program's writable shared mapping of
/// the file (they change no time stamp). The status-change time is not compared: the `mv` above
/// changes it on the file being read (its link count), as do chmod and chown. Holds the descriptor it is
/// given (closed with it); reads of one object from several threads at once are safe (pread keeps no file
/// position).
class PositionalFile {
 public:
  PositionalFile() = default;
  /// Takes `fd` (open for reading); `size` is the file's size when it was opened. Notes the
  /// file's modification time (fstat) for the checks after each read.
  PositionalFile(int fd, uint64_t size, std::string path);
  ~PositionalFile();
  PositionalFile(PositionalFile&& o) noexcept;
  PositionalFile& operator=(PositionalFile&& o) noexcept;
  PositionalFile(const PositionalFile&) = delete;
  PositionalFile& operator=(const PositionalFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  ///< bytes, when opened

  /// Bytes [offset, offset + n) into `dst`. Throws std::runtime_error naming the file and `what`
  /// ("tensor 'x'"): "<path>: <what>: the file changed while being read: it is now N bytes, it
  /// had M when opened", "<path>: <what>: the file changed while being read (modified after it
  /// was opened)", or "<path>: <what>: cannot read (<reason>)".
  void read(uint64_t offset, uint64_t n, void* dst, std::string_view what) const;
  /// read() over [offset, offset + n) in pieces of at most about 8 MiB that hold whole `unit`-byte
  /// units (n a multiple of `unit`), each handed to fn(bytes, first_unit, units) in order, so a
  /// large tensor is decoded without holding its stored bytes whole.
  void read_chunks(uint64_t offset, uint64_t n, uint64_t unit, std::string_view what,
                   const std::function<void(const uint8_t*, uint64_t, uint64_t)>& fn) const;

 private:
  /// Throws if the file's size or modification time is no longer what it was when opened.
  void check_unchanged(std::string_view what) const;

  int fd_ = -1;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = 0;  ///< st_mtim when opened, in ns since the epoch
  std::string path_;
};

/// What a std::bad_alloc while reading `where` (a file, or a file:line) means, as every reader
/// says it: "<where>: cannot read (<bytes> bytes do not fit in memory)", or "<where>: cannot read
/// (it does not fit in memory)" when `bytes` < 0 (a size not known).
std::string does_not_fit_message(const std::string& where, int64_t bytes);

}  // namespace rp
