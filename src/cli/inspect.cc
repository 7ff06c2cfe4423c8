// shardsafe inspect PATH: what a checkpoint, Hugging Face directory or
// .safetensors file holds.
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/output.h"
#include "format/index.h"
#include "shardsafe/source.h"

namespace shardsafe::cli {
namespace {

uint64_t TensorBytes(const IndexTensor& t) {
  uint64_t n = 0;
  for (const IndexChunk& c : t.chunks) n += c.bytes;
  return n;
}

// The index as the format writes it (compact; every chunk inline, also
// those of a chunk table), with "path" and "native" first, streamed: a
// copy of a large index (or a DOM, ~10x) would take more memory than the
// parsed index itself.
void PrintIndexJson(const CheckpointSource& src) {
  std::cout << "{\"path\":" << Json(src.path).dump() << ",\"native\":"
            << (src.native ? "true" : "false") << ",";
  bool first = true;
  SerializeIndex(src.index, [&](std::string_view piece) {
    if (first) piece.remove_prefix(1);  // its '{'
    first = false;
    std::cout.write(piece.data(), static_cast<std::streamsize>(piece.size()));
  });
  std::cout << "\n";
}

void PrintChunks(const CheckpointSource& src, const IndexTensor& t) {
  for (const IndexChunk& c : t.chunks) {
    char crc[16] = "-";
    if (c.crc32c) std::snprintf(crc, sizeof crc, "%08x", *c.crc32c);
    std::cout << "    " << SliceToString(c.slice) << "  " << Printable(src.index.files[c.file].name) << " @"
              << c.at << "  " << FormatBytes(c.bytes) << "  crc32c " << crc << "\n";
  }
}

void PrintHuman(const CheckpointSource& src, bool chunks) {
  const CheckpointIndex& ix = src.index;
  uint64_t file_bytes = 0, tensor_bytes = 0;
  for (const IndexFile& f : ix.files) file_bytes += f.bytes;
  for (const auto& [k, t] : ix.tensors) tensor_bytes += TensorBytes(t);
  std::cout << "path      " << Printable(src.path) << "\n"
            << "kind      "
            << (src.native ? "shardsafe checkpoint (format v" + std::to_string(ix.version) + ")"
                           : "safetensors (no index, no checksums)")
            << "\n";
  if (ix.chunk_tables.size() == 1) {
    std::cout << "chunks in " << Printable(ix.chunk_tables[0].name) << ", "
              << FormatBytes(ix.chunk_tables[0].bytes) << "\n";
  } else if (!ix.chunk_tables.empty()) {
    uint64_t bytes = 0;
    for (const IndexChunkTable& t : ix.chunk_tables) bytes += t.bytes;
    std::cout << "chunks in " << ix.chunk_tables.size() << " table parts, " << FormatBytes(bytes)
              << "\n";
  }
  if (src.native) {
    std::cout << "tag       " << Printable(ix.tag) << "\n"
              << "saved by  " << ix.world_size << " rank(s), layout " << ix.layout << "\n";
    if (ix.metadata != "null") std::cout << "metadata  " << ix.metadata << "\n";
    if (ix.values != "{}") std::cout << "values    " << ix.values << "\n";
    for (const auto& [name, b] : ix.blobs) {
      std::cout << "blob      " << Printable(name) << (b.per_rank ? " (per rank, " : " (global, ")
                << b.chunks.size() << " chunk(s))\n";
    }
  }
  std::cout << "files     " << ix.files.size() << ", " << FormatBytes(file_bytes);
  if (!ix.checksum_files.empty()) std::cout << " (" << ix.checksum_files.size() << " checksum files)";
  if (ix.chunk_tables.size() > 0 && ix.chunk_tables[0].file) {
    std::cout << " (" << ix.chunk_tables.size() << " chunk table parts)";
  }
  std::cout << "\n"
            << "tensors   " << ix.tensors.size() << ", " << FormatBytes(tensor_bytes) << "\n\n";
  std::printf("%-48s %-8s %-20s %7s %12s\n", "TENSOR", "DTYPE", "SHAPE", "CHUNKS", "BYTES");
  for (const auto& [key, t] : ix.tensors) {
    std::printf("%-48s %-8s %-20s %7zu %12s\n", Printable(key).c_str(), std::string(DTypeName(t.dtype)).c_str(),
                ShapeToString(t.shape).c_str(), t.chunks.size(), FormatBytes(TensorBytes(t)).c_str());
    std::fflush(stdout);
    if (chunks) PrintChunks(src, t);
  }
}

}  // namespace

void AddInspect(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("inspect", "Show the tensors, chunks, files and save layout at PATH");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto chunks = std::make_shared<bool>(false);
  cmd->add_option("PATH", *path, "checkpoint dir, root, Hugging Face dir or .safetensors file")->required();
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->add_flag("--chunks", *chunks, "list every chunk of every tensor");
  cmd->callback([=] {
    auto src = OpenSource(*path);
    if (!src.ok()) {
      *exit_code = Fail(src.status());
      return;
    }
    if (*json) {
      PrintIndexJson(*src);
    } else {
      PrintHuman(*src, *chunks);
    }
  });
}

}  // namespace shardsafe::cli
