// What the stop-signal handler of `roundpipe train` reads (roundpipe/replicas.hpp): the first
// replica failure, kept as one NUL-terminated line cut to 1023 bytes, and the launcher's rank.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "roundpipe/replicas.hpp"

namespace {

TEST(FailureLine, TheFirstFailureHoldsCutToOneLineOf1023Bytes) {
  EXPECT_EQ(rp::replica_failure_line(), nullptr);  // nothing failed in this process yet
  const std::string first = "replica 1 sent nothing for 5.0 s " + std::string(3000, 'x');
  rp::note_replica_failure(first);
  const char* line = rp::replica_failure_line();
  ASSERT_NE(line, nullptr);
  EXPECT_EQ(std::strlen(line), 1023u);
  EXPECT_EQ(std::string(line), first.substr(0, 1023));
  rp::note_replica_failure("replica 2 failed: later");  // a later failure does not replace it
  EXPECT_EQ(std::string(rp::replica_failure_line()), first.substr(0, 1023));
}

TEST(FailureLine, LauncherRankComesFromTheEnvironment) {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) ::unsetenv(v);
  EXPECT_EQ(rp::launcher_rank(), -1);
  ::setenv("PMI_RANK", "3", 1);
  EXPECT_EQ(rp::launcher_rank(), 3);
  ::setenv("OMPI_COMM_WORLD_RANK", "1", 1);  // Open MPI's own name first
  EXPECT_EQ(rp::launcher_rank(), 1);
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) ::unsetenv(v);
}

}  // namespace
