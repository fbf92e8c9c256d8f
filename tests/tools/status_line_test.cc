// The progress line of long commands (base/status_line.h): plain lines in
// logs, a bounded number of them; in place redraws on a terminal, never wider
// than the limit; nothing when quiet.
#include "crashreplay/base/status_line.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace crashreplay {
namespace {

std::string Drain(FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  return s;
}

int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST(StatusLine, InALogAPhaseOfAThousandUnitsIsAboutElevenPlainLines) {
  FILE* f = std::tmpfile();
  {
    StatusLine p(f, /*live=*/false, "replay");
    for (int i = 0; i <= 1000; ++i) p.Update("step 7 kernel by kernel", i, 1000, "L0.q_proj");
  }
  const std::string out = Drain(f);
  EXPECT_EQ(Lines(out), 11) << out;  // 0/1000, each tenth, 1000/1000
  EXPECT_NE(out.find("replay: step 7 kernel by kernel  0/1000  L0.q_proj\n"), std::string::npos) << out;
  EXPECT_NE(out.find("replay: step 7 kernel by kernel  1000/1000  L0.q_proj\n"), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << "nothing is redrawn in a log";
  std::fclose(f);
}

TEST(StatusLine, ANewPhaseAlwaysGetsALine) {
  FILE* f = std::tmpfile();
  {
    StatusLine p(f, false, "run");
    p.Update("loading /m", 0, 0);
    p.Update("running", 1, 0, "step 0 prefill");
    p.Update("running", 2, 0, "step 1 decode");  // same phase, unknown total: no new line
  }
  EXPECT_EQ(Drain(f), "run: loading /m\nrun: running  1  step 0 prefill\n");
  std::fclose(f);
}

TEST(StatusLine, OnATerminalTheLineIsRedrawnInPlaceBoundedAndErasedAtTheEnd) {
  FILE* f = std::tmpfile();
  {
    StatusLine p(f, /*live=*/true, "replay");
    p.Update("loading", 0, 0, std::string(500, 'x'));
    p.Note("a warning that stays");
    p.Update("step 1 kernel by kernel", 44, 44, "sampler");
  }
  const std::string out = Drain(f);
  EXPECT_EQ(out.find("\r\033[Kreplay: loading"), 0u) << out;
  const size_t end = out.find("...");
  ASSERT_NE(end, std::string::npos) << "a long line is cut";
  EXPECT_EQ(end + 3 - 4, StatusLine::kMaxWidth) << "the visible part is at most kMaxWidth";
  EXPECT_NE(out.find("\r\033[Kreplay: a warning that stays\n"), std::string::npos) << out;
  EXPECT_NE(out.find("replay: step 1 kernel by kernel  44/44  sampler"), std::string::npos) << out;
  EXPECT_EQ(out.substr(out.size() - 4), "\r\033[K") << "Finish erases the live line";
  std::fclose(f);
}

TEST(StatusLine, QuietWritesNothing) {
  FILE* f = std::tmpfile();
  {
    StatusLine p(f, true, "replay", /*quiet=*/true);
    p.Update("loading", 0, 0);
    p.Note("note");
  }
  EXPECT_EQ(Drain(f), "");
  std::fclose(f);
}

}  // namespace
TEST(StatusLine, TimeLeftIsThePaceSoFarAppliedToWhatRemains) {
  EXPECT_EQ(StatusLine::TimeLeft(10.0, 1, 4), "  ~30s left");
  EXPECT_EQ(StatusLine::TimeLeft(20.0, 100, 2600), "  ~8m 20s left");
  EXPECT_EQ(StatusLine::TimeLeft(90.0, 1, 50), "  ~1h 13m left");
  // Nothing to say: too early, nothing done yet, done, or no total.
  EXPECT_EQ(StatusLine::TimeLeft(1.9, 1, 4), "");
  EXPECT_EQ(StatusLine::TimeLeft(10.0, 0, 4), "");
  EXPECT_EQ(StatusLine::TimeLeft(10.0, 4, 4), "");
  EXPECT_EQ(StatusLine::TimeLeft(10.0, 3, 0), "");
}

}  // namespace crashreplay
