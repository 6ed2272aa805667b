// Reading a file a command was given (a spec, a trace, a --messages or --plan file, a model
// folder's JSON files) whole, without waiting forever on it: a device (/dev/zero never ends), a
// socket and a named pipe that no program writes to (its open waited for a writer forever) are
// refused with one line before anything is read. A pipe that has a writer (a shell's <(...),
// /dev/stdin fed by a pipe) is read as its writer sends it.
#pragma once
#include <cstdint>
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

/// Before reading bytes [0, end) of a memory-mapped file through its mapping: throws
/// std::runtime_error("<path>: <what>: the file is now N bytes, shorter than the M it had when
/// opened (it changed while being read)") when the open file `fd` no longer holds them (a read
/// of the mapping past the end of a file that shrank dies of SIGBUS), or
/// "<path>: <what>: cannot check the file (<reason>)" when fstat fails.
void check_mapped_file_holds(int fd, uint64_t end, uint64_t size_when_opened, const std::string& path,
                             const std::string& what);

/// What a std::bad_alloc while reading `where` (a file, or a file:line) means, as every reader
/// says it: "<where>: cannot read (<bytes> bytes do not fit in memory)", or "<where>: cannot read
/// (it does not fit in memory)" when `bytes` < 0 (a size not known).
std::string does_not_fit_message(const std::string& where, int64_t bytes);

}  // namespace rp
