#include "engine/load/source.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/catalog/checkpoint_dir.h"
#include "engine/load/checksum_files.h"
#include "format/chunk_table.h"
#include "format/index.h"
#include "format/index_packed.h"
#include "comm/wire.h"
#include "layout/tiling.h"

namespace shardsafe {
namespace {

constexpr std::string_view kHfIndexName = "model.safetensors.index.json";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Index text read at a time, when it is not read whole.
constexpr uint64_t kIndexPieceBytes = uint64_t{4} << 20;

// Checks that every tensor's chunks tile it (DataLoss naming the tensor).
Status CheckIndexTiling(const PackedTensors& tensors, const std::string& source) {
  std::vector<Slice> slices;
  for (size_t t = 0; t < tensors.size(); ++t) {
    slices.clear();
    const uint64_t first = tensors.first_chunk(t);
    for (uint64_t i = 0; i < tensors.chunk_count(t); ++i) {
      slices.push_back(tensors.slice(t, first + i));
    }
    Status s = CheckTiling(std::string(tensors.key(t)), tensors.shape(t), slices);
    if (!s.ok()) return DataLossError(source + ": " + s.message());
  }
  return Status();
}

// A shardsafe checkpoint records a checksum for every chunk and blob chunk
// (only foreign files have none): one without is DataLoss, not a chunk
// left unchecked.
Status CheckChecksumsRecorded(const CheckpointIndex& index, const PackedTensors& tensors,
                              const std::string& source) {
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t first = tensors.first_chunk(t);
    for (uint64_t c = first; c < first + tensors.chunk_count(t); ++c) {
      if (!tensors.crc32c(c)) {
        return DataLossError(source + ": tensor \"" + std::string(tensors.key(t)) +
                             "\" chunk " + SliceToString(tensors.slice(t, c)) +
                             " has no crc32c");
      }
    }
  }
  for (const auto& [name, blob] : index.blobs) {
    for (const IndexBlobChunk& c : blob.chunks) {
      if (!c.crc32c) {
        return DataLossError(source + ": blob \"" + name + "\" (rank " +
                             std::to_string(c.rank) + ") has no crc32c");
      }
    }
  }
  return Status();
}

// The directory a source in `dir` is confined to (SourceReadOptions).
std::string ConfinementDir(const std::string& dir) {
  const std::string snapshots = ParentDir(dir);
  const std::string repo = ParentDir(snapshots);
  if (BaseName(snapshots) == "snapshots" && BaseName(repo).rfind("models--", 0) == 0) return repo;
  return dir;
}

ReadOptions Within(const std::string& dir) {
  ReadOptions options;
  options.within = ConfinementDir(dir);
  return options;
}

// The status of a checkpoint that retention or prune removed while it was
// being opened.
Status Removed(const std::string& dir) {
  return NotFoundError("checkpoint " + dir +
                       " was removed (by retention or prune) while it was being opened");
}

// Locks `dir`'s index shared (CheckpointSource::pin); Removed() if a prune
// is removing it or has.
Result<std::shared_ptr<FileLock>> Pin(FileSystem& fs, const std::string& dir) {
  auto lock = fs.TryLock(JoinPath(dir, kIndexFileName), LockMode::kShared);
  if (lock.ok()) return std::shared_ptr<FileLock>(std::move(*lock));
  switch (lock.status().code()) {
    case StatusCode::kUnimplemented: return std::shared_ptr<FileLock>();
    case StatusCode::kFailedPrecondition:  // held by a prune
    case StatusCode::kNotFound: return Removed(dir);
    default: return lock.status();
  }
}

// Fills every tensor's chunks from the chunk table `index` names (every
// part of it, one at a time), then their checksums.
Status ReadWholeTable(FileSystem& fs, const std::string& dir, const CheckpointIndex& index,
                      PackedTensors* tensors) {
  std::vector<std::string> paths;
  for (const IndexChunkTable& t : index.chunk_tables) paths.push_back(JoinPath(dir, t.name));
  auto read_part = [&](uint32_t p) {
    return ReadFileToString(fs, paths[p], index.chunk_tables[p].bytes, Within(dir));
  };
  SS_RETURN_IF_ERROR(FillChunksFromTables(read_part, paths, index, tensors));
  return FillChecksums(fs, dir, Within(dir), index, tensors);
}

// Parses the index at `path` in `dir`, its tensors into `*tensors`. Read
// whole where `*text` is to receive it (to be sent to other ranks) or the
// file system is an object store (one GET, one version of the object);
// else a piece at a time, never held whole.
Result<CheckpointIndex> ReadIndex(FileSystem& fs, const std::string& dir, const std::string& path,
                                  std::string* text, PackedTensors* tensors) {
  if (text != nullptr || fs.IsObjectStore()) {
    SS_ASSIGN_OR_RETURN(std::string read, ReadFileToString(fs, path, kMaxIndexBytes, Within(dir)));
    SS_ASSIGN_OR_RETURN(CheckpointIndex index, ParseIndex(read, path, tensors));
    if (text != nullptr) *text = std::move(read);
    return index;
  }
  SS_ASSIGN_OR_RETURN(auto file, fs.NewRandomAccessFile(path, Within(dir)));
  const uint64_t size = file->size();
  if (size > kMaxIndexBytes) {  // as ReadFileToString says it
    return ResourceExhaustedError("reading " + path + ": file has " + std::to_string(size) +
                                  " bytes, more than the limit of " +
                                  std::to_string(kMaxIndexBytes));
  }
  std::string piece;
  uint64_t offset = 0;
  const IndexTextReader next = [&]() -> Result<std::string_view> {
    piece.resize(std::min(kIndexPieceBytes, size - offset));
    SS_RETURN_IF_ERROR(file->ReadAt(offset, piece.data(), piece.size()));
    offset += piece.size();
    return std::string_view(piece);
  };
  return ParseIndex(next, path, tensors);
}

// `how.text` (when set) receives the index bytes read; `how.whole`: a
// chunk table is read too. The tensors go to CheckpointSource::packed. The
// tag is the directory's name (what a root lists and `latest` names), not
// the index's field.
Result<CheckpointSource> OpenNative(FileSystem& fs, const std::string& dir, const OpenHow& how) {
  const std::string index_path = JoinPath(dir, kIndexFileName);
  SS_ASSIGN_OR_RETURN(std::shared_ptr<FileLock> pin, Pin(fs, dir));
  auto tensors = std::make_shared<PackedTensors>();
  SS_ASSIGN_OR_RETURN(CheckpointIndex index,
                      ReadIndex(fs, dir, index_path, how.text, tensors.get()));
  const bool table = !index.chunk_tables.empty();
  const bool pending = table && !how.whole;
  if (table && how.whole) SS_RETURN_IF_ERROR(ReadWholeTable(fs, dir, index, tensors.get()));
  if (!pending) SS_RETURN_IF_ERROR(CheckIndexTiling(*tensors, index_path));
  SS_RETURN_IF_ERROR(CheckChecksumsRecorded(index, *tensors, index_path));
  index.tag = BaseName(dir);
  CheckpointSource src{dir, dir, true, std::move(index)};
  src.chunks_pending = pending;
  src.packed = std::move(tensors);
  src.pin = std::move(pin);
  return src;
}

// Adds the entries of one foreign safetensors file as whole-tensor chunks.
Status AddForeignFile(FileSystem& fs, const std::string& dir, const std::string& name,
                      const ReadOptions& options, CheckpointIndex* index) {
  const std::string path = JoinPath(dir, name);
  uint64_t size = 0;
  SS_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadSafetensorsHeader(fs, path, &size, options));
  const auto file = static_cast<uint32_t>(index->files.size());
  index->files.push_back({name, size, 0});
  for (const SafetensorsEntry& e : header.entries) {
    if (index->tensors.count(e.name)) {
      return DataLossError(path + ": tensor \"" + e.name + "\" also appears in another file");
    }
    IndexChunk chunk{Slice{Box::Whole(e.shape), std::nullopt}, file,
                     header.data_start() + e.begin, e.end - e.begin, std::nullopt};
    index->tensors[e.name] = IndexTensor{e.dtype, e.shape, {chunk}};
  }
  return Status();
}

// An HF index's weight_map (tensor -> shard file), with every file checked
// to be a plain .safetensors name inside the directory.
Result<std::map<std::string, std::string>> ReadHfWeightMap(FileSystem& fs, const std::string& path) {
  SS_ASSIGN_OR_RETURN(std::string text,
                      ReadFileToString(fs, path, kMaxIndexBytes, Within(ParentDir(path))));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return DataLossError(path + ": not a JSON object with a \"weight_map\" object");
  }
  std::map<std::string, std::string> map;
  for (const auto& [key, value] : j["weight_map"].items()) {
    if (!value.is_string()) return DataLossError(path + ": weight_map[\"" + key + "\"] is not a string");
    const std::string f = value.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." ||
        !EndsWith(f, ".safetensors")) {
      return DataLossError(path + ": weight_map[\"" + key + "\"] names a bad file \"" + f + "\"");
    }
    map[key] = f;
  }
  return map;
}

// Every tensor the weight_map promises must be in the file it names.
Status CheckWeightMap(const CheckpointSource& src, const std::map<std::string, std::string>& map,
                      const std::string& path) {
  std::map<std::string, std::string> file_of;
  for (const auto& [key, t] : src.index.tensors) file_of[key] = src.index.files[t.chunks[0].file].name;
  for (const auto& [key, file] : map) {
    auto it = file_of.find(key);
    if (it == file_of.end() || it->second != file) {
      return DataLossError(path + ": weight_map puts tensor \"" + key + "\" in " + file +
                           ", which does not hold it");
    }
  }
  return Status();
}

Result<CheckpointSource> OpenForeign(FileSystem& fs, const std::string& dir,
                                     const std::vector<std::string>& names,
                                     const std::string& shown_path) {
  CheckpointSource src{shown_path, dir, false, {}};
  src.index.tag = BaseName(shown_path);
  const ReadOptions options = SourceReadOptions(src);
  for (const std::string& name : names) {
    SS_RETURN_IF_ERROR(AddForeignFile(fs, dir, name, options, &src.index));
  }
  return src;
}

Result<std::vector<std::string>> SafetensorsFilesIn(FileSystem& fs, const std::string& dir) {
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(dir));
  std::vector<std::string> names;
  for (const DirEntry& e : entries) {
    if (!e.is_dir && EndsWith(e.name, ".safetensors") && e.name[0] != '.') names.push_back(e.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// What another tool's checkpoint in `dir` looks like, by the names of its
// files only (the Python package's readers tell for sure): "" when none.
std::string ForeignKind(FileSystem& fs, const std::string& dir) {
  auto entries = fs.ListDir(dir);
  if (!entries.ok()) return "";
  const auto has = [&](std::string_view name) {
    return std::any_of(entries->begin(), entries->end(),
                       [&](const DirEntry& e) { return e.name == name; });
  };
  const auto any_ends_with = [&](std::string_view suffix) {
    return std::any_of(entries->begin(), entries->end(),
                       [&](const DirEntry& e) { return EndsWith(e.name, suffix); });
  };
  if (has("latest_checkpointed_iteration.txt")) return "a Megatron checkpoint root";
  if (has("checkpoint_metadata.json") || has("latest.txt")) return "a nanotron checkpoint";
  if (has(".metadata")) {
    return has("metadata.json") ? "a Megatron torch_dist checkpoint" : "a torch DCP checkpoint";
  }
  if (any_ends_with("model_states.pt") || (has("latest") && has("zero_to_fp32.py"))) {
    return "a DeepSpeed checkpoint";
  }
  if (any_ends_with(".pt") || any_ends_with(".bin") || any_ends_with(".pth")) {
    return "PyTorch pickle files";
  }
  return "";
}

// "; it looks like KIND ..." for a directory of another tool's checkpoint.
std::string ForeignHint(FileSystem& fs, const std::string& dir) {
  const std::string kind = ForeignKind(fs, dir);
  if (kind.empty()) return "";
  return "; it holds what looks like " + kind +
         ", which the Python package reads: `shardsafe import " + dir +
         " DST` makes a checkpoint of it, shardsafe.load reads it as it is";
}

// True if every file is named like a shardsafe data file.
bool LooksLikeUncommittedCheckpoint(const std::vector<std::string>& names) {
  if (names.empty()) return false;
  for (const std::string& n : names) {
    if (n.rfind("data-", 0) != 0 || n.size() != std::string("data-00000-000.safetensors").size()) {
      return false;
    }
  }
  return true;
}

Result<CheckpointSource> OpenDirectory(FileSystem& fs, const std::string& dir,
                                       const OpenHow& how) {
  if (IsCommitted(fs, dir)) return OpenNative(fs, dir, how);
  const std::string hf_index = JoinPath(dir, kHfIndexName);
  if (fs.Stat(hf_index).ok()) {
    SS_ASSIGN_OR_RETURN(auto map, ReadHfWeightMap(fs, hf_index));
    std::set<std::string> files;
    for (const auto& [key, file] : map) files.insert(file);
    SS_ASSIGN_OR_RETURN(CheckpointSource src,
                        OpenForeign(fs, dir, {files.begin(), files.end()}, dir));
    SS_RETURN_IF_ERROR(CheckWeightMap(src, map, hf_index));
    return src;
  }
  {
    // A root: its latest is resolved and pinned with the root locked
    // shared, so no commit or retention renames anything in between.
    SS_ASSIGN_OR_RETURN(auto shared, LockRoot(fs, dir, LockMode::kShared));
    SS_ASSIGN_OR_RETURN(auto latest, ResolveLatestTag(fs, dir));
    if (latest) return OpenNative(fs, JoinPath(dir, *latest), how);
  }
  SS_ASSIGN_OR_RETURN(auto names, SafetensorsFilesIn(fs, dir));
  if (LooksLikeUncommittedCheckpoint(names)) {
    return FailedPreconditionError(dir + " holds shardsafe data files but no " +
                                   std::string(kIndexFileName) +
                                   ": an uncommitted or damaged checkpoint");
  }
  if (!names.empty()) return OpenForeign(fs, dir, names, dir);
  return NotFoundError("no committed checkpoint, Hugging Face model or safetensors file in " + dir +
                       ForeignHint(fs, dir));
}

}  // namespace

ReadOptions SourceReadOptions(const CheckpointSource& src) {
  return src.path == src.data_dir ? Within(src.data_dir) : ReadOptions{};
}

LoadSources FileSources(const CheckpointSource& src) {
  LoadSources sources;
  sources.within = SourceReadOptions(src).within;
  for (const IndexFile& f : src.index.files) {
    sources.file_paths.push_back(JoinPath(src.data_dir, f.name));
    if (src.native) sources.file_bytes.push_back(f.bytes);
  }
  return sources;
}

namespace {

// The header text of the safetensors file at `path` (steps 1-3 of the
// reference reader on its prefix), and the file's size.
Result<std::string> ReadHeaderText(FileSystem& fs, const std::string& path,
                                   const ReadOptions& options, uint64_t* file_size) {
  SS_ASSIGN_OR_RETURN(auto file, fs.NewRandomAccessFile(path, options));
  *file_size = file->size();
  std::byte prefix[8] = {};
  const size_t n = std::min<uint64_t>(8, *file_size);
  SS_RETURN_IF_ERROR(file->ReadAt(0, prefix, n));
  auto len = ParseSafetensorsHeaderLength(std::span<const std::byte>(prefix, n), *file_size);
  if (!len.ok()) return len.status().WithContext(path);
  std::string header(*len, '\0');
  SS_RETURN_IF_ERROR(file->ReadAt(8, header.data(), header.size()));
  return header;
}

}  // namespace

Result<SafetensorsHeader> ReadSafetensorsHeader(FileSystem& fs, const std::string& path,
                                                uint64_t* file_size, const ReadOptions& options) {
  SS_ASSIGN_OR_RETURN(std::string header, ReadHeaderText(fs, path, options, file_size));
  auto parsed = ParseSafetensorsHeader(header, *file_size);
  if (!parsed.ok()) return parsed.status().WithContext(path);
  return parsed;
}

Status ScanSafetensorsHeader(FileSystem& fs, const std::string& path, const ReadOptions& options,
                             uint64_t* file_size, uint64_t* data_start,
                             const std::function<void(const SafetensorsEntry&)>& each,
                             std::vector<std::string>* duplicates) {
  SS_ASSIGN_OR_RETURN(std::string header, ReadHeaderText(fs, path, options, file_size));
  *data_start = 8 + header.size();
  Status s = ScanSafetensorsHeader(header, *file_size, each, duplicates);
  return s.ok() ? s : s.WithContext(path);
}

Result<CheckpointSource> OpenSource(FileSystem& fs, const std::string& path) {
  return OpenSource(fs, path, OpenHow{nullptr, /*whole=*/true, /*packed=*/false});
}

Result<CheckpointSource> OpenSource(const std::string& path) {
  SS_ASSIGN_OR_RETURN(FileSystem * fs, FileSystemFor(path));
  return OpenSource(*fs, path);
}

Result<CheckpointSource> OpenSourcePacked(FileSystem& fs, const std::string& path) {
  return OpenSource(fs, path, OpenHow{});
}

Result<CheckpointSource> OpenSourcePacked(const std::string& path) {
  SS_ASSIGN_OR_RETURN(FileSystem * fs, FileSystemFor(path));
  return OpenSourcePacked(*fs, path);
}

Result<CheckpointSource> OpenSource(FileSystem& fs, const std::string& path,
                                    const OpenHow& how) {
  auto info = fs.Stat(path);
  if (!info.ok()) {
    if (info.status().detail() == ErrorDetail::kNoSuchBucket) {
      return info.status().WithContext("checkpoint not found: " + path);
    }
    if (info.status().code() == StatusCode::kNotFound) {
      return NotFoundError("checkpoint not found: " + path);
    }
    return info.status();
  }
  Result<CheckpointSource> src = info->is_dir ? OpenDirectory(fs, path, how)
                                              : OpenForeign(fs, ParentDir(path), {BaseName(path)},
                                                            path);
  if (src.ok()) Repack(&*src, how.packed);
  return src;
}

void Repack(CheckpointSource* src, bool packed) {
  if (packed && !src->packed) {
    src->packed = std::make_shared<const PackedTensors>(PackedTensors::From(src->index.tensors));
    src->index.tensors.clear();
  } else if (!packed && src->packed) {
    src->index.tensors = src->packed->Unpack();
    src->packed = nullptr;
  }
}

std::string EncodeSource(const CheckpointSource& source, std::string_view index_text) {
  wire::Writer w;
  w.Str(source.path);
  w.Str(source.other_format);
  if (!source.other_format.empty()) return w.Take();  // nothing was opened
  w.Str(source.data_dir);
  w.U8(source.native);
  if (!index_text.empty()) {
    w.Str(index_text);
  } else if (source.packed) {  // a synthesized index: every chunk inline (version 1)
    std::string text;
    SerializeIndex(source.index, *source.packed, [&](std::string_view s) { text += s; });
    w.Str(text);
  } else {
    w.Str(SerializeIndex(source.index));
  }
  return w.Take();
}

Result<CheckpointSource> DecodeSource(std::string_view msg) {
  wire::Reader r(msg);
  CheckpointSource src;
  SS_ASSIGN_OR_RETURN(src.path, r.Str());
  SS_ASSIGN_OR_RETURN(src.other_format, r.Str());
  if (!src.other_format.empty()) return src;
  SS_ASSIGN_OR_RETURN(src.data_dir, r.Str());
  SS_ASSIGN_OR_RETURN(uint8_t native, r.U8());
  src.native = native != 0;
  // Parsed in place: a copy would add the index's size to every rank's peak.
  SS_ASSIGN_OR_RETURN(std::string_view text, r.View());
  auto tensors = std::make_shared<PackedTensors>();
  SS_ASSIGN_OR_RETURN(src.index, ParseIndex(text, src.path, tensors.get()));
  src.packed = std::move(tensors);
  if (src.native) src.index.tag = BaseName(src.path);  // as OpenNative
  src.chunks_pending = !src.index.chunk_tables.empty();
  return src;
}

}  // namespace shardsafe
