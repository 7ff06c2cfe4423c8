#include "engine/save/save_messages.h"

#include <algorithm>
#include <map>

#include "comm/wire.h"
#include "layout/plan_part.h"

namespace shardsafe {
namespace {

// The entries of a file as `form` says: offsets unless compact, checksums
// when `checksums`.
void PutEntries(wire::Writer& w, const std::vector<WrittenEntry>& entries, bool compact,
                bool checksums) {
  w.U64(entries.size());
  for (const auto& e : entries) {
    if (!compact) w.U64(e.at);
    if (checksums) w.Fixed32(e.crc32c);
  }
}

// Entries of one file at most (a sanity bound for a report whose entries
// carry no bytes).
constexpr uint64_t kMaxReportEntries = uint64_t{1} << 26;

Result<std::vector<WrittenEntry>> GetEntries(wire::Reader& r, bool compact, bool checksums) {
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  if (n > kMaxReportEntries) return InternalError("bad save report: too many entries");
  std::vector<WrittenEntry> out(n);
  for (WrittenEntry& e : out) {
    if (!compact) {
      SS_ASSIGN_OR_RETURN(e.at, r.U64());
    }
    if (checksums) {
      SS_ASSIGN_OR_RETURN(e.crc32c, r.Fixed32());
    }
  }
  return out;
}

// Fills `at` of each entry from `offsets`; false when the counts differ.
bool FillEntries(const std::vector<uint64_t>& offsets, std::vector<WrittenEntry>* entries) {
  if (offsets.size() != entries->size()) return false;
  for (size_t i = 0; i < offsets.size(); ++i) (*entries)[i].at = offsets[i];
  return true;
}

}  // namespace

std::string EncodeLayout(const SaveState& state) {
  wire::Writer w;
  w.U64(state.tensors.size());
  for (const TensorShard& t : state.tensors) {
    w.Str(t.key);
    w.U8(static_cast<uint8_t>(t.dtype));
    w.Shape(t.shape);
    w.Slice(t.slice);
  }
  w.U64(state.blobs.size());
  for (const BlobRef& b : state.blobs) {
    w.Str(b.name);
    w.U64(b.size);
    w.U8(b.per_rank);
  }
  return w.Take();
}

std::string EncodeAgreement(const std::string& destination,
                            const std::vector<std::pair<std::string, uint64_t>>& values) {
  wire::Writer w;
  w.Str(destination);
  w.U64(values.size());
  for (const auto& [key, fingerprint] : values) {
    w.Str(key);
    w.Fixed64(fingerprint);
  }
  return w.Take();
}

std::string EncodeHoldings(std::string_view layout, std::string_view agreement) {
  wire::Writer w;
  w.Str(layout);
  w.Str(agreement);
  return w.Take();
}

Result<std::string_view> LayoutOf(std::string_view msg) {
  wire::Reader r(msg);
  return r.View();
}

Status DecodeLayout(std::string_view msg, RankHoldings* h) {
  wire::Reader r(msg);
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  for (uint64_t i = 0; i < n; ++i) {
    ShardInfo s;
    SS_ASSIGN_OR_RETURN(s.key, r.Str());
    SS_ASSIGN_OR_RETURN(uint8_t dtype, r.U8());
    if (dtype >= kNumDTypes) return InternalError("bad dtype in message between ranks");
    s.dtype = static_cast<DType>(dtype);
    SS_ASSIGN_OR_RETURN(s.shape, r.Shape());
    SS_ASSIGN_OR_RETURN(s.slice, r.Slice());
    h->shards.push_back(std::move(s));
  }
  SS_ASSIGN_OR_RETURN(uint64_t nb, r.U64());
  for (uint64_t i = 0; i < nb; ++i) {
    BlobInfo b;
    SS_ASSIGN_OR_RETURN(b.name, r.Str());
    SS_ASSIGN_OR_RETURN(b.bytes, r.U64());
    SS_ASSIGN_OR_RETURN(uint8_t per_rank, r.U8());
    b.per_rank = per_rank != 0;
    h->blobs.push_back(std::move(b));
  }
  return Status();
}

namespace {

Status DecodeAgreement(std::string_view msg, Announcement* a) {
  wire::Reader r(msg);
  SS_ASSIGN_OR_RETURN(a->destination, r.Str());
  SS_ASSIGN_OR_RETURN(uint64_t nv, r.U64());
  for (uint64_t i = 0; i < nv; ++i) {
    SS_ASSIGN_OR_RETURN(std::string key, r.Str());
    SS_ASSIGN_OR_RETURN(uint64_t fingerprint, r.Fixed64());
    a->values.emplace_back(std::move(key), fingerprint);
  }
  return Status();
}

}  // namespace

Result<Announcement> DecodeHoldings(std::string_view msg) {
  wire::Reader r(msg);
  SS_ASSIGN_OR_RETURN(std::string_view layout, r.View());
  SS_ASSIGN_OR_RETURN(std::string_view agreement, r.View());
  Announcement a;
  SS_RETURN_IF_ERROR(DecodeLayout(layout, &a.holdings));
  SS_RETURN_IF_ERROR(DecodeAgreement(agreement, &a));
  return a;
}

Status CheckAgreement(const std::vector<Announcement>& announced) {
  const Announcement& first = announced[0];
  std::map<std::string_view, uint64_t> values(first.values.begin(), first.values.end());
  for (size_t r = 1; r < announced.size(); ++r) {
    const std::string rank = std::to_string(r);
    if (announced[r].destination != first.destination) {
      return InvalidArgumentError("ranks disagree on the checkpoint: rank 0 saves to \"" +
                                  first.destination + "\", rank " + rank + " to \"" +
                                  announced[r].destination + "\"");
    }
    for (const auto& [key, fingerprint] : announced[r].values) {
      auto it = values.find(key);
      if (it == values.end()) {
        return InvalidArgumentError("value \"" + key + "\" is passed by rank " + rank +
                                    " but not by rank 0 (global values are saved once, from "
                                    "rank 0; save values that differ by rank per rank)");
      }
      if (it->second != fingerprint) {
        return InvalidArgumentError("value \"" + key + "\" differs between ranks 0 and " + rank +
                                    " (global values are saved once, from rank 0; save values "
                                    "that differ by rank per rank)");
      }
    }
  }
  return Status();
}

namespace {

constexpr uint8_t kCompact = 1, kNoChunkChecksums = 2;

}  // namespace

std::string EncodeReport(const RankReport& report, ReportForm form) {
  wire::Writer w;
  w.U8((form.compact ? kCompact : 0) | (form.chunk_checksums ? 0 : kNoChunkChecksums));
  w.U64(report.files.size());
  for (const WrittenFile& f : report.files) {
    w.U32(f.plan_file);
    if (!form.compact) w.U64(f.bytes);
    PutEntries(w, f.chunks, form.compact, form.chunk_checksums);
    PutEntries(w, f.blobs, form.compact, /*checksums=*/true);
  }
  w.U64(report.copies.size());
  for (const CopyChecksum& c : report.copies) {
    w.U32(c.chunk);
    w.Fixed32(c.crc32c);
  }
  w.Fixed64(report.replica_digest);
  return w.Take();
}

Status AddChunkChecksums(const std::vector<WrittenFile>& from, std::vector<WrittenFile>* into) {
  if (from.empty()) return Status();
  if (from.size() != into->size()) return InternalError("save report: checksums of other files");
  for (size_t f = 0; f < from.size(); ++f) {
    WrittenFile& to = (*into)[f];
    if (from[f].plan_file != to.plan_file || from[f].chunks.size() != to.chunks.size()) {
      return InternalError("save report: checksums of other files");
    }
    for (size_t i = 0; i < to.chunks.size(); ++i) to.chunks[i].crc32c = from[f].chunks[i].crc32c;
  }
  return Status();
}

void NumberAsWhole(const SavePlan& plan, RankReport* report) {
  for (WrittenFile& f : report->files) f.plan_file = WholeFileNumber(plan, f.plan_file);
}

Result<RankReport> DecodeReport(std::string_view msg, ReportForm* form) {
  wire::Reader r(msg);
  RankReport report;
  SS_ASSIGN_OR_RETURN(uint8_t mode, r.U8());
  if ((mode & ~(kCompact | kNoChunkChecksums)) != 0) return InternalError("bad save report");
  form->compact = (mode & kCompact) != 0;
  form->chunk_checksums = (mode & kNoChunkChecksums) == 0;
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  for (uint64_t i = 0; i < n; ++i) {
    WrittenFile f;
    SS_ASSIGN_OR_RETURN(f.plan_file, r.U32());
    if (!form->compact) {
      SS_ASSIGN_OR_RETURN(f.bytes, r.U64());
    }
    SS_ASSIGN_OR_RETURN(f.chunks, GetEntries(r, form->compact, form->chunk_checksums));
    SS_ASSIGN_OR_RETURN(f.blobs, GetEntries(r, form->compact, /*checksums=*/true));
    report.files.push_back(std::move(f));
  }
  SS_ASSIGN_OR_RETURN(uint64_t nc, r.U64());
  for (uint64_t i = 0; i < nc; ++i) {
    CopyChecksum c;
    SS_ASSIGN_OR_RETURN(c.chunk, r.U32());
    SS_ASSIGN_OR_RETURN(c.crc32c, r.Fixed32());
    report.copies.push_back(c);
  }
  SS_ASSIGN_OR_RETURN(report.replica_digest, r.Fixed64());
  if (!r.done()) return InternalError("bad save report: trailing bytes");
  return report;
}

bool FileLayouts::ready() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !files_.empty();
}

bool FileLayouts::Keep(const SavePlan& plan, const std::vector<RankReport>& reports) {
  if (ready()) return false;
  std::vector<Layout> files(plan.files.size());
  std::vector<bool> seen(plan.files.size(), false);
  for (const RankReport& report : reports) {
    for (const WrittenFile& f : report.files) {
      if (f.plan_file >= files.size() || seen[f.plan_file]) return false;
      seen[f.plan_file] = true;
      Layout& l = files[f.plan_file];
      l.bytes = f.bytes;
      for (const WrittenEntry& e : f.chunks) l.chunks.push_back(e.at);
      for (const WrittenEntry& e : f.blobs) l.blobs.push_back(e.at);
    }
  }
  if (files.empty() || std::find(seen.begin(), seen.end(), false) != seen.end()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!files_.empty()) return false;
  files_ = std::move(files);
  return true;
}

void FileLayouts::Forget() {
  std::lock_guard<std::mutex> lock(mu_);
  files_.clear();
  table_.reset();
}

std::shared_ptr<const EncodedChunkTable> FileLayouts::table() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

void FileLayouts::KeepTable(std::shared_ptr<const EncodedChunkTable> table) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!files_.empty()) table_ = std::move(table);
}

Status FileLayouts::Fill(std::vector<WrittenFile>* files) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (WrittenFile& f : *files) {
    if (f.plan_file >= files_.size()) {
      return InternalError(files_.empty() ? "compact save report without layouts"
                                          : "compact save report names a file the plan lacks");
    }
    const Layout& l = files_[f.plan_file];
    if (!FillEntries(l.chunks, &f.chunks) || !FillEntries(l.blobs, &f.blobs)) {
      return InternalError("save report does not match the plan");
    }
    f.bytes = l.bytes;
  }
  return Status();
}

std::string EncodeSaveStart(const SaveStart& start) {
  wire::Writer w;
  w.Str(start.dirs.tmp);
  w.Str(start.dirs.data);
  w.Str(start.dirs.file_suffix);
  w.U8(start.compact_reports ? 1 : 0);
  w.U8(start.chunk_table ? 1 : 0);
  return w.Take();
}

Result<SaveStart> DecodeSaveStart(std::string_view msg) {
  wire::Reader r(msg);
  SaveStart start;
  SS_ASSIGN_OR_RETURN(start.dirs.tmp, r.Str());
  SS_ASSIGN_OR_RETURN(start.dirs.data, r.Str());
  SS_ASSIGN_OR_RETURN(start.dirs.file_suffix, r.Str());
  SS_ASSIGN_OR_RETURN(uint8_t compact, r.U8());
  start.compact_reports = compact == 1;
  SS_ASSIGN_OR_RETURN(uint8_t table, r.U8());
  start.chunk_table = table == 1;
  return start;
}

bool DigestsAddUp(const std::vector<RankReport>& reports) {
  uint64_t sum = 0;
  for (const RankReport& report : reports) sum += report.replica_digest;
  return sum == 0;
}

std::vector<std::vector<WrittenFile>> FilesByRank(std::vector<RankReport> reports) {
  std::vector<std::vector<WrittenFile>> by_rank(reports.size());
  for (size_t r = 0; r < reports.size(); ++r) by_rank[r] = std::move(reports[r].files);
  return by_rank;
}

}  // namespace shardsafe
