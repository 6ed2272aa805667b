// Model files are read at offsets (PositionalFile), never through a memory mapping: a file
// another program shrinks while a tensor is being read fails that read with one line, where a
// read of a mapping past the new end of the file dies of SIGBUS and takes the process with it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/input_file.hpp"
#include "formats/gguf.hpp"
#include "formats/safetensors.hpp"
#include "kernels/dtype.hpp"
#include "tests/formats/test_io_util.hpp"

namespace rp {
namespace {

namespace fs = std::filesystem;

PositionalFile open_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  return PositionalFile(fd, fs::file_size(path), path);
}

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t((i * 2654435761u) >> 13);
  return b;
}

TEST(PositionalFile, ReadsWhatTheFileHoldsAndRefusesWhatItNoLongerDoes) {
  test::TempDir dir("pfile");
  const std::string path = dir / "f.bin";
  const std::vector<uint8_t> want = pattern(100000);
  test::write_bytes(path, want);
  const PositionalFile f = open_file(path);
  std::vector<uint8_t> got(5000);
  f.read(12345, got.size(), got.data(), "tensor 'x'");
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + 12345));
  fs::resize_file(path, 40000);
  // bytes the file still holds are refused too: what follows them is no longer the same file
  for (const uint64_t at : {uint64_t(30000), uint64_t(38000)}) {
    try {
      f.read(at, 5000, got.data(), "tensor 'x'");
      ADD_FAILURE() << "a read of a file that shrank returned";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()),
                path +
                    ": tensor 'x': the file changed while being read: it is now 40000 bytes, it had 100000 "
                    "when opened");
    }
  }
}

TEST(PositionalFile, PiecesHoldWholeUnitsAndCoverTheRangeInOrder) {
  test::TempDir dir("pfile_chunks");
  const std::string path = dir / "f.bin";
  const uint64_t unit = 34, units = (uint64_t(20) << 20) / unit + 7;  // q8_0 blocks, > 2 pieces
  const std::vector<uint8_t> want = pattern(size_t(units * unit + 100));
  test::write_bytes(path, want);
  const PositionalFile f = open_file(path);
  std::vector<uint8_t> got;
  uint64_t next = 0;
  int pieces = 0;
  f.read_chunks(11, units * unit, unit, "tensor 'x'", [&](const uint8_t* p, uint64_t first, uint64_t k) {
    EXPECT_EQ(first, next);
    EXPECT_GT(k, 0u);
    EXPECT_LE(k * unit, (uint64_t(8) << 20) + unit);
    got.insert(got.end(), p, p + k * unit);
    next = first + k;
    ++pieces;
  });
  EXPECT_EQ(next, units);
  EXPECT_GE(pieces, 3);
  ASSERT_EQ(got.size(), units * unit);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + 11));
  EXPECT_THROW(f.read_chunks(0, 35, 34, "x", [](const uint8_t*, uint64_t, uint64_t) {}), std::logic_error);
}

/// Copies `original` to `path` `trials` times; each time opens it, changes the file with
/// `disturb` (the first time before the read, then from another thread after delays spread over
/// one read's duration) and reads it with `read`: each read either returns `want` or fails with
/// one line saying the file changed. The process must survive every change.
template <class File>
void disturb_while_reading(const std::string& original, const std::string& path, int trials,
                           const std::function<std::vector<float>(const File&)>& read,
                           const std::vector<float>& want, const std::function<void()>& disturb) {
  fs::copy_file(original, path, fs::copy_options::overwrite_existing);
  auto t0 = std::chrono::steady_clock::now();
  {
    const File f(path);
    ASSERT_EQ(read(f), want);
  }
  const auto one_read = std::chrono::steady_clock::now() - t0;
  int whole = 0, refused = 0;
  for (int i = 0; i < trials; ++i) {
    fs::copy_file(original, path, fs::copy_options::overwrite_existing);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the copy's timestamp tick passes
    const File f(path);
    if (i == 0) disturb();
    const auto delay = one_read * (i - 1) / (trials - 1);
    std::thread other([&] {
      if (i == 0) return;
      std::this_thread::sleep_for(delay);
      disturb();
    });
    try {
      EXPECT_EQ(read(f), want) << "trial " << i;
      ++whole;
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(path + ": tensor 'w': the file changed while being read", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      ++refused;
    }
    other.join();
  }
  EXPECT_EQ(whole + refused, trials);
  EXPECT_GT(refused, 0);  // at least the first
}

/// disturb_while_reading, the file cut to a quarter of its size.
template <class File>
void cut_while_reading(const std::string& original, const std::string& path, int trials,
                       const std::function<std::vector<float>(const File&)>& read,
                       const std::vector<float>& want) {
  disturb_while_reading<File>(original, path, trials, read, want,
                              [&] { fs::resize_file(path, fs::file_size(original) / 4); });
}

TEST(ModelFiles, AFileCutWhileATensorIsReadFailsTheReadNotTheProcess) {
  test::TempDir dir("pfile_cut");
  const int64_t n = int64_t(12) << 20;  // 24 MiB of 16-bit values: a read of several pieces
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[size_t(i)] = float(i % 256) - 128.f;  // exact in bf16 and f16
  {
    SCOPED_TRACE("safetensors, bf16");
    save_safetensors(dir / "m.safetensors", {TensorRef{"w", {n}, values.data(), {}}}, DType::bf16);
    cut_while_reading<SafetensorsFile>(
        dir / "m.safetensors", dir / "cut.safetensors", 8,
        [](const SafetensorsFile& f) { return f.read_f32(*f.find("w")).data; }, values);
  }
  {
    SCOPED_TRACE("gguf, f16");
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = f32_to_f16(values[size_t(i)]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
    test::GgufBuilder b;
    b.str("general.architecture", "llama");
    b.tensor("w", {uint64_t(n)}, 1, std::move(bytes));
    test::write_bytes(dir / "m.gguf", b.build());
    cut_while_reading<GgufFile>(
        dir / "m.gguf", dir / "cut.gguf", 8, [](const GgufFile& f) { return f.dequantize(*f.find("w")); },
        values);
  }
}

/// Writes `bytes` over the start of `path` in place (same inode, same size), as `dd conv=notrunc`
/// or a program rewriting its output does.
void overwrite_in_place(const std::string& path, const std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), ssize_t(bytes.size()));
  ::close(fd);
}

int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

TEST(PositionalFile, BytesRewrittenInPlaceBetweenTwoPiecesFailTheReadRatherThanMixTwoFiles) {
  test::TempDir dir("pfile_rewrite");
  const std::string path = dir / "f.bin";
  const uint64_t n = uint64_t(20) << 20;  // three pieces
  const std::vector<uint8_t> a = pattern(size_t(n));
  std::vector<uint8_t> b(a.rbegin(), a.rend());  // same size, other bytes
  test::write_bytes(path, a);
  const int64_t before = mtime_ns(path);
  const PositionalFile f = open_file(path);
  int pieces = 0;
  try {
    f.read_chunks(0, n, 1, "tensor 'x'", [&](const uint8_t* p, uint64_t first, uint64_t k) {
      EXPECT_TRUE(std::equal(p, p + k, a.begin() + int64_t(first)))
          << "piece " << pieces << " mixes two files";
      if (pieces++ == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the timestamp clock's tick
        overwrite_in_place(path, b);
      }
    });
    if (mtime_ns(path) == before) GTEST_SKIP() << "this file system's timestamps did not change on a write";
    ADD_FAILURE() << "a read of a file rewritten between its pieces returned";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ": tensor 'x': the file changed while being read (modified after it was opened)");
  }
  EXPECT_EQ(pieces, 1);
  // a file replaced by rename is another file: the one opened reads on, whole and unmixed
  test::write_bytes(path + ".new", a);
  const PositionalFile g = open_file(path + ".new");
  fs::rename(path, path + ".new");
  std::vector<uint8_t> got(static_cast<size_t>(n));
  g.read(0, n, got.data(), "tensor 'x'");
  EXPECT_TRUE(got == a);
}

TEST(ModelFiles, AFileCopiedOverWhileATensorIsReadGivesItsValuesOrOneLineNeverAMix) {
  // `cp other.gguf in.gguf` while in.gguf is read: cp cuts the file to nothing, then writes the
  // other file's bytes; every read must return the first file's values or fail with one line
  test::TempDir dir("pfile_cp");
  const int64_t n = int64_t(12) << 20;
  std::vector<float> va(static_cast<size_t>(n)), vb(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    va[size_t(i)] = float(i % 256) - 128.f;
    vb[size_t(i)] = float((i + 77) % 200) - 100.f;
  }
  save_safetensors(dir / "a.safetensors", {TensorRef{"w", {n}, va.data(), {}}}, DType::bf16);
  save_safetensors(dir / "b.safetensors", {TensorRef{"w", {n}, vb.data(), {}}}, DType::bf16);
  const std::vector<uint8_t> bytes_b = test::read_bytes(dir / "b.safetensors");
  const std::string path = dir / "in.safetensors";
  disturb_while_reading<SafetensorsFile>(
      dir / "a.safetensors", path, 10, [](const SafetensorsFile& f) { return f.read_f32(*f.find("w")).data; },
      va, [&] { test::write_bytes(path, bytes_b); });  // as cp: truncates, then writes
}

}  // namespace
}  // namespace rp
