// Profile: bias-corrected EMA that drops the first sample, settling, calibration, JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "scheduler/profile.hpp"

namespace rp {
namespace {

TEST(SmoothedTime, DropsTheFirstSampleAndCorrectsTheBias) {
  SmoothedTime s(0.9);
  s.add(100.0);  // warm-up outlier: dropped
  EXPECT_FALSE(s.has_value());
  EXPECT_EQ(s.seen(), 1);
  s.add(2.0);
  EXPECT_DOUBLE_EQ(s.value(), 2.0);  // bias-corrected: the first kept sample exactly
  s.add(2.0);
  s.add(2.0);
  EXPECT_NEAR(s.value(), 2.0, 1e-12);  // a constant series stays constant
  EXPECT_LT(s.last_change(), 1e-12);
  // EMA recurrence: m = b m + (1-b) x, estimate m / (1 - b^n)
  SmoothedTime t(0.5);
  t.add(0);
  t.add(1.0);
  t.add(3.0);
  const double m = 0.5 * (0.5 * 1.0) + 0.5 * 3.0;
  EXPECT_DOUBLE_EQ(t.value(), m / (1 - 0.25));
  EXPECT_EQ(t.kept(), 2);
}

TEST(Profile, RecordValidatesAndSettles) {
  Profile p(4, 1, 128);
  EXPECT_THROW(p.record(4, ProfileKind::forward, 1.0), std::invalid_argument);
  try {
    p.record(2, ProfileKind::backward, -1.0);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layer 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(p.record(1, ProfileKind::forward, std::nan("")), std::invalid_argument);
  EXPECT_FALSE(p.settled());
  for (int it = 0; it < 5; ++it) {
    for (int l = 0; l < 3; ++l) {
      p.record(l, ProfileKind::forward, 1.0 + l);
      p.record(l, ProfileKind::backward, 3.0 + l);
    }
    if (it < 4) {
      EXPECT_FALSE(p.settled(0.05, 3));
    }
    p.record(3, ProfileKind::tail, 7.0);
  }
  EXPECT_TRUE(p.settled(0.05, 3));
  EXPECT_FALSE(p.settled(0.05, 5));  // only 4 kept samples (the first was dropped)
  EXPECT_DOUBLE_EQ(p.layer(1).fwd.value(), 2.0);
  // a decoder that only ever ran inside the tail stage settles through its tail series
  Profile q(4, 1, 128);
  for (int it = 0; it < 4; ++it) {
    for (int l : {0, 1}) {
      q.record(l, ProfileKind::forward, 1.0);
      q.record(l, ProfileKind::backward, 3.0);
    }
    q.record(2, ProfileKind::tail, 5.0);
    q.record(3, ProfileKind::tail, 7.0);
  }
  EXPECT_TRUE(q.settled(0.05, 3));
}

TEST(Profile, ApplyReplacesAndCalibrates) {
  std::vector<LayerCost> analytic(5);
  for (int l = 0; l < 5; ++l) analytic[size_t(l)] = LayerCost{1.0, 3.0, 4.0, 10, 20, 5, 7, 0};
  Profile p(5, 1, 64);
  // measure decoder 1 only: twice as slow as the model thinks
  p.record(1, ProfileKind::forward, 0.0);
  p.record(1, ProfileKind::forward, 2.0);
  p.record(1, ProfileKind::backward, 0.0);
  p.record(1, ProfileKind::backward, 5.0);
  p.record(1, ProfileKind::recompute, 0.0);
  p.record(1, ProfileKind::recompute, 1.0);
  p.record_memory(1, 11, 22, 99);
  p.record_memory(1, -1, -1, 50);  // scratch keeps the max
  auto c = p.apply(analytic);
  EXPECT_DOUBLE_EQ(c[1].fwd, 2.0);
  EXPECT_DOUBLE_EQ(c[1].bwd, 6.0);               // backward + recompute
  EXPECT_DOUBLE_EQ(c[1].tail, 4.0 * 8.0 / 4.0);  // scaled like fwd + bwd
  EXPECT_EQ(c[1].weight_bytes, 11);
  EXPECT_EQ(c[1].grad_bytes, 22);
  EXPECT_EQ(c[1].scratch_bytes, 99);
  // other decoders are calibrated by the measured ratio; embedding and tail untouched
  EXPECT_DOUBLE_EQ(c[2].fwd, 2.0);
  EXPECT_DOUBLE_EQ(c[3].bwd, 6.0);
  EXPECT_DOUBLE_EQ(c[0].fwd, 1.0);
  EXPECT_DOUBLE_EQ(c[4].tail, 4.0);
  EXPECT_EQ(c[2].weight_bytes, 10);
  EXPECT_THROW(p.apply(std::vector<LayerCost>(4)), std::invalid_argument);
}

TEST(Profile, JsonRoundTripAndErrors) {
  Profile p(3, 2, 256, 0.7);
  p.device = "cpu (virtual)";
  for (double x : {5.0, 1.0, 1.5, 1.2}) {
    p.record(0, ProfileKind::forward, x);
    p.record(1, ProfileKind::backward, 2 * x);
    p.record(2, ProfileKind::tail, 3 * x);
  }
  p.record_memory(1, 100, 200, 300);
  const auto path = (std::filesystem::temp_directory_path() / "rp_test_profile.json").string();
  p.save(path);
  Profile q = Profile::load(path);
  std::filesystem::remove(path);
  EXPECT_EQ(q.to_json(), p.to_json());
  EXPECT_EQ(q.n_seq(), 2);
  EXPECT_EQ(q.device, "cpu (virtual)");
  EXPECT_DOUBLE_EQ(q.layer(2).tail.value(), p.layer(2).tail.value());
  // the series continue where they stopped
  p.record(0, ProfileKind::forward, 9.0);
  q.record(0, ProfileKind::forward, 9.0);
  EXPECT_DOUBLE_EQ(q.layer(0).fwd.value(), p.layer(0).fwd.value());

  nlohmann::json j = p.to_json();
  j["layers"][1]["backward"].erase("m");
  try {
    Profile::from_json(j, "run/profile.json");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1.backward: key 'm'"), std::string::npos) << e.what();
  }
  j = p.to_json();
  j["layers"][2]["layer"] = 5;
  EXPECT_THROW(Profile::from_json(j, "x"), std::invalid_argument);
  j = p.to_json();
  j["format"] = "other";
  EXPECT_THROW(Profile::from_json(j, "x"), std::invalid_argument);
  EXPECT_THROW(Profile::load("/nonexistent/profile.json"), std::runtime_error);
  EXPECT_EQ(profile_kind_from_name("recompute"), ProfileKind::recompute);
  EXPECT_THROW(profile_kind_from_name("sideways"), std::invalid_argument);
}

// The linear compute a profile was measured in survives its file; a file without it (written
// before it was recorded) reads as unknown, a value outside the three is refused naming the key.
TEST(Profile, RecordsItsLinearCompute) {
  EXPECT_STREQ(linear_compute_name(false, true), "bf16");
  EXPECT_STREQ(linear_compute_name(true, false), "fp8");
  EXPECT_STREQ(linear_compute_name(true, true), "fp8+wgrad");
  Profile p(3, 1, 16);
  p.linear_compute = "fp8+wgrad";
  EXPECT_EQ(Profile::from_json(p.to_json(), "x").linear_compute, "fp8+wgrad");
  nlohmann::json j = p.to_json();
  j.erase("linear_compute");
  EXPECT_EQ(Profile::from_json(j, "x").linear_compute, "");
  EXPECT_FALSE(Profile(3, 1, 16).to_json().contains("linear_compute"));  // unknown stays unknown
  j["linear_compute"] = "fp4";
  try {
    Profile::from_json(j, "run/profile.json");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "run/profile.json: key 'linear_compute': expected \"bf16\", \"fp8\" or \"fp8+wgrad\", got \"fp4\"");
  }
}

}  // namespace
}  // namespace rp

namespace rp {
namespace {

// Only a file is read as a profile: a pipe (whose open would wait for a writer forever), a
// folder and a missing path are each one error naming the path.
TEST(Profile, LoadReadsOnlyAFile) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("rp_profile_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  const std::string fifo = (d / "fifo.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& p : {fifo, d.string(), (d / "missing.json").string()}) {
    try {
      Profile::load(p);
      ADD_FAILURE() << p << " was read";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
    }
  }
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace rp

namespace rp {
namespace {

/// The error Profile::load throws for `text` written as a file (empty when it loads).
std::string load_error(const std::string& text) {
  const std::filesystem::path f =
      std::filesystem::temp_directory_path() / ("rp_profile_text_" + std::to_string(::getpid()) + ".json");
  std::ofstream(f) << text;
  std::string what;
  try {
    Profile::load(f.string());
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  std::filesystem::remove(f);
  return what.empty() ? what : what.substr(what.find(':'));  // without the temporary path
}

/// ":<line>" of the first `needle` in `text`.
std::string line_of(const std::string& text, const std::string& needle) {
  const size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << needle;
  return ":" +
         std::to_string(1 + std::count(text.begin(), text.begin() + long(std::min(at, text.size())), '\n'));
}

/// A profile with every key to_json writes: all four series, the memory and the linear compute.
Profile full_profile() {
  Profile p(3, 1, 16);
  p.linear_compute = "bf16";
  p.device = "cpu";
  for (int l = 0; l < 3; ++l)
    for (ProfileKind k :
         {ProfileKind::forward, ProfileKind::recompute, ProfileKind::backward, ProfileKind::tail})
      for (double x : {1.0, 2.0}) p.record(l, k, x);
  for (int l = 0; l < 3; ++l) p.record_memory(l, 10, 20, 30);
  return p;
}

// Every key a profile is written with loads back; a syntax error names the line and column, a
// key given twice its line, and a key the format does not have (a typo: "layer" for "layers",
// "forwrd" for "forward") is refused naming it and the keys expected, at every level.
TEST(Profile, LoadRefusesBadJsonDuplicateAndUnknownKeysNamingThem) {
  const nlohmann::json full = full_profile().to_json();
  ASSERT_TRUE(full["layers"][1].contains("recompute") && full["layers"][1].contains("scratch_peak_bytes"));
  EXPECT_EQ(load_error(full.dump(1)), "");

  std::string text = full.dump(1);
  const size_t beta = text.find("\"beta\"");
  const size_t line = 1 + size_t(std::count(text.begin(), text.begin() + long(beta), '\n'));
  std::string bad = text;
  bad.erase(bad.find(',', beta), 1);  // "beta": 0.8 "device": ...: refused at the end of "device"
  const size_t device_end = bad.find("\"device\"") + 7, line_start = bad.rfind('\n', device_end) + 1;
  const std::string at = fmt::format(":{}:{}: ", line + 1, device_end - line_start + 1);
  EXPECT_EQ(load_error(bad).rfind(at + "invalid JSON: syntax error while parsing object", 0), 0u)
      << load_error(bad);
  bad = text;
  bad.insert(beta, "\"beta\": 0.5,\n ");
  EXPECT_EQ(load_error(bad), ":" + std::to_string(line + 1) + ": key 'beta' given twice");

  nlohmann::json j = full;
  j["layer"] = j["layers"];
  j.erase("layers");
  EXPECT_EQ(load_error(j.dump(1)), line_of(j.dump(1), "\"layer\"") +
                                       ": unknown key 'layer'; did you mean 'layers'? (known keys: beta, "
                                       "device, format, layers, linear_compute, n_seq, "
                                       "seq_len, version)");
  j = full;
  j["layers"][1]["forwrd"] = j["layers"][1]["forward"];
  j["layers"][1].erase("forward");
  EXPECT_EQ(load_error(j.dump(1)), line_of(j.dump(1), "\"forwrd\"") +
                                       ": layer 1: unknown key 'forwrd'; did you mean 'forward'? (known "
                                       "keys: backward, forward, grad_bytes, layer, recompute, "
                                       "scratch_peak_bytes, tail, weight_bytes)");
  j = full;
  j["layers"][2]["tail"]["kep"] = 1;
  EXPECT_EQ(load_error(j.dump(1)),
            line_of(j.dump(1), "\"kep\"") +
                ": layer 2.tail: unknown key 'kep'; did you mean 'kept'? (known keys: kept, last_change, m, "
                "seconds, seen)");
}

// Values out of range are refused in one line naming the line, the key and the range: a time of
// 1e300 s (which a plan printed as a 300-digit iteration time), a scratch of 2^62 bytes, negative
// numbers, a number beyond a double, counts that contradict each other; whatever the profiler
// records loads back, the largest values it keeps included.
TEST(Profile, LoadRefusesValuesOutOfRangeNamingLineKeyAndRange) {
  const nlohmann::json full = full_profile().to_json();
  /// `full` with `edit` applied: the error, which must name the line of the text's `marker`.
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& marker) {
    nlohmann::json j = full;
    edit(j);
    const std::string text = j.dump(1), error = load_error(text);
    EXPECT_EQ(error.rfind(line_of(text, marker) + ": ", 0), 0u) << marker << ": " << error;
    return error.substr(error.find(": ") + 2);
  };
  EXPECT_EQ(refused([](auto& j) { j["layers"][1]["forward"]["m"] = 1e300; }, "\"m\": 1e+300"),
            "layer 1.forward: key 'm': expected a number of seconds in [0, 1e+06], got 1e+300");
  EXPECT_EQ(
      refused([](auto& j) { j["layers"][1]["scratch_peak_bytes"] = int64_t(1) << 62; },
              "\"scratch_peak_bytes\": 4611686018427387904"),
      "layer 1: key 'scratch_peak_bytes': expected an integer in [0, 1099511627776] (at most 1 TiB), got "
      "4611686018427387904");
  EXPECT_EQ(refused([](auto& j) { j["layers"][0]["weight_bytes"] = -7; }, "\"weight_bytes\": -7"),
            "layer 0: key 'weight_bytes': expected an integer in [0, 1099511627776] (at most 1 TiB), got -7");
  EXPECT_EQ(refused([](auto& j) { j["layers"][2]["tail"]["last_change"] = -0.25; }, "\"last_change\": -0.25"),
            "layer 2.tail: key 'last_change': expected a finite number >= 0, got -0.25");
  EXPECT_EQ(refused([](auto& j) { j["layers"][2]["backward"]["kept"] = -3; }, "\"kept\": -3"),
            "layer 2.backward: key 'kept': expected an integer in [0, 1000000000000], got -3");
  EXPECT_EQ(
      refused([](auto& j) { j["layers"][0]["recompute"]["seen"] = 0; }, "\"seen\": 0"),
      "layer 0.recompute: key 'seen': expected an integer in [1, 1000000000000] (at least kept), got 0");
  EXPECT_EQ(refused([](auto& j) { j["layers"][0]["forward"]["seconds"] = 5e9; }, "\"seconds\": 5000000000.0"),
            "layer 0.forward: key 'seconds': expected a number of seconds in [0, 1e+06], got 5000000000.0");
  EXPECT_EQ(refused([](auto& j) { j["beta"] = 1.5; }, "\"beta\": 1.5"),
            "key 'beta': expected a number in [0, 1), got 1.5");
  EXPECT_EQ(refused([](auto& j) { j["n_seq"] = 0; }, "\"n_seq\""),
            "key 'n_seq': expected an integer in [1, 1099511627776], got 0");
  EXPECT_EQ(
      refused([](auto& j) { j["n_seq"] = 1024, j["seq_len"] = int64_t(1) << 31; }, "\"seq_len\""),
      "key 'seq_len': expected an integer in [1, 1073741824] (n_seq x seq_len at most 2^40), got 2147483648");
  // a small m of one sample is divided by 1 - beta^1: 5 times m with beta 0.8
  EXPECT_EQ(refused(
                [](auto& j) {
                  j["layers"][1]["tail"] = {{"m", 900000.0}, {"kept", 1}, {"seen", 2}, {"last_change", 1.0}};
                },
                "\"m\": 900000.0"),
            "layer 1.tail: key 'm': expected a number of seconds in [0, 1e+06] once bias-corrected (m / (1 - "
            "beta^kept) = 4.5e+06), got 900000.0");
  // a number beyond a double is the parser's: the key path and its line
  std::string text = full.dump(1);
  const size_t m = text.find("\"m\": ") + 5;
  text.replace(m, text.find_first_of(",\n", m) - m, "1e999");
  EXPECT_EQ(load_error(text).rfind(
                line_of(text, "1e999") + ": key 'layers[0].backward.m': expected a number within", 0),
            0u)
      << load_error(text);

  // the profiler keeps nothing the reader refuses: the largest time and byte counts load back
  Profile p(3, 1, 16);
  for (double x :
       {kProfileMaxSeconds, kProfileMaxSeconds, kProfileMaxSeconds, 0.0, 1e-300, kProfileMaxSeconds})
    for (ProfileKind k : {ProfileKind::forward, ProfileKind::backward, ProfileKind::tail}) p.record(1, k, x);
  p.record_memory(1, kProfileMaxBytes, kProfileMaxBytes, kProfileMaxBytes);
  EXPECT_EQ(load_error(p.to_json().dump(1)), "");
  EXPECT_THROW(p.record(1, ProfileKind::forward, kProfileMaxSeconds * 2), std::invalid_argument);
  EXPECT_THROW(p.record_memory(1, -1, -1, kProfileMaxBytes + 1), std::invalid_argument);
  EXPECT_EQ(p.layer(1).scratch_peak_bytes, kProfileMaxBytes);
}

}  // namespace
}  // namespace rp
