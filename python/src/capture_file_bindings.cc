// The capture reader exposed to Python: CaptureFile (one rank's file) and
// list_capture_files (a session directory's files in rank order).
//
// Everything CaptureReader checks is checked here too: the file is hostile
// input, and a damaged body is reported through summary()/verify(), not an
// exception. Opening raises only when the file cannot be read or its header
// is bad. Blob decoding releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "bindings.h"
#include "crashreplay/formats/capture_reader.h"
#include "records_to_python.h"
#include "status_bridge.h"

namespace nb = nanobind;

namespace crashreplay::python {
namespace {

class CaptureFile {
 public:
  explicit CaptureFile(const std::string& path) : reader_(ValueOrThrow(CaptureReader::Open(path))) {}

  const std::string& path() const { return reader_->path(); }
  nb::dict Summary() const { return ToPython(reader_->Summary()); }
  nb::object Manifest() const {
    if (!reader_->manifest()) return nb::none();
    return ToPython(*reader_->manifest());
  }
  template <typename T>
  static nb::list List(const std::vector<T>& items) {
    nb::list out;
    for (const T& item : items) out.append(ToPython(item));
    return out;
  }
  nb::list Steps() const { return List(reader_->steps()); }
  nb::list Snapshots() const { return List(reader_->snapshots()); }
  nb::list Failures() const { return List(reader_->failures()); }
  nb::list WeightChecks() const { return List(reader_->weight_checks()); }
  nb::list Fingerprints() const { return List(reader_->fingerprints()); }
  nb::list WeightHashes() const {
    nb::list out;
    for (const WeightHashesRecord& r : reader_->weight_hashes()) {
      for (const WeightShardHashes& s : r.shards) out.append(ToPython(s));
    }
    return out;
  }

  nb::dict Verify() const {
    VerifyResult r;
    {
      nb::gil_scoped_release release;
      r = reader_->Verify();
    }
    nb::dict d;
    d["ok"] = r.status.ok();
    d["error"] = std::string(r.status.message());
    d["bad_record"] = r.bad_record ? nb::object(nb::int_(*r.bad_record)) : nb::none();
    d["bad_offset"] = r.bad_offset;
    d["records_checked"] = r.records_checked;
    d["blobs_checked"] = r.blobs_checked;
    return d;
  }

  bool HasBlob(const std::string& hex) const { return reader_->HasBlob(ParseHash(hex)); }

  nb::bytes ReadBlob(const std::string& hex) const {
    const Hash128 h = ParseHash(hex);
    absl::StatusOr<std::vector<std::byte>> bytes;
    {
      nb::gil_scoped_release release;
      bytes = reader_->ReadBlob(h);
    }
    ThrowIfError(bytes.status());
    return nb::bytes(reinterpret_cast<const char*>(bytes->data()), bytes->size());
  }

 private:
  static Hash128 ParseHash(const std::string& hex) {
    std::optional<Hash128> h = Hash128::FromHex(hex);
    if (!h) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat("'", hex, "' is not a content hash (32 hex digits)")));
    }
    return *h;
  }

  std::unique_ptr<CaptureReader> reader_;
};

}  // namespace

void BindCaptureFile(nb::module_& m) {
  nb::class_<CaptureFile>(m, "CaptureFile",
                          "One capture file, opened read-only; every byte is checked as hostile input.")
      .def(nb::init<const std::string&>(), nb::arg("path"))
      .def_prop_ro("path", &CaptureFile::path)
      .def("summary", &CaptureFile::Summary, "Counts, steps, ranks and what (if anything) stopped the scan.")
      .def("manifest", &CaptureFile::Manifest, "The session manifest, or None when the file has none.")
      .def("steps", &CaptureFile::Steps, "Every intact step record, in file order.")
      .def("snapshots", &CaptureFile::Snapshots)
      .def("failures", &CaptureFile::Failures)
      .def("weight_checks", &CaptureFile::WeightChecks)
      .def("fingerprints", &CaptureFile::Fingerprints)
      .def("weight_hashes", &CaptureFile::WeightHashes, "Per-rank weight-shard hashes recorded after loading.")
      .def("verify", &CaptureFile::Verify, "Checks every checksum and blob; {ok, error, bad_record, ...}.")
      .def("has_blob", &CaptureFile::HasBlob, nb::arg("hash"))
      .def("read_blob", &CaptureFile::ReadBlob, nb::arg("hash"),
           "Decodes one blob by content hash (verified against the hash).");

  m.def(
      "list_capture_files", [](const std::string& path) { return ValueOrThrow(ListCaptureFiles(path)); },
      nb::arg("path"),
      "The capture files a path names: the file itself, or a session directory's rank files in order.");
}

}  // namespace crashreplay::python
