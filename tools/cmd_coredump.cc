// `crashreplay coredump FILE [--json]`: what a CUDA GPU core dump says
// about the fault (formats/coredump): the faulting device, SM, warp and
// lanes, the exception, the error PC and the function it falls in, the
// grid and block, the driver's versions, and what the dump leaves out.
// Exit 0 when the dump was read (with or without a fault in it), 3 when it
// cannot be read (not a CUDA core dump, corrupt, truncated inside a table),
// 2 on a bad command line.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "command.h"
#include "commands_decl.h"
#include "crashreplay/formats/coredump/coredump.h"
#include "exit_codes.h"

namespace crashreplay::tools {
namespace {

namespace cd = crashreplay::coredump;
using nlohmann::json;

// Addresses as hex strings: JSON numbers lose bits past 2^53 in most readers.
std::string Hex(uint64_t v) { return absl::StrFormat("0x%x", v); }
json Dims(const cd::Dim3& d) { return json::array({d.x, d.y, d.z}); }

json LocationJson(const cd::Location& loc) {
  json j = {{"pc", Hex(loc.pc)}};
  if (loc.function.has_value()) {
    const cd::Function& f = *loc.function;
    j["function"] = {{"name", f.name}, {"demangled", f.demangled}, {"start", Hex(f.start)},
                     {"size", f.size}, {"offset", Hex(f.offset)},  {"module", Hex(f.module_handle)}};
  } else {
    j["function"] = nullptr;
    j["why_unknown"] = loc.why_unknown;
  }
  return j;
}

json GridJson(const cd::Grid& g) {
  json j = {{"id", g.id},
            {"device_row", g.device_index},
            {"context", Hex(g.context)},
            {"function_entry", Hex(g.function_entry)},
            {"module", Hex(g.module_handle)},
            {"grid_dim", Dims(g.grid_dim)},
            {"block_dim", Dims(g.block_dim)}};
  j["cluster_dim"] = g.cluster_dim.has_value() ? Dims(*g.cluster_dim) : json(nullptr);
  return j;
}

json FaultJson(const cd::Coredump& dump, const cd::Fault& f) {
  json j = {{"device", f.device_id},
            {"device_row", f.device_index},
            {"sm", f.sm},
            {"exception", {{"code", f.exception}, {"name", cd::ExceptionName(f.exception)}}},
            {"pc_source", cd::PcSourceName(f.pc_source)}};
  j["warp"] = f.warp.has_value() ? json(*f.warp) : json(nullptr);
  j["error_pc"] = f.error_pc.has_value() ? json(Hex(*f.error_pc)) : json(nullptr);
  const cd::Location* loc = dump.LocationOf(f);
  j["location"] = loc != nullptr ? LocationJson(*loc) : json(nullptr);
  j["block"] = f.block.has_value() ? Dims(*f.block) : json(nullptr);
  j["grid_id"] = f.grid_id.has_value() ? json(*f.grid_id) : json(nullptr);
  const cd::Grid* g = dump.GridOf(f);
  j["grid"] = g != nullptr ? GridJson(*g) : json(nullptr);
  if (f.warp.has_value()) {
    j["valid_lanes"] = Hex(f.valid_lanes);
    j["active_lanes"] = Hex(f.active_lanes);
    j["lanes_read"] = f.lanes_read;
    json lanes = json::array();
    for (const cd::FaultingLane& l : f.lanes) {
      lanes.push_back({{"lane", l.lane},
                       {"thread", Dims(l.thread)},
                       {"exception", {{"code", l.exception}, {"name", cd::ExceptionName(l.exception)}}},
                       {"pc", Hex(l.pc)}});
    }
    j["faulting_lanes"] = std::move(lanes);
  }
  return j;
}

json DumpJson(const std::string& path, const cd::Coredump& dump) {
  json j = {{"file", path}, {"bytes", dump.file_bytes}};
  if (dump.meta.has_value()) {
    const cd::Meta& m = *dump.meta;
    j["meta"] = {{"generator", m.generator},
                 {"driver_version", absl::StrFormat("%d.%d", m.driver_major, m.driver_minor)},
                 {"cuda_driver_api_version", absl::StrFormat("%d.%d", m.cuda_major, m.cuda_minor)},
                 {"flags", m.flags},
                 {"timestamp", m.timestamp}};
    j["left_out"] = dump.left_out;
  } else {
    j["meta"] = nullptr;
    j["left_out"] = nullptr;  // not recorded
  }
  j["devices"] = json::array();
  for (const cd::Device& d : dump.devices) {
    j["devices"].push_back({{"id", d.id},
                            {"row", d.index},
                            {"name", d.name},
                            {"type", d.type},
                            {"sm_type", d.sm_type},
                            {"sm", absl::StrFormat("%d.%d", d.sm_major, d.sm_minor)},
                            {"sms", d.num_sms},
                            {"warps_per_sm", d.warps_per_sm},
                            {"lanes_per_warp", d.lanes_per_warp}});
  }
  j["faults"] = json::array();
  for (const cd::Fault& f : dump.faults) j["faults"].push_back(FaultJson(dump, f));
  const cd::Contents& c = dump.contents;
  j["contents"] = {{"sections", c.sections},
                   {"devices", c.devices},
                   {"contexts", c.contexts},
                   {"modules", c.modules},
                   {"grids", c.grids},
                   {"sms", c.sms},
                   {"ctas", c.ctas},
                   {"warps", c.warps},
                   {"lanes", c.lanes},
                   {"relocated_images", c.relocated_images},
                   {"unrelocated_images", c.unrelocated_images},
                   {"global_memory", c.global_memory},
                   {"managed_memory", c.managed_memory},
                   {"shared_memory", c.shared_memory},
                   {"local_memory", c.local_memory},
                   {"param_memory", c.param_memory},
                   {"registers", c.registers},
                   {"predicates", c.predicates},
                   {"backtraces", c.backtraces},
                   {"const_bank_tables", c.const_bank_tables}};
  j["notes"] = dump.notes;
  return j;
}

}  // namespace

int RunCoredump(int argc, char** argv) {
  CLI::App app(
      "Read a CUDA GPU core dump (CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1): the faulting device, SM, warp and lanes,\n"
      "the exception, the error PC and its function, grid and block, the driver's versions and what the dump\n"
      "leaves out. Exit 0 when read, 3 when the file is not a readable CUDA core dump.",
      "coredump");
  std::string path;
  bool as_json = false;
  app.add_option("FILE", path, "a CUDA core dump (ELF, EM_CUDA, ET_CORE)")->required();
  app.add_flag("--json", as_json, "print the dump as JSON");
  if (auto rc = ParseArgs(app, argc, argv)) return *rc;

  absl::StatusOr<cd::Coredump> dump = cd::ReadCoredumpFile(path);
  if (!dump.ok()) {
    // Every reason a dump cannot be read is about the file: exit 3, never 2.
    std::fprintf(stderr, "crashreplay coredump: %s\n", std::string(dump.status().message()).c_str());
    return kExitDataError;
  }
  if (as_json) {
    // Strings come from the file: invalid UTF-8 is replaced, not thrown on.
    std::printf("%s\n", DumpJson(path, *dump).dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return kExitOk;
  }
  std::printf("%s: CUDA core dump, %llu bytes\n", path.c_str(), static_cast<unsigned long long>(dump->file_bytes));
  for (const std::string& line : cd::SummaryLines(*dump)) std::printf("%s\n", line.c_str());
  return kExitOk;
}

}  // namespace crashreplay::tools
