// The dump as text (`crashreplay coredump`): the faults first, one line
// each, then what the dump says about itself and what it leaves out.
#include <ctime>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "crashreplay/formats/coredump/coredump.h"
#include "elf_reader.h"

namespace crashreplay::coredump {
namespace {

std::string Dims(const Dim3& d) { return absl::StrFormat("(%d,%d,%d)", d.x, d.y, d.z); }

// "in `f(int)` +0x1a40", or "at 0x7f00 (function unknown: why)".
std::string Where(const Location& loc) {
  if (loc.function.has_value()) {
    return absl::StrFormat("in `%s` +0x%x", Printable(loc.function->demangled), loc.function->offset);
  }
  return absl::StrFormat("at 0x%x (function unknown: %s)", loc.pc, loc.why_unknown);
}

std::string LaneList(const std::vector<FaultingLane>& lanes) {
  uint64_t mask = 0;
  bool all_below_64 = true;
  for (const FaultingLane& l : lanes) {
    if (l.lane < 64) {
      mask |= uint64_t{1} << l.lane;
    } else {
      all_below_64 = false;
    }
  }
  if (all_below_64) return absl::StrFormat("%d lanes faulted (mask 0x%x)", lanes.size(), mask);
  return absl::StrFormat("%d lanes faulted", lanes.size());
}

std::string FaultLine(const Coredump& dump, const Fault& f) {
  std::string head = absl::StrFormat("device %d SM %d", f.device_id, f.sm);
  if (!f.warp.has_value()) {
    // An SM-level report.
    std::string line = absl::StrFormat("%s: %s reported by the SM; no warp in the dump carries it (its warps exited)",
                                       head, ExceptionName(f.exception));
    if (const Location* loc = dump.LocationOf(f)) line += ", error PC " + Where(*loc);
    return line;
  }
  head += absl::StrFormat(" warp %d", *f.warp);
  if (!f.lanes.empty()) head += absl::StrFormat(" lane %d", f.lanes[0].lane);
  std::string what = f.exception != 0 ? ExceptionName(f.exception) : "no exception recorded (the error PC is valid)";
  std::string line = head + ": " + what;
  const Location* loc = dump.LocationOf(f);
  switch (f.pc_source) {
    case PcSource::kWarp:
    case PcSource::kSm: line += " " + Where(*loc); break;
    case PcSource::kLane:
      line += absl::StrFormat(", error PC not valid in the dump; lane %d's PC is %s", f.lanes[0].lane, Where(*loc));
      break;
    case PcSource::kNone: line += ", no PC in the dump"; break;
  }
  if (f.block.has_value()) line += ", block " + Dims(*f.block);
  if (!f.lanes.empty()) line += " thread " + Dims(f.lanes[0].thread);
  if (f.grid_id.has_value()) {
    if (const Grid* g = dump.GridOf(f)) {
      line += absl::StrFormat(", grid %d dims %s%s", g->id, Dims(g->grid_dim), Dims(g->block_dim));
    } else {
      line += absl::StrFormat(", grid %d (not in the dump's grid tables)", *f.grid_id);
    }
  }
  if (!f.lanes_read) {
    line += "; the dump has no lane table for this warp (lanes and threads unknown)";
  } else if (f.lanes.size() > 1) {
    line += "; " + LaneList(f.lanes);
  }
  return line;
}

std::string Utc(uint32_t seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return absl::StrFormat("%d s after the epoch", seconds);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

std::vector<std::string> SummaryLines(const Coredump& dump) {
  std::vector<std::string> out;
  for (const Fault& f : dump.faults) out.push_back(FaultLine(dump, f));
  if (dump.faults.empty()) out.push_back("no faulting warp or SM in this dump");
  if (dump.meta.has_value()) {
    const Meta& m = *dump.meta;
    out.push_back(absl::StrFormat(
        "driver %d.%d, CUDA %d.%d (the driver's API version; the toolkit the program was built with is not "
        "recorded), written by '%s' at %s",
        m.driver_major, m.driver_minor, m.cuda_major, m.cuda_minor, Printable(m.generator), Utc(m.timestamp)));
  } else {
    out.push_back("driver and CUDA versions: not recorded (no metadata section: drivers before r565 write none)");
  }
  for (const Device& d : dump.devices) {
    out.push_back(absl::StrFormat("device %d (row %d): %s, %s (sm %d.%d), %d SMs, %d warps per SM", d.id, d.index,
                                  Printable(d.name), Printable(d.sm_type), d.sm_major, d.sm_minor, d.num_sms,
                                  d.warps_per_sm));
  }
  const Contents& c = dump.contents;
  if (dump.meta.has_value()) {
    if (dump.left_out.empty()) {
      out.push_back(absl::StrFormat("generation flags 0x%x: nothing left out", dump.meta->flags));
    } else {
      out.push_back(absl::StrFormat("left out by the generation flags 0x%x: %s", dump.meta->flags,
                                    absl::StrJoin(dump.left_out, ", ")));
    }
  } else {
    out.push_back("generation flags: not recorded");
  }
  const uint64_t memory = c.global_memory + c.managed_memory + c.shared_memory + c.local_memory + c.param_memory;
  if (memory == 0) {
    out.push_back(
        "the dump holds no memory (no global, shared, local or parameter memory sections): memory values "
        "at the fault cannot be read from it");
  } else {
    out.push_back(absl::StrFormat("memory sections: %d global, %d managed, %d shared, %d local, %d parameter",
                                  c.global_memory, c.managed_memory, c.shared_memory, c.local_memory, c.param_memory));
  }
  for (const std::string& n : dump.notes) out.push_back("note: " + n);
  return out;
}

}  // namespace crashreplay::coredump
