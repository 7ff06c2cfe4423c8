#include "engine/shared_reads.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <system_error>
#include <thread>

#include "base/crc32c.h"
#include "engine/wire.h"
#include "storage/aligned_buffer.h"  // kDirectIoAlignment, AlignUp
#include "storage/shared_memory.h"

namespace shardsafe {
namespace {

uint64_t AlignDown(uint64_t v) { return v / kDirectIoAlignment * kDirectIoAlignment; }
// Readers checksum their blocks in pieces of this many bytes (from the
// block's start), so a rank that needs only part of a chunk can have the
// chunk's checksum without reading the rest.
constexpr uint64_t kPiece = 16 << 10;

// A byte range [begin, end) of data file `file`.
struct Extent {
  uint32_t file = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// What each rank tells the others (step 1).
struct Offer {
  bool enabled = false;
  std::string machine;
  uint64_t token = 0;
  uint64_t budget = 0;
  std::vector<Extent> extents;  // sorted, disjoint
};

struct Block {
  uint32_t file = 0;
  uint64_t begin = 0;  // file offset, 4 KiB aligned
  uint64_t end = 0;    // 4 KiB aligned (the file may end before it)
  int reader = 0;      // global rank
  uint64_t data_at = 0;  // offset in the shared memory
};

// The sharing plan of one machine.
struct MachinePlan {
  std::vector<int> ranks;  // ascending; ranks[0] creates the memory
  std::vector<Block> blocks;  // by (file, begin)
  uint64_t block_bytes = 0;   // a multiple of kPiece
  uint64_t header_bytes = 0;  // mapped; block data follows
  uint64_t bytes = 0;         // of the shared memory
  std::string name;
};

// The shared memory starts with a header: a progress counter, one
// BlockWord per block, then block_bytes / kPiece piece checksums per block;
// block data follows at 4 KiB boundaries.
enum BlockState : uint32_t { kPending = 0, kReady = 1, kUnavailable = 2 };
struct BlockWord {
  uint32_t state;
  uint32_t unused;
  uint64_t valid;  // bytes read (less than the block at the end of a file)
};
struct Header {
  uint32_t progress;  // blocks finished, either way
  uint32_t unused[3];
};

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string MachineKey() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return std::string(host) + "/" + ReadSmallFile("/proc/sys/kernel/random/boot_id");
}

uint64_t MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib << 10;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

uint64_t Budget(const SharedReadsOptions& options) {
  struct statvfs fs;
  if (statvfs(options.dir.c_str(), &fs) != 0) return 0;
  const uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
  return std::min({options.max_bytes, free_bytes / 2, MemAvailableBytes() / 2});
}

std::vector<Extent> PlanExtents(const LoadPlan& plan) {
  std::vector<Extent> all;
  for (const ReadGroup& g : plan.groups) {
    for (const ReadOp& r : g.reads) all.push_back({r.file, r.offset, r.offset + r.length});
  }
  std::sort(all.begin(), all.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.file, a.begin) < std::tie(b.file, b.begin);
  });
  std::vector<Extent> merged;
  for (const Extent& e : all) {
    if (!merged.empty() && merged.back().file == e.file && merged.back().end >= e.begin) {
      merged.back().end = std::max(merged.back().end, e.end);
    } else {
      merged.push_back(e);
    }
  }
  return merged;
}

std::string EncodeOffer(const Offer& o) {
  wire::Writer w;
  w.U8(o.enabled);
  w.Str(o.machine);
  w.U64(o.token);
  w.U64(o.budget);
  w.U64(o.extents.size());
  for (const Extent& e : o.extents) {
    w.U32(e.file);
    w.U64(e.begin);
    w.U64(e.end);
  }
  return w.Take();
}

Result<Offer> DecodeOffer(std::string_view msg) {
  wire::Reader r(msg);
  Offer o;
  SS_ASSIGN_OR_RETURN(uint8_t enabled, r.U8());
  o.enabled = enabled != 0;
  SS_ASSIGN_OR_RETURN(o.machine, r.Str());
  SS_ASSIGN_OR_RETURN(o.token, r.U64());
  SS_ASSIGN_OR_RETURN(o.budget, r.U64());
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  if (n > msg.size()) return InternalError("shared reads: malformed offer");
  o.extents.resize(n);
  for (Extent& e : o.extents) {
    SS_ASSIGN_OR_RETURN(e.file, r.U32());
    SS_ASSIGN_OR_RETURN(e.begin, r.U64());
    SS_ASSIGN_OR_RETURN(e.end, r.U64());
  }
  return o;
}

// The ranges of each file that at least two of `ranks` read, aligned out to
// 4 KiB and merged, in (file, begin) order.
std::vector<Extent> SharedRanges(const std::vector<Offer>& offers, const std::vector<int>& ranks) {
  std::map<std::pair<uint32_t, uint64_t>, int> delta;  // (file, offset) -> change in readers
  for (int r : ranks) {
    for (const Extent& e : offers[r].extents) {
      ++delta[{e.file, e.begin}];
      --delta[{e.file, e.end}];
    }
  }
  std::vector<Extent> out;
  int readers = 0;
  uint64_t start = 0;
  for (const auto& [at, d] : delta) {
    const int before = readers;
    readers += d;
    if (before < 2 && readers >= 2) start = at.second;
    if (before >= 2 && readers < 2) {
      const Extent e{at.first, AlignDown(start), AlignUp(at.second)};
      if (!out.empty() && out.back().file == e.file && out.back().end >= e.begin) {
        out.back().end = std::max(out.back().end, e.end);
      } else {
        out.push_back(e);
      }
    }
  }
  return out;
}

uint64_t HeaderBytes(size_t blocks, uint64_t block_bytes) {
  return AlignUp(sizeof(Header) + blocks * (sizeof(BlockWord) + block_bytes / kPiece * 4));
}

MachinePlan PlanMachine(const std::vector<Offer>& offers, std::vector<int> ranks,
                        const SharedReadsOptions& options) {
  MachinePlan m;
  m.ranks = std::move(ranks);
  m.block_bytes = std::max(options.block_bytes / kPiece * kPiece, kPiece);
  uint64_t budget = UINT64_MAX;
  for (int r : m.ranks) budget = std::min(budget, offers[r].budget);
  uint64_t data = 0;
  for (const Extent& e : SharedRanges(offers, m.ranks)) {
    for (uint64_t at = e.begin; at < e.end; at += m.block_bytes) {
      const uint64_t end = std::min(e.end, at + m.block_bytes);
      const int reader = m.ranks[m.blocks.size() % m.ranks.size()];
      if (HeaderBytes(m.blocks.size() + 1, m.block_bytes) + data + (end - at) > budget) break;
      m.blocks.push_back({e.file, at, end, reader, data});
      data += end - at;
    }
  }
  if (data < options.min_bytes) m.blocks.clear();
  m.header_bytes = HeaderBytes(m.blocks.size(), m.block_bytes);
  for (Block& b : m.blocks) b.data_at += m.header_bytes;
  m.bytes = m.header_bytes + data;
  char name[64];
  std::snprintf(name, sizeof name, "shardsafe-load-%016llx",
                static_cast<unsigned long long>(offers[m.ranks[0]].token));
  m.name = name;
  return m;
}

// The plan of every machine with at least two enabled ranks, by machine key.
std::map<std::string, MachinePlan> PlanMachines(const std::vector<Offer>& offers,
                                                const SharedReadsOptions& options) {
  std::map<std::string, std::vector<int>> ranks;
  for (size_t r = 0; r < offers.size(); ++r) {
    if (offers[r].enabled) ranks[offers[r].machine].push_back(static_cast<int>(r));
  }
  std::map<std::string, MachinePlan> plans;
  for (auto& [machine, rs] : ranks) {
    if (rs.size() >= 2) plans[machine] = PlanMachine(offers, std::move(rs), options);
  }
  return plans;
}

uint64_t RandomToken() {
  std::random_device rd;
  return (uint64_t{rd()} << 32 | rd()) ^ static_cast<uint64_t>(getpid());
}

// AllGather of one flag per rank.
Result<std::vector<bool>> GatherFlags(Comm& comm, bool mine) {
  SS_ASSIGN_OR_RETURN(auto all, comm.AllGather(std::string(1, mine ? '1' : '0')));
  std::vector<bool> out;
  for (const std::string& s : all) out.push_back(s == "1");
  return out;
}

bool AllOf(const std::vector<bool>& flags, const std::vector<int>& ranks) {
  return std::all_of(ranks.begin(), ranks.end(), [&](int r) { return flags[r]; });
}

}  // namespace

struct SharedReads::State {
  State(FileSystem& fs, std::vector<std::string> paths, MachinePlan plan, int rank,
        std::unique_ptr<SharedMemory> mem, const SharedReadsOptions& options)
      : fs(fs), paths(std::move(paths)), plan(std::move(plan)), rank(rank),
        mem(std::move(mem)), options(options) {
    of_file.resize(this->paths.size());
    given_up = std::make_unique<std::atomic<bool>[]>(this->plan.blocks.size());
    for (size_t i = 0; i < this->plan.blocks.size(); ++i) {
      const Block& b = this->plan.blocks[i];
      if (b.file < of_file.size()) of_file[b.file].push_back(i);
      if (b.reader == rank) mine.push_back(i);
    }
  }

  Header* header() const { return reinterpret_cast<Header*>(mem->mapped()); }
  BlockWord& word(size_t block) const {
    return reinterpret_cast<BlockWord*>(mem->mapped() + sizeof(Header))[block];
  }
  // The piece checksums of block `block`.
  uint32_t* crcs(size_t block) const {
    auto* all = reinterpret_cast<uint32_t*>(mem->mapped() + sizeof(Header) +
                                            plan.blocks.size() * sizeof(BlockWord));
    return all + block * (plan.block_bytes / kPiece);
  }

  void RunReader();
  void ReadBlock(size_t index, std::map<uint32_t, std::unique_ptr<RandomAccessFile>>* files);
  // The file offset up to which block `index` is in shared memory (its
  // reader has read it), waiting for the reader; the block's start if it
  // never will be.
  uint64_t Await(size_t index) const;
  // The block of `file` holding byte `offset`, or the first one after it
  // (of_file[file].size() when none).
  size_t Find(uint32_t file, uint64_t offset) const;
  // The checksum of [offset, offset + n), which lies within the part of
  // block `index` its reader read: from the piece checksums, reading only
  // the bytes of pieces the range covers in part.
  Result<uint32_t> BlockCrc(size_t index, uint64_t offset, uint64_t n) const;

  FileSystem& fs;
  const std::vector<std::string> paths;
  const MachinePlan plan;
  const int rank;
  const std::unique_ptr<SharedMemory> mem;
  const SharedReadsOptions options;
  const uint32_t piece_shift = Crc32cShift(kPiece);
  std::vector<std::vector<size_t>> of_file;  // block indices by file, ascending offset
  std::vector<size_t> mine;                  // blocks this rank reads
  std::atomic<size_t> next_mine{0};
  std::vector<std::thread> readers;
  std::atomic<uint64_t> from_peers{0};
  // Blocks this rank stopped waiting for: read directly from then on.
  std::unique_ptr<std::atomic<bool>[]> given_up;
};

void SharedReads::State::ReadBlock(size_t index,
                                   std::map<uint32_t, std::unique_ptr<RandomAccessFile>>* files) {
  const Block& b = plan.blocks[index];
  uint64_t valid = 0;
  Result<char*> dst = mem->MapRange(b.data_at, b.end - b.begin);
  Status s = dst.status();
  if (s.ok() && !(*files)[b.file]) {
    auto opened = fs.NewRandomAccessFile(paths[b.file], ReadOptions{.direct = true});
    s = opened.status();
    if (s.ok()) (*files)[b.file] = std::move(*opened);
  }
  if (s.ok()) {
    const RandomAccessFile& file = *(*files)[b.file];
    valid = file.size() > b.begin ? std::min(b.end, file.size()) - b.begin : 0;
    s = file.ReadAt(b.begin, *dst, valid);
  }
  if (s.ok()) {
    uint32_t* piece_crcs = crcs(index);
    for (uint64_t at = 0; at < valid; at += kPiece) {
      piece_crcs[at / kPiece] = Crc32c(*dst + at, std::min(kPiece, valid - at));
    }
  }
  if (dst.ok()) SharedMemory::UnmapRange(*dst, b.end - b.begin);
  BlockWord& w = word(index);
  std::atomic_ref<uint64_t>(w.valid).store(s.ok() ? valid : 0, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(w.state).store(s.ok() ? kReady : kUnavailable,
                                           std::memory_order_release);
  std::atomic_ref<uint32_t>(header()->progress).fetch_add(1, std::memory_order_release);
  FutexWakeAll(&w.state);
}

void SharedReads::State::RunReader() {
  std::map<uint32_t, std::unique_ptr<RandomAccessFile>> files;
  for (size_t i = next_mine++; i < mine.size(); i = next_mine++) ReadBlock(mine[i], &files);
}

uint64_t SharedReads::State::Await(size_t index) const {
  const Block& b = plan.blocks[index];
  if (given_up[index].load(std::memory_order_relaxed)) return b.begin;
  const std::atomic_ref<uint32_t> state(word(index).state);
  const std::atomic_ref<uint32_t> progress(header()->progress);
  uint32_t seen = progress.load(std::memory_order_relaxed);
  auto since = std::chrono::steady_clock::now();
  uint32_t s;
  while ((s = state.load(std::memory_order_acquire)) == kPending) {
    FutexWait(&word(index).state, kPending, std::chrono::milliseconds(100));
    const uint32_t now_seen = progress.load(std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (now_seen != seen) {
      seen = now_seen;
      since = now;
    } else if (now - since > options.stall_timeout) {
      if (given_up[index].exchange(true)) return b.begin;  // another thread said so
      std::fprintf(stderr, "shardsafe: rank %d: shared read of %s [%llu, %llu) stalled; reading "
                   "it directly\n", rank, paths[b.file].c_str(),
                   static_cast<unsigned long long>(b.begin), static_cast<unsigned long long>(b.end));
      return b.begin;
    }
  }
  return s == kReady ? b.begin + std::atomic_ref<uint64_t>(word(index).valid).load(
                                     std::memory_order_relaxed)
                     : b.begin;
}

size_t SharedReads::State::Find(uint32_t file, uint64_t offset) const {
  const std::vector<size_t>& v = of_file[file];
  // First block whose end is past `offset`.
  return std::partition_point(v.begin(), v.end(),
                              [&](size_t i) { return plan.blocks[i].end <= offset; }) -
         v.begin();
}

Result<uint32_t> SharedReads::State::BlockCrc(size_t index, uint64_t offset, uint64_t n) const {
  const Block& b = plan.blocks[index];
  const uint64_t valid_end = b.begin + std::atomic_ref<uint64_t>(word(index).valid).load(
                                           std::memory_order_relaxed);
  const uint32_t* piece_crcs = crcs(index);
  uint32_t crc = 0;
  char edge[kPiece];
  while (n > 0) {
    const uint64_t piece = (offset - b.begin) / kPiece;
    const uint64_t piece_begin = b.begin + piece * kPiece;
    const uint64_t piece_end = std::min(piece_begin + kPiece, valid_end);
    const uint64_t len = std::min(n, piece_end - offset);
    uint32_t c;
    if (offset == piece_begin && len == piece_end - piece_begin) {
      c = piece_crcs[piece];
    } else {
      SS_RETURN_IF_ERROR(mem->Read(b.data_at + (offset - b.begin), edge, len));
      c = Crc32c(edge, len);
    }
    crc = len == kPiece ? Crc32cCombineShifted(crc, c, piece_shift) : Crc32cCombine(crc, c, len);
    offset += len;
    n -= len;
  }
  return crc;
}

namespace {

// A data file whose shared ranges come from shared memory.
class SharedFile final : public RandomAccessFile {
 public:
  SharedFile(SharedReads::State* st, uint32_t index, std::unique_ptr<RandomAccessFile> base)
      : st_(st), index_(index), base_(std::move(base)), blocks_(st->of_file[index]) {}

  Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const Span span = At(offset, n);
      if (span.shared) {
        SS_RETURN_IF_ERROR(st_->mem->Read(DataAt(span, offset), p, span.n));
        Count(span);
      } else {
        SS_RETURN_IF_ERROR(base_->ReadAt(offset, p, span.n));
      }
      offset += span.n;
      p += span.n;
      n -= span.n;
    }
    return Status();
  }

  // The pieces that lie in one block go in one scattered read of it.
  Status ReadScattered(uint64_t offset, std::span<const Piece> pieces) const override {
    while (!pieces.empty()) {
      const Span span = At(offset, pieces[0].n);
      size_t k = 1;
      uint64_t n = pieces[0].n;
      if (span.shared && span.n == n) {
        const uint64_t room = span.shared_end - offset;
        for (; k < pieces.size() && n + pieces[k].n <= room; ++k) n += pieces[k].n;
        SS_RETURN_IF_ERROR(st_->mem->ReadScattered(DataAt(span, offset), pieces.first(k)));
        Count({span.block, n, true, span.shared_end});
      } else {
        SS_RETURN_IF_ERROR(ReadAt(offset, pieces[0].dst, n));
      }
      offset += n;
      pieces = pieces.subspan(k);
    }
    return Status();
  }

  uint64_t size() const override { return base_->size(); }

  // Reads of shared ranges are memory copies.
  bool FullyCached(uint64_t offset, size_t n) const override { return InBlocks(offset, n); }
  bool KnowsCrc32c(uint64_t offset, size_t n) const override { return InBlocks(offset, n); }

  Result<uint32_t> Crc32cOf(uint64_t offset, size_t n) const override {
    uint32_t crc = 0;
    while (n > 0) {
      const Span span = At(offset, n);
      uint32_t c = 0;
      if (span.shared) {
        SS_ASSIGN_OR_RETURN(c, st_->BlockCrc(span.block, offset, span.n));
      } else {
        SS_ASSIGN_OR_RETURN(c, BaseCrc(offset, span.n));
      }
      crc = Crc32cCombine(crc, c, span.n);
      offset += span.n;
      n -= span.n;
    }
    return crc;
  }

 private:
  // The longest prefix of [offset, offset + n) served one way: from block
  // `block` in shared memory (its reader read it), or from the file.
  struct Span {
    size_t block;
    uint64_t n;
    bool shared;
    uint64_t shared_end;  // where the block's shared bytes end
  };
  Span At(uint64_t offset, uint64_t n) const {
    const size_t k = st_->Find(index_, offset);
    if (k == blocks_.size()) return {0, n, false, 0};
    const Block& b = st_->plan.blocks[blocks_[k]];
    if (b.begin > offset) return {0, std::min(n, b.begin - offset), false, 0};
    const uint64_t in_block = std::min(n, b.end - offset);
    const uint64_t shared_end = st_->Await(blocks_[k]);
    if (shared_end >= offset + in_block) return {blocks_[k], in_block, true, shared_end};
    return {0, in_block, false, 0};  // unavailable: the file itself
  }
  uint64_t DataAt(const Span& span, uint64_t offset) const {
    const Block& b = st_->plan.blocks[span.block];
    return b.data_at + (offset - b.begin);
  }
  void Count(const Span& span) const {
    if (st_->plan.blocks[span.block].reader != st_->rank) st_->from_peers += span.n;
  }
  bool InBlocks(uint64_t offset, uint64_t n) const {
    for (size_t k = st_->Find(index_, offset); n > 0; ++k) {
      if (k == blocks_.size()) return false;
      const Block& b = st_->plan.blocks[blocks_[k]];
      if (b.begin > offset) return false;
      const uint64_t len = std::min(n, b.end - offset);
      offset += len;
      n -= len;
    }
    return true;
  }
  Result<uint32_t> BaseCrc(uint64_t offset, uint64_t n) const {
    std::vector<char> buf(std::min<uint64_t>(n, 1 << 20));
    uint32_t crc = 0;
    for (uint64_t done = 0; done < n;) {
      const uint64_t len = std::min<uint64_t>(buf.size(), n - done);
      SS_RETURN_IF_ERROR(base_->ReadAt(offset + done, buf.data(), len));
      crc = Crc32cExtend(crc, buf.data(), len);
      done += len;
    }
    return crc;
  }

  SharedReads::State* const st_;
  const uint32_t index_;
  const std::unique_ptr<RandomAccessFile> base_;
  const std::vector<size_t>& blocks_;  // of this file
};

}  // namespace

Result<std::unique_ptr<SharedReads>> SharedReads::Start(
    Comm& comm, const LoadPlan* plan, const std::vector<std::string>& file_paths,
    FileSystem& fs, const SharedReadsOptions& options) {
  if (comm.size() < 2) return std::unique_ptr<SharedReads>();
  Offer mine;
  mine.enabled = options.enabled && plan != nullptr;
  if (mine.enabled) {
    mine.machine = MachineKey();
    mine.token = RandomToken();
    mine.budget = Budget(options);
    mine.extents = PlanExtents(*plan);
  }
  SS_ASSIGN_OR_RETURN(std::vector<std::string> msgs, comm.AllGather(EncodeOffer(mine)));
  std::vector<Offer> offers;
  for (const std::string& m : msgs) {
    SS_ASSIGN_OR_RETURN(Offer o, DecodeOffer(m));
    offers.push_back(std::move(o));
  }
  // Whether any machine shares decides, identically on every rank, whether
  // the two collectives below happen.
  std::map<std::string, MachinePlan> plans = PlanMachines(offers, options);
  if (std::all_of(plans.begin(), plans.end(), [](const auto& p) { return p.second.blocks.empty(); })) {
    return std::unique_ptr<SharedReads>();
  }
  MachinePlan m;
  if (auto it = plans.find(mine.machine); mine.enabled && it != plans.end()) m = std::move(it->second);
  const bool sharing = !m.blocks.empty();
  const bool creator = sharing && m.ranks[0] == comm.rank();

  std::unique_ptr<SharedMemory> mem;
  if (creator) {
    auto created = SharedMemory::Create(options.dir, m.name, m.bytes, m.header_bytes);
    if (created.ok()) mem = std::move(*created);
  }
  SS_ASSIGN_OR_RETURN(std::vector<bool> created, GatherFlags(comm, !creator || mem));
  const bool can_open = sharing && AllOf(created, m.ranks);
  if (can_open && !creator) {
    auto opened = SharedMemory::Open(options.dir, m.name, m.bytes, m.header_bytes);
    if (opened.ok()) mem = std::move(*opened);
  }
  SS_ASSIGN_OR_RETURN(std::vector<bool> opened, GatherFlags(comm, !can_open || mem));
  if (creator && mem) mem->Unlink().IgnoreError();
  if (!can_open || !AllOf(opened, m.ranks)) return std::unique_ptr<SharedReads>();

  auto state = std::make_unique<State>(fs, file_paths, std::move(m), comm.rank(), std::move(mem),
                                       options);
  const int threads = std::clamp<int>(options.reader_threads, 1,
                                      static_cast<int>(std::max<size_t>(state->mine.size(), 1)));
  State* st = state.get();
  try {
    for (int t = 0; t < threads && !st->mine.empty(); ++t) {
      st->readers.emplace_back([st] { st->RunReader(); });
    }
  } catch (const std::system_error&) {
    // No more threads: those started read every block; with none, read
    // them here before loading.
    if (st->readers.empty()) st->RunReader();
  }
  return std::unique_ptr<SharedReads>(new SharedReads(std::move(state)));
}

SharedReads::SharedReads(std::unique_ptr<State> state) : state_(std::move(state)) {}

SharedReads::~SharedReads() { Finish(); }

void SharedReads::Finish() {
  for (std::thread& t : state_->readers) t.join();
  state_->readers.clear();
}

std::unique_ptr<RandomAccessFile> SharedReads::WrapFile(uint32_t index,
                                                        std::unique_ptr<RandomAccessFile> file) {
  if (index >= state_->of_file.size() || state_->of_file[index].empty()) return file;
  return std::make_unique<SharedFile>(state_.get(), index, std::move(file));
}

uint64_t SharedReads::bytes_from_peers() const { return state_->from_peers.load(); }

}  // namespace shardsafe
