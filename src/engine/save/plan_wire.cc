#include "engine/save/plan_wire.h"

#include "comm/wire.h"

namespace shardsafe {
namespace {

Status Bad(const std::string& what) {
  return InternalError("bad save plan from rank 0: " + what);
}

void PutNumbers(wire::Writer& w, const std::vector<uint32_t>& v) {
  w.U64(v.size());
  for (uint32_t x : v) w.U32(x);
}

// Numbers each below `limit`.
Result<std::vector<uint32_t>> GetNumbers(wire::Reader& r, uint64_t limit) {
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  std::vector<uint32_t> v;
  for (uint64_t i = 0; i < n; ++i) {
    SS_ASSIGN_OR_RETURN(uint32_t x, r.U32());
    if (x >= limit) return Bad("a number out of range");
    v.push_back(x);
  }
  return v;
}

// Numbers as differences from the one before (zigzag varints): a part's
// whole-plan file numbers are consecutive, and its chunks' lie closer to
// each other than to 0 (a rank writes pieces of the tensors of its own
// mesh coordinates), so a difference takes fewer bytes than the number.
void PutRising(wire::Writer& w, const std::vector<uint32_t>& v) {
  w.U64(v.size());
  int64_t last = 0;
  for (uint32_t x : v) {
    const int64_t d = int64_t{x} - last;
    w.U64(static_cast<uint64_t>(d) << 1 ^ static_cast<uint64_t>(d >> 63));
    last = x;
  }
}

Result<std::vector<uint32_t>> GetRising(wire::Reader& r) {
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  std::vector<uint32_t> v;
  int64_t last = 0;
  for (uint64_t i = 0; i < n; ++i) {
    SS_ASSIGN_OR_RETURN(uint64_t z, r.U64());
    const int64_t x = last + static_cast<int64_t>(z >> 1 ^ (~(z & 1) + 1));
    if (x < 0 || x > int64_t{UINT32_MAX}) return Bad("a number out of range");
    v.push_back(static_cast<uint32_t>(x));
    last = x;
  }
  return v;
}

void PutTensors(wire::Writer& w, const std::vector<PlannedTensor>& tensors) {
  w.U64(tensors.size());
  for (const PlannedTensor& t : tensors) {
    w.Str(t.key);
    w.U8(static_cast<uint8_t>(t.dtype));
    w.Shape(t.shape);
    PutNumbers(w, t.chunks);
  }
}

void PutChunks(wire::Writer& w, const std::vector<PlannedChunk>& chunks) {
  w.U64(chunks.size());
  for (const PlannedChunk& c : chunks) {
    w.U32(c.tensor);
    w.Slice(c.slice);
    w.U64(c.bytes);
    w.U32(static_cast<uint32_t>(c.writer));
    w.U32(c.writer_shard);
    w.U64(c.shard_offset);
    w.U32(c.holders);
  }
}

void PutBlobsFilesCopies(wire::Writer& w, const SavePlan& p) {
  w.U64(p.blobs.size());
  for (const PlannedBlob& b : p.blobs) {
    w.Str(b.name);
    w.U8(b.per_rank);
    w.U32(static_cast<uint32_t>(b.rank));
    w.U32(b.writer_blob);
    w.U64(b.bytes);
  }
  w.U64(p.files.size());
  for (const PlannedFile& f : p.files) {
    w.U32(static_cast<uint32_t>(f.rank));
    w.U32(f.number);
    PutNumbers(w, f.chunks);
    PutNumbers(w, f.blobs);
    w.U64(f.payload_bytes);
  }
  // A part's copies name whole-plan chunks it does not hold: their
  // shapes say how large they and their pieces are.
  w.U64(p.copies.size());
  for (size_t i = 0; i < p.copies.size(); ++i) {
    const HeldCopy& h = p.copies[i];
    w.U32(static_cast<uint32_t>(h.rank));
    w.U32(h.shard);
    w.U32(h.chunk);
    w.U32(h.chunks);
    w.U64(p.part->copy_shapes[i].bytes);
    w.U64(p.part->copy_shapes[i].piece_bytes);
  }
}

Status GetTensors(wire::Reader& r, SavePlan& p) {
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  for (uint64_t i = 0; i < n; ++i) {
    PlannedTensor t;
    SS_ASSIGN_OR_RETURN(t.key, r.Str());
    SS_ASSIGN_OR_RETURN(uint8_t dtype, r.U8());
    if (dtype >= kNumDTypes) return Bad("a dtype out of range");
    t.dtype = static_cast<DType>(dtype);
    SS_ASSIGN_OR_RETURN(t.shape, r.Shape());
    SS_ASSIGN_OR_RETURN(t.chunks, GetNumbers(r, UINT32_MAX));
    p.tensors.push_back(std::move(t));
  }
  return Status();
}

Status GetChunks(wire::Reader& r, SavePlan& p) {
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  for (uint64_t i = 0; i < n; ++i) {
    PlannedChunk c;
    SS_ASSIGN_OR_RETURN(c.tensor, r.U32());
    if (c.tensor >= p.tensors.size()) return Bad("a chunk of no tensor");
    SS_ASSIGN_OR_RETURN(c.slice, r.Slice());
    SS_ASSIGN_OR_RETURN(c.bytes, r.U64());
    SS_ASSIGN_OR_RETURN(uint32_t writer, r.U32());
    c.writer = static_cast<int>(writer);
    SS_ASSIGN_OR_RETURN(c.writer_shard, r.U32());
    SS_ASSIGN_OR_RETURN(c.shard_offset, r.U64());
    SS_ASSIGN_OR_RETURN(c.holders, r.U32());
    p.chunks.push_back(std::move(c));
  }
  for (const PlannedTensor& t : p.tensors) {
    for (uint32_t c : t.chunks) {
      if (c >= p.chunks.size()) return Bad("a tensor's chunk out of range");
    }
  }
  return Status();
}

Status GetBlobsFilesCopies(wire::Reader& r, SavePlan& p, std::vector<CopyShape>* shapes) {
  SS_ASSIGN_OR_RETURN(uint64_t nb, r.U64());
  for (uint64_t i = 0; i < nb; ++i) {
    PlannedBlob b;
    SS_ASSIGN_OR_RETURN(b.name, r.Str());
    SS_ASSIGN_OR_RETURN(uint8_t per_rank, r.U8());
    b.per_rank = per_rank != 0;
    SS_ASSIGN_OR_RETURN(uint32_t rank, r.U32());
    b.rank = static_cast<int>(rank);
    SS_ASSIGN_OR_RETURN(b.writer_blob, r.U32());
    SS_ASSIGN_OR_RETURN(b.bytes, r.U64());
    p.blobs.push_back(std::move(b));
  }
  SS_ASSIGN_OR_RETURN(uint64_t nf, r.U64());
  for (uint64_t i = 0; i < nf; ++i) {
    PlannedFile f;
    SS_ASSIGN_OR_RETURN(uint32_t rank, r.U32());
    f.rank = static_cast<int>(rank);
    SS_ASSIGN_OR_RETURN(f.number, r.U32());
    SS_ASSIGN_OR_RETURN(f.chunks, GetNumbers(r, p.chunks.size()));
    SS_ASSIGN_OR_RETURN(f.blobs, GetNumbers(r, p.blobs.size()));
    SS_ASSIGN_OR_RETURN(f.payload_bytes, r.U64());
    p.files.push_back(std::move(f));
  }
  SS_ASSIGN_OR_RETURN(uint64_t nc, r.U64());
  for (uint64_t i = 0; i < nc; ++i) {
    HeldCopy h;
    SS_ASSIGN_OR_RETURN(uint32_t rank, r.U32());
    h.rank = static_cast<int>(rank);
    SS_ASSIGN_OR_RETURN(h.shard, r.U32());
    SS_ASSIGN_OR_RETURN(h.chunk, r.U32());
    SS_ASSIGN_OR_RETURN(h.chunks, r.U32());
    CopyShape shape;
    SS_ASSIGN_OR_RETURN(shape.bytes, r.U64());
    SS_ASSIGN_OR_RETURN(shape.piece_bytes, r.U64());
    // Pieces of piece_bytes but the last, which holds the rest (1 to
    // piece_bytes of it; an empty copy is one empty piece).
    const uint64_t before = (h.chunks - 1) * shape.piece_bytes;
    const bool fits = h.chunks >= 1 && uint64_t{h.chunk} + h.chunks <= UINT32_MAX &&
                      (h.chunks == 1 ? shape.bytes == shape.piece_bytes
                                     : before / (h.chunks - 1) == shape.piece_bytes &&
                                           shape.bytes > before &&
                                           shape.bytes - before <= shape.piece_bytes);
    if (!fits) return Bad("a copy's pieces do not add up");
    p.copies.push_back(h);
    shapes->push_back(shape);
  }
  return Status();
}

}  // namespace

std::string EncodePlanMessage(const SavePlan& part, const Digest& digest) {
  wire::Writer w;
  w.Fixed64(digest[0]);
  w.Fixed64(digest[1]);
  PutTensors(w, part.tensors);
  PutChunks(w, part.chunks);
  PutBlobsFilesCopies(w, part);
  w.U64(part.unique_bytes);
  const PlanPartInfo& info = *part.part;
  PutRising(w, info.files);
  PutRising(w, info.chunks);
  for (uint64_t v : {info.rank_bytes, info.max_rank_bytes, info.whole_files, info.held_bytes}) {
    w.U64(v);
  }
  return w.Take();
}

Result<PlanMessage> DecodePlanMessage(std::string_view msg) {
  wire::Reader r(msg);
  PlanMessage m;
  SavePlan& p = m.plan;
  SS_ASSIGN_OR_RETURN(m.digest[0], r.Fixed64());
  SS_ASSIGN_OR_RETURN(m.digest[1], r.Fixed64());
  SS_RETURN_IF_ERROR(GetTensors(r, p));
  SS_RETURN_IF_ERROR(GetChunks(r, p));
  std::vector<CopyShape> shapes;
  SS_RETURN_IF_ERROR(GetBlobsFilesCopies(r, p, &shapes));
  SS_ASSIGN_OR_RETURN(p.unique_bytes, r.U64());
  PlanPartInfo& info = p.part.emplace();
  info.copy_shapes = std::move(shapes);
  SS_ASSIGN_OR_RETURN(info.files, GetRising(r));
  SS_ASSIGN_OR_RETURN(info.chunks, GetRising(r));
  for (uint64_t* v : {&info.rank_bytes, &info.max_rank_bytes, &info.whole_files,
                      &info.held_bytes}) {
    SS_ASSIGN_OR_RETURN(*v, r.U64());
  }
  if (info.files.size() != p.files.size() || info.chunks.size() != p.chunks.size()) {
    return Bad("whole-plan numbers do not match the part");
  }
  if (!r.done()) return Bad("trailing bytes");
  return m;
}

}  // namespace shardsafe
