// ParseIndex: reads shardsafe.json from untrusted bytes (docs/format.md §3,
// "Validation on read").
//
// One pass over the text, after a byte pre-check for what the JSON grammar
// leaves to the reader (a leading BOM, which nlohmann would skip; NUL, named
// at its offset). nlohmann::json's SAX parser streams the text through
// IndexSax (format/index_sax.h), which checks syntax, nesting and repeated
// keys in every object and hands over each object of the index as it ends.
// IndexBuilder turns it into its struct there with the checks of
// format/index_objects.h; every failure says where it is ("tensor "a":
// chunk 3: field "at": ..."). Geometry is checked per chunk (ValidateSlice,
// byte count, byte range in its file), then across chunks: no two (of
// tensors or blobs) share a byte of a file. Whether a tensor's chunks tile
// it is left to the engine.
//
// Memory: what is kept and the object being read. No tree of the document
// is built; `values`, `layout` and `metadata` (user JSON, passed on by the
// engine without looking inside) are built alone as nlohmann::json and kept
// as their compact text (nlohmann's dump, which is the writer's canonical
// form). A tensor's chunks are gathered in a reused buffer and given to it
// at their exact count: into IndexTensors (~430 bytes a tensor of one
// chunk, ~170 a chunk), or, for the read paths, into a PackedTensors
// (format/index_packed.h; a tensor is held as IndexTensor only until its
// chunks are checked, then packed). The text may come a piece at a time
// (format/index_text.h), so that it is never held whole.
//
// Repeated tensor keys, packed: the keys come sorted from our writer, so
// only the last is kept to compare; the first key out of order switches to
// a set of every key seen (an index from another writer).
//
// Field order: a chunk's checks need its tensor's dtype and shape and the
// files (whose ranks need world_size). In the writer's order those come
// first, and each chunk is checked whole as it ends. Where the text has
// them later, what the chunk alone decides is checked as it ends and the
// chunk is held as read (a ChunkRead: the size of a chunk in the index)
// until the rest can be (at the end of its tensor, or of the document).
//
// Which error an index with several faults reports: a JSON syntax or
// nesting error, else the first repeated key, else the first failure in
// the order the document's top-level fields are checked (format and
// version first: a newer version may change everything after them; then
// tag, created_unix, world_size, layout, metadata, files, tensors, values,
// blobs), and within one of those the first found as the text is read.
// Within a chunk, its own fields' errors come before those of its geometry
// and byte range.
//
// Stricter than the list in the document, because the engine relies on it:
// file names must be unique, file and blob ranks must be < world_size, a
// global blob has exactly one chunk and a per-rank blob one per rank at
// most, a tensor's element count must fit in 64 bits, and JSON nesting is
// limited to 256 levels (deeper input would make later recursive walks of
// `values` or `metadata` overflow the stack).
#include <algorithm>
#include <array>
#include <climits>
#include <memory>
#include <optional>
#include <set>
#include <unordered_set>

#include "format/index.h"
#include "format/index_objects.h"
#include "format/index_packed.h"
#include "format/index_sax.h"
#include "format/index_text.h"

namespace shardsafe {
namespace {

using namespace internal;  // NOLINT: the reader's own parts
using Kind = FieldValue::Kind;

// --- Building the index ------------------------------------------------------------

// What errors are ranked by: the order in which the document's checks read
// the top-level fields.
enum Stage { kStageVersion, kStageTag, kStageCreated, kStageWorld, kStageLayout, kStageMetadata,
             kStageFiles, kStageTensors, kStageValues, kStageBlobs, kStages };

enum class State : uint8_t { kPending, kReady, kFailed };

// A tensor read into a PackedTensors: held here, under its key, until its
// chunks are checked (at its end, or at the end of the document).
struct Unpacked {
  std::string key;
  IndexTensor tensor;
  bool keep = false;  // false: a repeated key's, dropped
};

// A tensor or blob being read, or one whose chunks wait for the files.
template <typename T, typename Read>
struct Owner {
  Owner() = default;
  // `name`: its key in the index (outlives this).
  Owner(T* target, Stage stage, const char* kind, const std::string& name)
      : target(target), stage(stage), where(kind, name) {}
  // A tensor of a packed index, held by `own` until it is packed.
  Owner(std::unique_ptr<Unpacked> own, Stage stage, const char* kind)
      : target(&own->tensor), stage(stage), where(kind, own->key), own(std::move(own)) {}
  bool Ready(State files) const { return header == State::kReady && files == State::kReady; }
  bool Failed(State files) const { return header == State::kFailed || files == State::kFailed; }

  T* target = nullptr;
  Stage stage = kStageTensors;     // its errors'
  Where where = "";                // `tensor "k"` or `blob "b"`
  State header = State::kPending;  // dtype and shape, or per_rank
  std::vector<Read> held;          // chunks read before they could be checked
  std::unique_ptr<Unpacked> own;   // a packed index's tensor
};
using TensorOwner = Owner<IndexTensor, ChunkRead>;
using BlobOwner = Owner<IndexBlob, BlobChunkRead>;

// Keys seen in the tensors of a packed index, to find one given twice:
// the last one while they come in order (as our writer writes them), all
// of them once one does not.
class SeenKeys {
 public:
  // Whether `key` is new (then it is seen); `all` lists every key seen so
  // far, called once, when the keys first come out of order.
  template <typename All>
  bool Insert(std::string_view key, All all) {
    if (ordered_ && (first_ || last_ < key)) {
      first_ = false;
      last_.assign(key);
      return true;
    }
    if (ordered_ && last_ == key) return false;
    if (ordered_) {
      ordered_ = false;
      all([&](std::string_view k) { set_.emplace(k); });
    }
    return set_.emplace(key).second;
  }

 private:
  bool first_ = true;
  bool ordered_ = true;
  std::string last_;
  std::unordered_set<std::string> set_;
};

class IndexBuilder final : public IndexListener {
 public:
  // `packed`: where the tensors go (the index returned has none), or null.
  explicit IndexBuilder(PackedTensors* packed = nullptr) : packed_(packed) {}

  // Parses the text from `first` to `last` (char iterators).
  template <typename It>
  Result<CheckpointIndex> Read(It first, It last);

  bool Name(int kind, std::string_view name) override;
  void End(int kind, size_t index, std::vector<FieldValue>& fields) override;
  void NotAnObject(int kind, size_t index, const FieldValue& value) override;
  void EndObjects(int kind) override;

 private:
  void Fail(Stage stage, Status status) {
    if (errors_[stage].ok()) errors_[stage] = std::move(status);
  }
  void EndRoot(std::vector<FieldValue>& fields);

  std::optional<int> WorldSize();
  void EndFile(size_t index, std::vector<FieldValue>& fields);
  void CheckFiles(bool last_chance);
  void FailFiles(Status status);

  // A chunk of `owner` was read (or failed to be): checked now if its
  // owner's header and the files are known, else held.
  template <typename O, typename R>
  void Chunk(O& owner, Result<R> read);
  // `owner` ended (`chunks`: its chunks field's check): its chunks are
  // checked now, or at the end of the document if the files come later.
  template <typename O>
  void EndOwner(O& owner, const Status& chunks, std::vector<O>& waiting);

  void CheckTensorHeader(bool at_end);
  void EndChunk(size_t index, std::vector<FieldValue>& fields);
  void Add(const TensorOwner& t, ChunkRead& read);
  void EndTensor(std::vector<FieldValue>& fields);
  void Finish(TensorOwner& t);

  void CheckBlobHeader(bool at_end);
  void EndBlobChunk(size_t index, std::vector<FieldValue>& fields);
  void Add(const BlobOwner& b, const BlobChunkRead& read);
  void EndBlob(std::vector<FieldValue>& fields);
  void Finish(BlobOwner& b);

  bool NameTensor(std::string_view name);
  bool NamePackedTensor(std::string_view name);

  IndexSax sax_{kIndexSchema, this};
  PackedTensors* packed_;
  SeenKeys seen_;  // a packed index's keys
  std::vector<std::string> failed_keys_;  // of its tensors that failed
  CheckpointIndex index_;
  std::array<Status, kStages> errors_;
  std::set<std::string> file_names_;
  std::vector<uint64_t> file_ranks_;  // as read; checked up to ranks_checked_
  size_t ranks_checked_ = 0;
  bool files_ended_ = false;
  State files_ = State::kPending;
  TensorOwner tensor_;
  IndexTensor spare_tensor_;        // the target of a repeated name
  std::vector<IndexChunk> chunks_;  // the tensor's, checked (reused)
  std::vector<TensorOwner> waiting_tensors_;  // for the files
  BlobOwner blob_;
  IndexBlob spare_blob_;
  std::set<int> blob_ranks_;  // of the blob's chunks
  std::vector<BlobOwner> waiting_blobs_;
};

template <typename It>
Result<CheckpointIndex> IndexBuilder::Read(It first, It last) {
  const bool read = nlohmann::json::sax_parse(std::move(first), std::move(last), &sax_,
                                              nlohmann::json::input_format_t::json,
                                              /*strict=*/true, /*ignore_comments=*/false);
  if (!read) return sax_.stopped();
  if (!sax_.repeated().ok()) return sax_.repeated();
  for (Status& s : errors_) {
    if (!s.ok()) return std::move(s);
  }
  return std::move(index_);
}

bool IndexBuilder::Name(int kind, std::string_view name) {
  CheckFiles(/*last_chance=*/false);  // world_size may have come after the files
  if (kind == kTensor) {
    const bool fresh = packed_ ? NamePackedTensor(name) : NameTensor(name);
    Fail(kStageTensors, CheckKey("tensor", name));
    return fresh;
  }
  auto [at, fresh] = index_.blobs.try_emplace(std::string(name));
  if (!fresh) spare_blob_ = IndexBlob();
  blob_ = BlobOwner(fresh ? &at->second : &spare_blob_, kStageBlobs, "blob", at->first);
  blob_ranks_.clear();
  Fail(kStageBlobs, CheckKey("blob", name));
  return fresh;
}

bool IndexBuilder::NameTensor(std::string_view name) {
  IndexTensors& tensors = index_.tensors;
  // Keys come sorted from our writer: each goes in at the end, unsearched.
  auto at = !tensors.empty() && std::prev(tensors.end())->first < name ? tensors.end()
                                                                        : tensors.lower_bound(name);
  const bool fresh = at == tensors.end() || at->first != name;
  if (fresh) at = tensors.emplace_hint(at, std::string(name), IndexTensor());
  if (!fresh) spare_tensor_ = IndexTensor();
  tensor_ = TensorOwner(fresh ? &at->second : &spare_tensor_, kStageTensors, "tensor", at->first);
  return fresh;
}

bool IndexBuilder::NamePackedTensor(std::string_view name) {
  // The tensor before, neither packed nor waiting: it failed (and so will
  // the parse); its key still counts as seen.
  if (tensor_.own) failed_keys_.push_back(std::move(tensor_.own->key));
  const bool fresh = seen_.Insert(name, [&](const auto& add) {
    for (size_t t = 0; t < packed_->size(); ++t) add(packed_->key(t));
    for (const TensorOwner& w : waiting_tensors_) add(w.own->key);
    for (const std::string& k : failed_keys_) add(k);
  });
  auto own = std::make_unique<Unpacked>();
  own->key.assign(name);
  own->keep = fresh;
  tensor_ = TensorOwner(std::move(own), kStageTensors, "tensor");
  return fresh;
}

void IndexBuilder::End(int kind, size_t index, std::vector<FieldValue>& fields) {
  switch (kind) {
    case kRoot: return EndRoot(fields);
    case kFile: return EndFile(index, fields);
    case kTensor: return EndTensor(fields);
    case kChunk: return EndChunk(index, fields);
    case kBlob: return EndBlob(fields);
    case kBlobChunk: return EndBlobChunk(index, fields);
  }
}

void IndexBuilder::NotAnObject(int kind, size_t index, const FieldValue& value) {
  const std::string message = "expected a JSON object, got " + Describe(value);
  switch (kind) {
    case kRoot: return Fail(kStageVersion, Loss("", message));
    case kFile: return FailFiles(Loss("file " + std::to_string(index), message));
    case kTensor:
      tensor_.header = State::kFailed;
      return Fail(kStageTensors, Loss(tensor_.where, message));
    case kChunk:
      return Chunk(tensor_, Result<ChunkRead>(Loss(Where(tensor_.where, "chunk", index), message)));
    case kBlob:
      blob_.header = State::kFailed;
      return Fail(kStageBlobs, Loss(blob_.where, message));
    case kBlobChunk:
      return Chunk(blob_, Result<BlobChunkRead>(Loss(Where(blob_.where, "chunk", index), message)));
  }
}

void IndexBuilder::EndObjects(int kind) {
  if (kind != kFile) return;
  files_ended_ = true;
  CheckFiles(/*last_chance=*/false);
}

// The checks of the top level, in the document's order; then what waited
// for the files.
void IndexBuilder::EndRoot(std::vector<FieldValue>& fields) {
  const Where top("");
  const IndexObject root{fields, kRootSpec, top};
  Result<int> version = CheckFormatVersion(root);
  if (version.ok()) {
    index_.version = *version;
    Result<std::vector<IndexChunkTable>> table = ReadChunkTables(root, *version);
    if (table.ok()) index_.chunk_tables = std::move(*table);
    Fail(kStageVersion, table.status());
    Result<std::vector<uint32_t>> checksums = ReadChecksumFiles(root, *version);
    if (checksums.ok()) index_.checksum_files = std::move(*checksums);
    Fail(kStageVersion, checksums.status());
  }
  Fail(kStageVersion, version.status());
  Result<std::string> tag = String(root, kTag);
  if (tag.ok()) index_.tag = std::move(*tag);
  Fail(kStageTag, tag.status());
  Result<uint64_t> created = U64(root, kCreated, INT64_MAX);
  if (created.ok()) index_.created_unix = static_cast<int64_t>(*created);
  Fail(kStageCreated, created.status());
  Result<uint64_t> world = U64(root, kWorldSize, INT_MAX);
  if (world.ok() && *world == 0) world = Loss("field \"world_size\"", "must be at least 1");
  Fail(kStageWorld, world.status());
  Result<std::string> layout = Json(root, kLayout);
  if (layout.ok()) index_.layout = std::move(*layout);
  Fail(kStageLayout, layout.status());
  Result<std::string> metadata = Json(root, kMetadata);
  if (metadata.ok()) index_.metadata = std::move(*metadata);
  Fail(kStageMetadata, metadata.status());
  if (Status s = Holder(root, kFiles, "array"); !s.ok()) FailFiles(s);
  CheckFiles(/*last_chance=*/true);
  Fail(kStageTensors, Holder(root, kTensors, "object"));
  if (files_ == State::kReady) {
    for (TensorOwner& t : waiting_tensors_) Finish(t);
  }
  Result<std::string> values = Json(root, kValues, /*object=*/true);
  if (values.ok()) index_.values = std::move(*values);
  Fail(kStageValues, values.status());
  Fail(kStageBlobs, Holder(root, kBlobs, "object"));
  if (files_ == State::kReady) {
    for (BlobOwner& b : waiting_blobs_) Finish(b);
  }
}

// --- Files -----------------------------------------------------------------------

// world_size as read so far, if valid.
std::optional<int> IndexBuilder::WorldSize() {
  const FieldValue& v = sax_.Fields(kRoot)[kWorldSize];
  if (v.kind != Kind::kNumber || v.number == 0 || v.number > INT_MAX) return std::nullopt;
  return static_cast<int>(v.number);
}

void IndexBuilder::EndFile(size_t index, std::vector<FieldValue>& fields) {
  if (files_ == State::kFailed) return;
  const std::string where = "file " + std::to_string(index);
  Result<FileRead> read = ReadFile(IndexObject{fields, kFileSpec, where}, file_names_);
  if (!read.ok()) return FailFiles(read.status());
  index_.files.push_back(std::move(read->file));
  file_ranks_.push_back(read->rank);
  CheckFiles(/*last_chance=*/false);
}

// Checks the files' ranks read so far once world_size is known; the files
// are ready when all have been read and checked. On the last chance (the
// end of the document) whatever is known decides.
void IndexBuilder::CheckFiles(bool last_chance) {
  if (files_ != State::kPending) return;
  const std::optional<int> world = WorldSize();
  if (!world) {
    if (last_chance) files_ = State::kFailed;  // world_size's error comes first
    return;
  }
  index_.world_size = *world;
  for (; ranks_checked_ < file_ranks_.size(); ++ranks_checked_) {
    const uint64_t rank = file_ranks_[ranks_checked_];
    const std::string where = "file " + std::to_string(ranks_checked_);
    if (Status s = AtMost(where, "rank", rank, *world - 1); !s.ok()) return FailFiles(s);
    index_.files[ranks_checked_].rank = static_cast<int>(rank);
  }
  if (files_ended_ || last_chance) files_ = State::kReady;
}

void IndexBuilder::FailFiles(Status status) {
  files_ = State::kFailed;
  Fail(kStageFiles, std::move(status));
}

// --- Tensors and blobs -----------------------------------------------------------

template <typename O, typename R>
void IndexBuilder::Chunk(O& owner, Result<R> read) {
  if (owner.Failed(files_)) return;  // an earlier error stands
  if (!read.ok()) return Fail(owner.stage, read.status());
  if (owner.Ready(files_)) return Add(owner, *read);
  owner.held.push_back(std::move(*read));
}

template <typename O>
void IndexBuilder::EndOwner(O& owner, const Status& chunks, std::vector<O>& waiting) {
  if (owner.header == State::kFailed) return;
  if (!chunks.ok()) return Fail(owner.stage, chunks);
  if (files_ == State::kPending) return waiting.push_back(std::move(owner));
  if (files_ == State::kReady) Finish(owner);
}

// Checks the tensor's dtype and shape once both have been read; at its end,
// whatever was (a missing one is an error).
void IndexBuilder::CheckTensorHeader(bool at_end) {
  std::vector<FieldValue>& fields = sax_.Fields(kTensor);
  if (tensor_.header != State::kPending) return;
  if (!at_end && (fields[kDtype].kind == Kind::kAbsent || fields[kShape].kind == Kind::kAbsent)) {
    return;
  }
  const Status s = ReadTensorHeader(IndexObject{fields, kTensorSpec, tensor_.where}, tensor_.target);
  tensor_.header = s.ok() ? State::kReady : State::kFailed;
  Fail(kStageTensors, s);
}

void IndexBuilder::EndChunk(size_t index, std::vector<FieldValue>& fields) {
  CheckTensorHeader(/*at_end=*/false);
  const Where where(tensor_.where, "chunk", index);
  Chunk(tensor_, ReadChunk(IndexObject{fields, kChunkSpec, where}, index));
}

void IndexBuilder::Add(const TensorOwner& t, ChunkRead& read) {
  const Where where(t.where, "chunk", read.index);
  Result<IndexChunk> chunk = CheckChunk(read, *t.target, index_.files, where);
  if (!chunk.ok()) return Fail(kStageTensors, chunk.status());
  chunks_.push_back(std::move(*chunk));
}

void IndexBuilder::EndTensor(std::vector<FieldValue>& fields) {
  CheckTensorHeader(/*at_end=*/true);
  EndOwner(tensor_,
           ReadTensorChunksField(IndexObject{fields, kTensorSpec, tensor_.where}, tensor_.target),
           waiting_tensors_);
}

// Checks the chunks held, then gives the tensor its chunks (at their exact
// count: chunks are most of a large index).
void IndexBuilder::Finish(TensorOwner& t) {
  for (ChunkRead& read : t.held) Add(t, read);
  t.held = {};
  if (t.own) {  // packed (its chunks with it), unless its key was repeated
    t.target->chunks.swap(chunks_);
    if (t.own->keep) packed_->Add(t.own->key, *t.target);
    t.target->chunks.swap(chunks_);
    t.own.reset();
    chunks_.clear();
    return;
  }
  t.target->chunks.reserve(chunks_.size());
  std::move(chunks_.begin(), chunks_.end(), std::back_inserter(t.target->chunks));
  chunks_.clear();
}

void IndexBuilder::CheckBlobHeader(bool at_end) {
  std::vector<FieldValue>& fields = sax_.Fields(kBlob);
  if (blob_.header != State::kPending || (!at_end && fields[kPerRank].kind == Kind::kAbsent)) {
    return;
  }
  Result<bool> per_rank = Bool(IndexObject{fields, kBlobSpec, blob_.where}, kPerRank);
  if (per_rank.ok()) blob_.target->per_rank = *per_rank;
  blob_.header = per_rank.ok() ? State::kReady : State::kFailed;
  Fail(kStageBlobs, per_rank.status());
}

void IndexBuilder::EndBlobChunk(size_t index, std::vector<FieldValue>& fields) {
  CheckBlobHeader(/*at_end=*/false);
  const Where where(blob_.where, "chunk", index);
  Chunk(blob_, ReadBlobChunk(IndexObject{fields, kBlobChunkSpec, where}, index));
}

void IndexBuilder::Add(const BlobOwner& b, const BlobChunkRead& read) {
  const Where where(b.where, "chunk", read.index);
  Result<IndexBlobChunk> chunk = CheckBlobChunk(read, index_.files, index_.world_size, where);
  if (!chunk.ok()) return Fail(kStageBlobs, chunk.status());
  if (!blob_ranks_.insert(chunk->rank).second) {
    return Fail(kStageBlobs, Loss(where, "rank " + std::to_string(chunk->rank) + " given twice"));
  }
  b.target->chunks.push_back(*chunk);
}

void IndexBuilder::EndBlob(std::vector<FieldValue>& fields) {
  CheckBlobHeader(/*at_end=*/true);
  EndOwner(blob_, Holder(IndexObject{fields, kBlobSpec, blob_.where}, kBlobChunks, "array"),
           waiting_blobs_);
}

void IndexBuilder::Finish(BlobOwner& b) {
  if (!b.held.empty()) blob_ranks_.clear();  // all its chunks were held
  for (const BlobChunkRead& read : b.held) Add(b, read);
  b.held = {};
  if (!b.target->per_rank && b.target->chunks.size() != 1) {
    Fail(kStageBlobs, Loss(b.where, "a global blob needs exactly one chunk, found " +
                                        std::to_string(b.target->chunks.size())));
  }
}

}  // namespace

namespace {

// The checks across the objects of a parsed index.
Status CheckParsed(CheckpointIndex& index, PackedTensors* packed) {
  if (packed != nullptr) {
    packed->Seal();
    SS_RETURN_IF_ERROR(CheckNoSharedBytes(index, *packed));
  } else {
    SS_RETURN_IF_ERROR(CheckNoSharedBytes(index));
  }
  SS_RETURN_IF_ERROR(CheckChecksumFiles(index));
  SS_RETURN_IF_ERROR(CheckChunkTables(&index));
  return packed != nullptr ? CheckTableRefs(index, packed) : CheckTableRefs(&index);
}

template <typename It>
Result<CheckpointIndex> Parse(It first, It last, std::string_view source, PackedTensors* packed) {
  Result<CheckpointIndex> index = IndexBuilder(packed).Read(std::move(first), std::move(last));
  if (!index.ok()) return index.status().WithContext(source);
  if (Status s = CheckParsed(*index, packed); !s.ok()) return s.WithContext(source);
  return index;
}

Result<CheckpointIndex> ParseText(std::string_view text, std::string_view source,
                                  PackedTensors* packed) {
  if (Status s = CheckText(text); !s.ok()) return s.WithContext(source);
  return Parse(text.data(), text.data() + text.size(), source, packed);
}

Result<CheckpointIndex> ParsePieces(const IndexTextReader& next, std::string_view source,
                                    PackedTensors* packed) {
  PieceText text(next);
  Result<CheckpointIndex> index = Parse(text.begin(), text.end(), source, packed);
  if (!index.ok()) text.Drain();
  if (Status s = text.status(); !s.ok()) return s.WithContext(source);
  return index;
}

}  // namespace

Result<CheckpointIndex> ParseIndex(std::string_view text, std::string_view source) {
  return ParseText(text, source, nullptr);
}

Result<CheckpointIndex> ParseIndex(const IndexTextReader& next, std::string_view source) {
  return ParsePieces(next, source, nullptr);
}

Result<CheckpointIndex> ParseIndex(std::string_view text, std::string_view source,
                                   PackedTensors* tensors) {
  return ParseText(text, source, tensors);
}

Result<CheckpointIndex> ParseIndex(const IndexTextReader& next, std::string_view source,
                                   PackedTensors* tensors) {
  return ParsePieces(next, source, tensors);
}

}  // namespace shardsafe
