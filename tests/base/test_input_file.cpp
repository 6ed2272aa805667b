// base/input_file: a file a command reads whole is refused with one line when reading it could
// not end (a device, a named pipe no program writes to) or cannot start (a folder, a socket),
// and a pipe with a writer is read as its writer sends it.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include "base/input_file.hpp"

namespace fs = std::filesystem;

namespace {

std::string read_or_error(const std::string& path) {
  try {
    return rp::read_input_file(path, "a JSON file");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
}

fs::path scratch() {
  const fs::path d =
      fs::temp_directory_path() / ("rp_input_file_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A named pipe that no program writes to: its open waited for a writer forever (a spec given
// as one hung `roundpipe train`); now it is refused at once.
TEST(InputFile, ANamedPipeWithoutAWriterIsRefusedAtOnce) {
  const fs::path d = scratch();
  const std::string fifo = (d / "spec.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto read = std::async(std::launch::async, [&] { return read_or_error(fifo); });
  if (read.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "still waiting for a writer after 20 s";
    const int w = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);  // lets the read end
    ::close(w);
  }
  EXPECT_EQ(read.get(), fifo +
                            ": is a named pipe that no program writes to (reading it would wait forever), "
                            "expected a JSON file");
  fs::remove_all(d);
}

// A pipe with a writer is read whole, as the writer sends it: one that wrote everything and left
// (a shell's <(cat spec.json) once cat is done), and one that writes only later.
TEST(InputFile, APipeWithAWriterIsReadAsItSends) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  ASSERT_EQ(::write(p[1], "{\"a\": 1}", 8), 8);
  ::close(p[1]);
  EXPECT_EQ(read_or_error("/dev/fd/" + std::to_string(p[0])), "{\"a\": 1}");
  ::close(p[0]);

  ASSERT_EQ(::pipe(p), 0);
  auto read =
      std::async(std::launch::async, [&] { return read_or_error("/dev/fd/" + std::to_string(p[0])); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the reader waits on the empty pipe
  ASSERT_EQ(::write(p[1], "[1, 2]", 6), 6);
  ::close(p[1]);
  EXPECT_EQ(read.get(), "[1, 2]");
  ::close(p[0]);
}

// A folder, a device and a socket are each named for what they are.
TEST(InputFile, AFolderADeviceAndASocketAreNamed) {
  const fs::path d = scratch();
  EXPECT_EQ(read_or_error(d.string()), d.string() + ": is a folder, expected a JSON file");
  EXPECT_EQ(read_or_error("/dev/zero"), "/dev/zero: is a device, expected a JSON file");
  const std::string sock = (d / "s.json").string();
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(s, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(read_or_error(sock), sock + ": is a socket, expected a JSON file");
  ::close(s);
  EXPECT_EQ(read_or_error((d / "missing.json").string()),
            (d / "missing.json").string() + ": cannot open (" + std::strerror(ENOENT) + ")");
  fs::remove_all(d);
}

}  // namespace

// In a child of a death test: reads `path` with the address space capped at 1 GiB; exit 3 after
// printing the one-line refusal, 0 when it was read. The child removes `path` before it exits:
// a threadsafe death test's child runs the test again from its start, so the file is its own.
void read_capped(const std::string& path) {
  struct rlimit cap {};
  cap.rlim_cur = cap.rlim_max = rlim_t(1) << 30;
  setrlimit(RLIMIT_AS, &cap);
  int code = 0;
  try {
    rp::read_input_file(path, "a JSON file");
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s\n", e.what());
    code = 3;
  }
  ::unlink(path.c_str());
  std::_Exit(code);
}

// A file larger than the memory the process may have is one line naming it and its size, where
// std::bad_alloc's own text ("std::bad_alloc") named nothing. The child caps its address space
// (RLIMIT_AS) at 1 GiB and reads a sparse 4 GiB file.
TEST(InputFileDeathTest, AFileLargerThanMemoryIsNamedWithItsSize) {
  const fs::path p = fs::temp_directory_path() / ("rp_huge_" + std::to_string(::getpid()) + ".json");
  {
    const int fd = ::open(p.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, off_t(4) << 30), 0);
    ::close(fd);
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(read_capped(p.string()), ::testing::ExitedWithCode(3),
              "rp_huge_[0-9]+\\.json: cannot read \\(4294967296 bytes do not fit in memory\\)");
  fs::remove(p);
}
