#include "engine/save/save_messages.h"

#include "comm/wire.h"
#include "layout/plan_part.h"

namespace shardsafe {
namespace {

void PutEntries(wire::Writer& w, const std::vector<WrittenEntry>& entries) {
  w.U64(entries.size());
  for (const auto& e : entries) {
    w.U64(e.at);
    w.U32(e.crc32c);
  }
}

Result<std::vector<WrittenEntry>> GetEntries(wire::Reader& r) {
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  std::vector<WrittenEntry> out;
  for (uint64_t i = 0; i < n; ++i) {
    WrittenEntry e;
    SS_ASSIGN_OR_RETURN(e.at, r.U64());
    SS_ASSIGN_OR_RETURN(e.crc32c, r.U32());
    out.push_back(e);
  }
  return out;
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
    w.U64(fingerprint);
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

namespace {

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

Status DecodeAgreement(std::string_view msg, Announcement* a) {
  wire::Reader r(msg);
  SS_ASSIGN_OR_RETURN(a->destination, r.Str());
  SS_ASSIGN_OR_RETURN(uint64_t nv, r.U64());
  for (uint64_t i = 0; i < nv; ++i) {
    SS_ASSIGN_OR_RETURN(std::string key, r.Str());
    SS_ASSIGN_OR_RETURN(uint64_t fingerprint, r.U64());
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

std::string EncodeReport(const RankReport& report) {
  wire::Writer w;
  w.U64(report.files.size());
  for (const WrittenFile& f : report.files) {
    w.U32(f.plan_file);
    w.U64(f.bytes);
    PutEntries(w, f.chunks);
    PutEntries(w, f.blobs);
  }
  w.U64(report.copies.size());
  for (const CopyChecksum& c : report.copies) {
    w.U32(c.chunk);
    w.U32(c.crc32c);
  }
  return w.Take();
}

void NumberAsWhole(const SavePlan& plan, RankReport* report) {
  for (WrittenFile& f : report->files) f.plan_file = WholeFileNumber(plan, f.plan_file);
  for (CopyChecksum& c : report->copies) c.chunk = WholeChunkNumber(plan, c.chunk);
}

Result<RankReport> DecodeReport(std::string_view msg) {
  wire::Reader r(msg);
  RankReport report;
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  for (uint64_t i = 0; i < n; ++i) {
    WrittenFile f;
    SS_ASSIGN_OR_RETURN(f.plan_file, r.U32());
    SS_ASSIGN_OR_RETURN(f.bytes, r.U64());
    SS_ASSIGN_OR_RETURN(f.chunks, GetEntries(r));
    SS_ASSIGN_OR_RETURN(f.blobs, GetEntries(r));
    report.files.push_back(std::move(f));
  }
  SS_ASSIGN_OR_RETURN(uint64_t nc, r.U64());
  for (uint64_t i = 0; i < nc; ++i) {
    CopyChecksum c;
    SS_ASSIGN_OR_RETURN(c.chunk, r.U32());
    SS_ASSIGN_OR_RETURN(c.crc32c, r.U32());
    report.copies.push_back(c);
  }
  return report;
}

std::string EncodeSaveDirs(const SaveDirs& dirs) {
  wire::Writer w;
  w.Str(dirs.tmp);
  w.Str(dirs.data);
  w.Str(dirs.file_suffix);
  return w.Take();
}

Result<SaveDirs> DecodeSaveDirs(std::string_view msg) {
  wire::Reader r(msg);
  SaveDirs dirs;
  SS_ASSIGN_OR_RETURN(dirs.tmp, r.Str());
  SS_ASSIGN_OR_RETURN(dirs.data, r.Str());
  SS_ASSIGN_OR_RETURN(dirs.file_suffix, r.Str());
  return dirs;
}

}  // namespace shardsafe
