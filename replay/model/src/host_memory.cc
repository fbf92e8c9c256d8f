#include "crashreplay/replay/model/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "crashreplay/base/text.h"

namespace crashreplay::replay {
namespace {

using text::Cat;

// A number from a one-line file ("max" and absent files: UINT64_MAX).
uint64_t ReadNumber(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return UINT64_MAX;
  try {
    return std::stoull(s);
  } catch (...) {
    return UINT64_MAX;
  }
}

// The memory cgroup's limit less its usage, or UINT64_MAX.
uint64_t CgroupMemoryLeft() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::string v1, v2;
  bool have_v2 = false;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      v2 = path;
      have_v2 = true;
    }
    std::stringstream cs(controllers);
    std::string c;
    while (std::getline(cs, c, ',')) {
      if (c == "memory") v1 = path;
    }
  }
  // A cgroup namespace shows its root as "/"; the paths then start at the mount.
  auto left = [](uint64_t limit, uint64_t usage) {
    if (limit == UINT64_MAX || limit >= (1ull << 62)) return UINT64_MAX;
    if (usage == UINT64_MAX) return limit;
    return usage >= limit ? uint64_t{0} : limit - usage;
  };
  uint64_t best = UINT64_MAX;
  if (!v1.empty() || std::ifstream("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
    for (const std::string& dir : {"/sys/fs/cgroup/memory" + v1, std::string("/sys/fs/cgroup/memory")}) {
      const uint64_t l = left(ReadNumber(dir + "/memory.limit_in_bytes"), ReadNumber(dir + "/memory.usage_in_bytes"));
      best = std::min(best, l);
    }
  }
  if (have_v2) {
    for (const std::string& dir : {"/sys/fs/cgroup" + v2, std::string("/sys/fs/cgroup")}) {
      best = std::min(best, left(ReadNumber(dir + "/memory.max"), ReadNumber(dir + "/memory.current")));
    }
  }
  return best;
}

uint64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024;
  }
  return UINT64_MAX;
}

std::string Gb(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(b) / 1e9);
  return buf;
}

}  // namespace

HostMemory ReadHostMemory() {
  HostMemory h;
  struct rlimit rl;
  if (::getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    uint64_t pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const uint64_t mapped = pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    h.address_space = rl.rlim_cur > mapped ? rl.rlim_cur - mapped : 0;
  }
  const uint64_t cg = CgroupMemoryLeft();
  const uint64_t avail = MemAvailable();
  h.memory = std::min(cg, avail);
  if (h.memory != UINT64_MAX) h.memory_from = cg <= avail ? "the memory cgroup's limit" : "MemAvailable";
  return h;
}

bool ShouldStreamWeights(uint64_t checkpoint_bytes, const HostMemory& host, std::string* why) {
  const auto over = [&](uint64_t room) { return room != UINT64_MAX && checkpoint_bytes > room / 4 * 3; };
  if (over(host.address_space)) {
    *why = Cat("the checkpoint's ", Gb(checkpoint_bytes), " exceed 3/4 of the ", Gb(host.address_space),
               " of address space this process has left (ulimit -v)");
    return true;
  }
  if (over(host.memory)) {
    *why = Cat("the checkpoint's ", Gb(checkpoint_bytes), " exceed 3/4 of the ", Gb(host.memory), " free (",
               host.memory_from, ")");
    return true;
  }
  return false;
}

}  // namespace crashreplay::replay
