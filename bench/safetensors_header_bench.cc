// safetensors_header_bench: time to open a safetensors shard and parse its
// header (SafetensorsFile::Open: map, parse, validate every tensor), by the
// number of tensors, next to the Python `safetensors` package (Rust serde)
// opening the same files, and next to the strict DOM parse the reader used
// before (json_util::ParseStrict, quadratic in the tensor count).
//
//   safetensors_header_bench [--python python3] [--old-max 8000]
//
// Prints one row per size: best of 5 runs each, in milliseconds of CPU time
// (process time on both sides, so other load on the machine counts less),
// and our wall time.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "crashreplay/formats/safetensors.h"
#include "json_util.h"

namespace {

using Clock = std::chrono::steady_clock;

// A shard of n U8 tensors named like an MoE checkpoint's, 2 bytes each.
std::string Shard(int n, std::string* header_out) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::string data;
  for (int i = 0; i < n; ++i) {
    const std::string name =
        "model.layers." + std::to_string(i / 256) + ".mlp.experts." + std::to_string(i % 256) + ".down_proj.weight";
    header += ",\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[" + std::to_string(2 * i) + "," +
              std::to_string(2 * i + 2) + "]}";
    data += "xy";
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  *header_out = header;
  std::string out(8, '\0');
  uint64_t len = header.size();
  for (int b = 0; b < 8; ++b) out[static_cast<size_t>(b)] = static_cast<char>((len >> (8 * b)) & 0xFF);
  return out + header + data;
}

double CpuMs() {
  timespec ts;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct Times {
  double cpu_ms = 1e300, wall_ms = 1e300;
};

template <typename Fn>
Times Best(int reps, Fn fn) {
  Times t;
  for (int r = 0; r < reps; ++r) {
    const auto w0 = Clock::now();
    const double c0 = CpuMs();
    fn();
    t.cpu_ms = std::min(t.cpu_ms, CpuMs() - c0);
    t.wall_ms = std::min(t.wall_ms, std::chrono::duration<double, std::milli>(Clock::now() - w0).count());
  }
  return t;
}

double PythonMs(const std::string& python, const std::string& path) {
  const std::string cmd =
      python +
      " -c \"import sys,time\nfrom safetensors import safe_open\nbest=1e9\n"
      "for _ in range(5):\n t=time.process_time()\n with safe_open(sys.argv[1],'np') as f: k=f.keys()\n"
      " best=min(best,time.process_time()-t)\nprint(best*1e3)\" " +
      path + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[64] = {0};
  const bool got = std::fgets(buf, sizeof buf, p) != nullptr;
  const int rc = ::pclose(p);
  return got && rc == 0 ? std::atof(buf) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string python = "python3";
  int old_max = 8000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--python") python = argv[i + 1];
    if (a == "--old-max") old_max = std::atoi(argv[i + 1]);
  }
  const auto dir = std::filesystem::temp_directory_path() / ("st-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::printf("%9s %11s %16s %17s %22s %18s\n", "tensors", "header MiB", "crashreplay cpu", "crashreplay wall",
              "python safetensors cpu", "old DOM parse cpu");
  for (int n : {1000, 4000, 16000, 32000, 100000}) {
    std::string header;
    const std::string bytes = Shard(n, &header);
    const std::string path = (dir / ("shard-" + std::to_string(n) + ".safetensors")).string();
    std::ofstream(path, std::ios::binary) << bytes;
    bool ok = true;
    const Times ours = Best(5, [&] {
      auto f = crashreplay::SafetensorsFile::Open(path);
      ok = ok && f.ok() && (*f)->tensors().size() == static_cast<size_t>(n);
    });
    if (!ok) {
      std::fprintf(stderr, "open failed for %d tensors\n", n);
      return 1;
    }
    const double py = PythonMs(python, path);
    std::string old = "-";
    if (n <= old_max) {
      const Times t = Best(1, [&] {
        auto j = crashreplay::json_util::ParseStrict(header, "bench", 16, absl::StatusCode::kDataLoss);
        ok = ok && j.ok();
      });
      old = std::to_string(static_cast<long long>(t.cpu_ms));
    }
    char pybuf[32];
    std::snprintf(pybuf, sizeof pybuf, "%.1f", py);
    std::printf("%9d %11.2f %16.1f %17.1f %22s %18s\n", n, header.size() / 1048576.0, ours.cpu_ms, ours.wall_ms,
                py < 0 ? "(not installed)" : pybuf, old.c_str());
  }
  std::filesystem::remove_all(dir);
  return 0;
}
