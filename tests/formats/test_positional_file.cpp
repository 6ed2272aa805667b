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
  f.read(30000, 5000, got.data(), "tensor 'x'");  // still held
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin() + 30000));
  try {
    f.read(38000, 5000, got.data(), "tensor 'x'");
    ADD_FAILURE() << "a read past the new end of the file returned";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              path +
                  ": tensor 'x': the file is now 40000 bytes, shorter than the 100000 it had when opened (it "
                  "changed while being read)");
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

/// Copies `original` to `path` `trials` times; each time opens it, cuts the file to a quarter
/// (the first time before the read, then from another thread after delays spread over one
/// read's duration) and reads it with `read`: each read either returns `want` or fails with
/// one line saying the file shrank. The process must survive every cut.
template <class File>
void cut_while_reading(const std::string& original, const std::string& path, int trials,
                       const std::function<std::vector<float>(const File&)>& read,
                       const std::vector<float>& want) {
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
    const File f(path);
    const auto cut_file = [&] { fs::resize_file(path, fs::file_size(original) / 4); };
    if (i == 0) cut_file();
    const auto delay = one_read * (i - 1) / (trials - 1);
    std::thread cut([&] {
      if (i == 0) return;
      std::this_thread::sleep_for(delay);
      cut_file();
    });
    try {
      EXPECT_EQ(read(f), want);
      ++whole;
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind(path + ": tensor 'w': the file is now ", 0), 0u) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      ++refused;
    }
    cut.join();
  }
  EXPECT_EQ(whole + refused, trials);
  EXPECT_GT(refused, 0);  // at least the first
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

}  // namespace
}  // namespace rp
