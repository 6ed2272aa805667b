// Storage forms of frozen weights (kernels/weight_format.hpp): host quantization and the
// reference dequantization the device kernels are tested against.
#include "kernels/weight_format.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kernels/dtype.hpp"
#include "kernels/fp8.hpp"

namespace rp {

const float kNf4[16] = {-1.0f,
                        -0.6961928009986877f,
                        -0.5250730514526367f,
                        -0.39491748809814453f,
                        -0.28444138169288635f,
                        -0.18477343022823334f,
                        -0.09105003625154495f,
                        0.0f,
                        0.07958029955625534f,
                        0.16093020141124725f,
                        0.24611230194568634f,
                        0.33791524171829224f,
                        0.44070982933044434f,
                        0.5626170039176941f,
                        0.7229568362236023f,
                        1.0f};

const float kMxfp4[16] = {0.f, 1.f,  2.f,  3.f,  4.f,  6.f,  8.f,  12.f,
                          0.f, -1.f, -2.f, -3.f, -4.f, -6.f, -8.f, -12.f};

float mxfp4_scale(uint8_t e) { return std::ldexp(1.0f, int(e) - 128); }

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return "f32";
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::f16: return "f16";
    case WeightFormat::q8_0: return "q8_0";
    case WeightFormat::q4_0: return "q4_0";
    case WeightFormat::nf4: return "nf4";
    case WeightFormat::mxfp4: return "mxfp4";
    case WeightFormat::fp8: return "fp8";
  }
  return "?";
}

WeightFormat parse_weight_format(const std::string& s) {
  std::string t;
  for (char c : s) t += char(std::tolower(static_cast<unsigned char>(c)));
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16, WeightFormat::q8_0,
                         WeightFormat::q4_0, WeightFormat::nf4, WeightFormat::mxfp4, WeightFormat::fp8})
    if (t == weight_format_name(f)) return f;
  throw std::invalid_argument(
      fmt::format("'{}' is not a weight format (expected f32, bf16, f16, q8_0, q4_0, nf4, mxfp4 or fp8)", s));
}

int64_t weight_format_block(WeightFormat f) {
  switch (f) {
    case WeightFormat::q8_0:
    case WeightFormat::q4_0:
    case WeightFormat::mxfp4: return 32;
    case WeightFormat::nf4: return 64;
    default: return 1;
  }
}

int64_t weight_format_cols(const std::vector<int64_t>& shape) { return shape.empty() ? 0 : shape.back(); }

size_t weight_format_bytes(WeightFormat f, int64_t n, int64_t cols) {
  if (f == WeightFormat::fp8) {
    if (n < 0 || cols <= 0 || n % cols != 0)
      throw std::invalid_argument(fmt::format(
          "fp8 weights: {} values are not whole rows of {} (a matrix's rows, one scale each)", n, cols));
    return size_t(n) + size_t(n / cols) * 4;
  }
  const int64_t b = weight_format_block(f);
  if (n < 0 || n % b != 0)
    throw std::invalid_argument(fmt::format("{} weights: {} values are not a multiple of its {}-value block",
                                            weight_format_name(f), n, b));
  switch (f) {
    case WeightFormat::f32: return size_t(n) * 4;
    case WeightFormat::bf16:
    case WeightFormat::f16: return size_t(n) * 2;
    case WeightFormat::q8_0: return size_t(n / 32) * 34;
    case WeightFormat::q4_0: return size_t(n / 32) * 18;
    case WeightFormat::nf4: return size_t(n / 64) * 36;
    case WeightFormat::mxfp4: return size_t(n / 32) * 17;
    case WeightFormat::fp8: break;  // above
  }
  throw std::invalid_argument(fmt::format(
      "weight format {} is unknown (expected f32, bf16, f16, q8_0, q4_0, nf4, mxfp4 or fp8)", int(f)));
}

// Within [-2, 2] the nearest code is one of the two levels around v (the levels are sorted and
// at least 0.07 apart, far more than the rounding of v - level), so a branch-free count of the
// levels at or below v (a binary search) and one comparison give the full scan's answer, ties to the lower
// code; NaN and values further out take the scan itself. ~4x faster than the scan for every nf4 base
// quantized on the host.
uint8_t nf4_code(float v) {
  if (std::fabs(v) <= 2.f) {
    int j = 0;  // the last level at or below v (0 below kNf4[1]): four halvings
    for (int step = 8; step > 0; step >>= 1) j += kNf4[j + step] <= v ? step : 0;
    if (j == 15) return 15;
    return uint8_t(std::fabs(v - kNf4[j + 1]) < std::fabs(v - kNf4[j]) ? j + 1 : j);
  }
  int best = 0;
  float d = std::fabs(v - kNf4[0]);
  for (int i = 1; i < 16; ++i)
    if (float e = std::fabs(v - kNf4[i]); e < d) d = e, best = i;
  return uint8_t(best);
}

namespace {

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}
float get_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// ggml's best_index_mxfp4: the code whose value times d is nearest to x (first on ties).
uint8_t nearest_mxfp4(float x, float d) {
  int best = 0;
  float err = std::fabs(kMxfp4[0] * d - x);
  for (int i = 1; i < 16; ++i)
    if (float e = std::fabs(kMxfp4[i] * d - x); e < err) err = e, best = i;
  return uint8_t(best);
}

// ggml's quantize_row_mxfp4_ref for one block of 32 values (exponent clamped into [0, 254]).
void quantize_mxfp4_block(const float* x, uint8_t* out) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const int e = amax > 0 ? std::clamp(int(std::floor(std::log2(amax))) - 2 + 127, 0, 254) : 0;
  out[0] = uint8_t(e);
  const float d = mxfp4_scale(uint8_t(e));
  for (int i = 0; i < 16; ++i)
    out[1 + i] = uint8_t(nearest_mxfp4(x[i], d) | (nearest_mxfp4(x[i + 16], d) << 4));
}

// fp8 rows [r0, r1) of `cols` values: scales at out (fp32 each), codes after all `rows` scales.
// Returns the first row holding a NaN or an infinity (r1 when none); that row and the ones
// after it are left unwritten.
int64_t quantize_fp8_rows(const float* src, uint8_t* out, int64_t rows, int64_t cols, int64_t r0,
                          int64_t r1) {
  uint8_t* codes = out + rows * 4;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = src + r * cols;
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(x[c])) return r;
      amax = std::max(amax, std::fabs(x[c]));
    }
    const float s = fp8::scale_from_amax(amax, Fp8Format::e4m3);
    std::memcpy(out + r * 4, &s, 4);
    for (int64_t c = 0; c < cols; ++c) codes[r * cols + c] = fp8::quantize(Fp8Format::e4m3, x[c], s);
  }
  return r1;
}

void quantize_fp8(const float* src, uint8_t* out, int64_t n, int64_t cols) {
  const int64_t rows = cols > 0 ? n / cols : 0;
  // threads only pay off for a large matrix (a decoder linear is 10^7 values and more)
  const int64_t want =
      n >= (int64_t(1) << 20) ? int64_t(std::max(1u, std::thread::hardware_concurrency())) : 1;
  const int64_t parts = std::min(want, std::max<int64_t>(rows, 1));
  std::vector<int64_t> bad(size_t(parts), 0);
  std::vector<std::thread> pool;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t r0 = rows * p / parts, r1 = rows * (p + 1) / parts;
    auto run = [=, &bad] { bad[size_t(p)] = quantize_fp8_rows(src, out, rows, cols, r0, r1) - r1; };
    if (p + 1 < parts) pool.emplace_back(run);
    else run();
  }
  for (auto& t : pool) t.join();
  for (int64_t p = 0; p < parts; ++p)
    if (bad[size_t(p)] < 0)
      throw std::invalid_argument(
          fmt::format("fp8 weights: row {} holds a NaN or an infinity (no finite scale)",
                      rows * (p + 1) / parts + bad[size_t(p)]));
}

}  // namespace

void quantize_weights(WeightFormat f, const float* src, void* dst, int64_t n, int64_t cols) {
  weight_format_bytes(f, n, cols);  // checks the block multiple
  auto* out = static_cast<uint8_t*>(dst);
  switch (f) {
    case WeightFormat::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case WeightFormat::bf16:
    case WeightFormat::f16:
      cast_f32_to(src, dst, n, f == WeightFormat::bf16 ? DType::bf16 : DType::f16);
      return;
    case WeightFormat::q8_0:
      for (int64_t b = 0; b < n / 32; ++b, src += 32, out += 34) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(src[i]));
        const float d = amax / 127.f, id = d > 0 ? 1.f / d : 0.f;
        put_f16(out, d);
        for (int i = 0; i < 32; ++i) out[2 + i] = uint8_t(int8_t(std::lround(src[i] * id)));
      }
      return;
    case WeightFormat::q4_0:
      for (int64_t b = 0; b < n / 32; ++b, src += 32, out += 18) {
        float amax = 0, mx = 0;  // as ggml: the value of largest magnitude, with its sign
        for (int i = 0; i < 32; ++i)
          if (std::fabs(src[i]) > amax) amax = std::fabs(src[i]), mx = src[i];
        const float d = mx / -8.f, id = d != 0 ? 1.f / d : 0.f;
        put_f16(out, d);
        for (int i = 0; i < 16; ++i) {
          const int q0 = std::min(15, int(src[i] * id + 8.5f)),
                    q1 = std::min(15, int(src[i + 16] * id + 8.5f));
          out[2 + i] = uint8_t(std::max(q0, 0) | (std::max(q1, 0) << 4));
        }
      }
      return;
    case WeightFormat::nf4:
      for (int64_t b = 0; b < n / 64; ++b, src += 64, out += 36) {
        float amax = 0;
        for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(src[i]));
        std::memcpy(out, &amax, 4);
        const float inv = amax > 0 ? 1.f / amax : 0.f;
        for (int i = 0; i < 32; ++i)
          out[4 + i] = uint8_t((nf4_code(src[2 * i] * inv) << 4) | nf4_code(src[2 * i + 1] * inv));
      }
      return;
    case WeightFormat::mxfp4:
      for (int64_t b = 0; b < n / 32; ++b, src += 32, out += 17) quantize_mxfp4_block(src, out);
      return;
    case WeightFormat::fp8: return quantize_fp8(src, out, n, cols);
  }
}

void dequantize_weights(WeightFormat f, const void* src, float* dst, int64_t n, int64_t cols) {
  weight_format_bytes(f, n, cols);
  const auto* in = static_cast<const uint8_t*>(src);
  switch (f) {
    case WeightFormat::f32: std::memcpy(dst, src, size_t(n) * 4); return;
    case WeightFormat::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    case WeightFormat::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = get_f16(in + 2 * i);
      return;
    case WeightFormat::q8_0:
      for (int64_t b = 0; b < n / 32; ++b, in += 34, dst += 32) {
        const float d = get_f16(in);
        for (int i = 0; i < 32; ++i) dst[i] = float(int8_t(in[2 + i])) * d;
      }
      return;
    case WeightFormat::q4_0:
      for (int64_t b = 0; b < n / 32; ++b, in += 18, dst += 32) {
        const float d = get_f16(in);
        for (int i = 0; i < 16; ++i) {
          dst[i] = float(int(in[2 + i] & 15) - 8) * d;
          dst[i + 16] = float(int(in[2 + i] >> 4) - 8) * d;
        }
      }
      return;
    case WeightFormat::nf4:
      for (int64_t b = 0; b < n / 64; ++b, in += 36, dst += 64) {
        float amax;
        std::memcpy(&amax, in, 4);
        for (int i = 0; i < 32; ++i) {
          dst[2 * i] = kNf4[in[4 + i] >> 4] * amax;
          dst[2 * i + 1] = kNf4[in[4 + i] & 15] * amax;
        }
      }
      return;
    case WeightFormat::mxfp4:
      for (int64_t b = 0; b < n / 32; ++b, in += 17, dst += 32) {
        const float d = mxfp4_scale(in[0]);
        for (int i = 0; i < 16; ++i) {
          dst[i] = kMxfp4[in[1 + i] & 15] * d;
          dst[i + 16] = kMxfp4[in[1 + i] >> 4] * d;
        }
      }
      return;
    case WeightFormat::fp8: {
      const int64_t rows = n / cols;
      const uint8_t* codes = in + rows * 4;
      for (int64_t r = 0; r < rows; ++r) {
        float s;
        std::memcpy(&s, in + r * 4, 4);
        for (int64_t c = 0; c < cols; ++c)
          dst[r * cols + c] = fp8::decode<Fp8Format::e4m3>(codes[r * cols + c]) * s;
      }
      return;
    }
  }
}

void mxfp4_from_hf(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t groups, void* dst) {
  if (rows < 0 || groups < 0)
    throw std::invalid_argument(
        fmt::format("mxfp4_from_hf: negative size (rows {}, groups {})", rows, groups));
  const int64_t nb = rows * groups;
  if (nb > 0 && (blocks == nullptr || scales == nullptr || dst == nullptr))
    throw std::invalid_argument("mxfp4_from_hf: null blocks, scales or destination");
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < nb; ++b, blocks += 16, out += 17) {
    // HF: value v is nibble (v & 1) of byte v / 2; ours: value j < 16 is the low nibble of
    // qs[j], value j + 16 its high nibble. The codes are the same (kMxfp4 = 2 * FP4_VALUES
    // and 2^(e-128) = 2^(scale-127) / 2).
    auto code = [&](int v) { return (blocks[v / 2] >> (4 * (v & 1))) & 15; };
    out[0] = scales[b];
    for (int j = 0; j < 16; ++j) out[1 + j] = uint8_t(code(j) | (code(j + 16) << 4));
  }
}

}  // namespace rp
