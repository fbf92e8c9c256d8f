// capture_bench: blob write throughput and compression ratio of the capture
// container on bf16-like data, next to the `zstd -1` command-line tool on
// the same bytes; XXH3-128 hashing throughput next to `xxhsum -b`.
//
//   build/bench/capture_bench [MiB=64]
//
// Data: MiB of bf16 samples of N(0, 1) (a weight or activation tensor's
// byte statistics). Single-threaded throughout, as one background writer
// thread of the recorder is. Wall-clock times, best of three runs.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <zstd.h>

#include "crashreplay/formats/blob_codec.h"
#include "crashreplay/formats/capture_encoder.h"
#include "crashreplay/formats/capture_reader.h"
#include "crashreplay/formats/capture_writer.h"
#include "crashreplay/formats/hash.h"

namespace crashreplay {
namespace {

using Clock = std::chrono::steady_clock;

double BestSeconds(int runs, const std::function<void()>& fn) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

std::vector<std::byte> Bf16Normal(size_t bytes) {
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<std::byte> out(bytes);
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits += 0x7fff + ((bits >> 16) & 1);
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(out.data() + i, &b, 2);
  }
  return out;
}

// Runs a shell command, returns its wall time and (optionally) stdout.
double RunTimed(const std::string& cmd, std::string* out = nullptr) {
  const auto t0 = Clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  std::string text;
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  const int status = ::pclose(p);
  const double t = std::chrono::duration<double>(Clock::now() - t0).count();
  if (out != nullptr) *out = text;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? t : -1;
}

void Row(const char* what, double mib, double seconds, double ratio) {
  if (seconds <= 0) {
    std::printf("  %-44s %10s\n", what, "(failed)");
    return;
  }
  if (ratio > 0) {
    std::printf("  %-44s %8.0f MiB/s   ratio %.3fx\n", what, mib / seconds, ratio);
  } else {
    std::printf("  %-44s %8.0f MiB/s\n", what, mib / seconds);
  }
}

}  // namespace
}  // namespace crashreplay

int main(int argc, char** argv) {
  using namespace crashreplay;
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const size_t bytes = mib << 20;
  std::printf("capture_bench: %zu MiB of bf16 ~ N(0,1), single thread, best of 3\n\n", mib);
  const std::vector<std::byte> data = Bf16Normal(bytes);
  const std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / ("capture_bench." + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const std::string raw_path = (tmp / "data.bf16").string();
  {
    std::ofstream f(raw_path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }

  std::printf("blob encoding (hash + [shuffle] + zstd level 1), in memory:\n");
  const Hash128 h = XXH128Of(data.data(), data.size());
  size_t shuffled_size = 0, plain_size = 0;
  BlobEncodeOptions with_shuffle;
  BlobEncodeOptions no_shuffle;
  no_shuffle.byte_plane_shuffle = false;
  const double t_shuf =
      BestSeconds(3, [&] { shuffled_size = FrameEncoder::EncodeBlob(data, 2, with_shuffle).bytes.size(); });
  const double t_plain =
      BestSeconds(3, [&] { plain_size = FrameEncoder::EncodeBlob(data, 2, no_shuffle).bytes.size(); });
  Row("capture blob, byte-plane shuffle", static_cast<double>(mib), t_shuf, static_cast<double>(bytes) / shuffled_size);
  Row("capture blob, no shuffle", static_cast<double>(mib), t_plain, static_cast<double>(bytes) / plain_size);

  // End to end through CaptureWriter (encode + write(2) to a file).
  const std::string cap_path = (tmp / "bench.crcap").string();
  CaptureWriterOptions wo;
  wo.overwrite = true;
  wo.fsync_on_close = false;
  const double t_write = BestSeconds(3, [&] {
    auto w = CaptureWriter::Create(cap_path, SessionManifest{}, wo);
    if (!w.ok() || !(*w)->AppendBlob(data, 2).ok() || !(*w)->Close().ok()) std::abort();
  });
  Row("CaptureWriter::AppendBlob + Close to a file", static_cast<double>(mib), t_write,
      static_cast<double>(bytes) / std::filesystem::file_size(cap_path));
  double t_read = BestSeconds(3, [&] {
    auto r = CaptureReader::Open(cap_path);
    if (!r.ok() || !(*r)->ReadBlob(h).ok()) std::abort();
  });
  Row("CaptureReader::ReadBlob (decode + verify)", static_cast<double>(mib), t_read, 0);

  std::printf("\nreference: the zstd command-line tool on the same bytes:\n");
  const std::string zst = (tmp / "data.zst").string();
  double t_cli = 1e30;
  for (int i = 0; i < 3; ++i) {
    const double t = RunTimed("zstd -1 -q -f -o " + zst + " " + raw_path);
    if (t > 0) t_cli = std::min(t_cli, t);
  }
  const double cli_ratio =
      std::filesystem::exists(zst) ? static_cast<double>(bytes) / std::filesystem::file_size(zst) : 0;
  Row("zstd -1 (file to file, incl. process start)", static_cast<double>(mib), t_cli < 1e29 ? t_cli : -1, cli_ratio);
  std::string zb;
  if (RunTimed("zstd -b1 -i1 " + raw_path + " 2>&1", &zb) > 0) {
    // zstd redraws its result line with \r; keep the last complete one.
    const size_t mbs = zb.rfind("MB/s");
    if (mbs != std::string::npos) {
      const size_t start = zb.find_last_of("\r\n", mbs);
      std::string line = zb.substr(start == std::string::npos ? 0 : start + 1, mbs + 4 - (start + 1));
      std::printf("  zstd -b1 (its in-memory benchmark): %s\n", line.c_str());
    }
  }

  std::printf("\nwhere the blob encoder's time goes (library calls, in memory):\n");
  std::vector<unsigned char> planes(bytes);
  const double t_shuffle = BestSeconds(
      3, [&] { ShuffleBytePlanes(reinterpret_cast<const unsigned char*>(data.data()), bytes, 2, planes.data()); });
  Row("byte-plane shuffle alone", static_cast<double>(mib), t_shuffle, 0);
  std::vector<unsigned char> zout(ZSTD_compressBound(bytes));
  size_t zsize = 0;
  const double t_z_planes =
      BestSeconds(3, [&] { zsize = ZSTD_compress(zout.data(), zout.size(), planes.data(), bytes, 1); });
  Row("ZSTD_compress level 1, shuffled planes", static_cast<double>(mib), t_z_planes,
      static_cast<double>(bytes) / zsize);
  const double t_z_plain =
      BestSeconds(3, [&] { zsize = ZSTD_compress(zout.data(), zout.size(), data.data(), bytes, 1); });
  Row("ZSTD_compress level 1, interleaved", static_cast<double>(mib), t_z_plain, static_cast<double>(bytes) / zsize);
  const size_t half = bytes / 2;
  const double t_hi =
      BestSeconds(3, [&] { zsize = ZSTD_compress(zout.data(), zout.size(), planes.data() + half, half, 1); });
  Row("ZSTD_compress level 1, high-byte plane only", static_cast<double>(mib) / 2, t_hi,
      static_cast<double>(half) / zsize);
  const double t_lo = BestSeconds(3, [&] { zsize = ZSTD_compress(zout.data(), zout.size(), planes.data(), half, 1); });
  Row("ZSTD_compress level 1, low-byte plane only", static_cast<double>(mib) / 2, t_lo,
      static_cast<double>(half) / zsize);

  std::printf("\nXXH3-128 hashing:\n");
  std::vector<std::byte> small(100 * 1024);
  std::memcpy(small.data(), data.data(), small.size());
  volatile uint64_t sink = 0;
  const int reps = 20000;
  const double t_small = BestSeconds(3, [&] {
    for (int i = 0; i < reps; ++i) sink = sink + XXH128Of(small.data(), small.size()).low;
  });
  Row("XXH128Of, 100 KB buffer (in cache)", small.size() * static_cast<double>(reps) / 1048576.0, t_small, 0);
  const double t_big = BestSeconds(3, [&] { sink = sink + XXH128Of(data.data(), data.size()).low; });
  Row("XXH128Of, whole buffer (memory-bound)", static_cast<double>(mib), t_big, 0);
  std::string xb;
  if (RunTimed("xxhsum -b11 -i3 -q 2>&1", &xb) > 0) {
    const size_t at = xb.rfind('(');
    const size_t end = xb.rfind(')');
    if (at != std::string::npos && end != std::string::npos && end > at) {
      std::printf("  %-44s %s\n", "xxhsum -b11 (XXH128, its 100 KB sample)", xb.substr(at + 1, end - at - 1).c_str());
    }
  }
  double t_xxhsum = 1e30;
  for (int i = 0; i < 3; ++i) {
    const double t = RunTimed("xxhsum -H2 " + raw_path + " >/dev/null 2>&1");
    if (t > 0) t_xxhsum = std::min(t_xxhsum, t);
  }
  Row("xxhsum -H2 FILE (incl. process start, read)", static_cast<double>(mib), t_xxhsum < 1e29 ? t_xxhsum : -1, 0);
  std::string hx;
  RunTimed("xxhsum -H2 " + raw_path + " 2>/dev/null", &hx);
  std::printf("  same hash as xxhsum -H2: %s (%s)\n", hx.rfind(h.Hex(), 0) == 0 ? "yes" : "NO", h.Hex().c_str());

  std::filesystem::remove_all(tmp);
  return 0;
}
