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

#include "engine/wire.h"
#include "storage/shared_memory.h"

namespace shardsafe {
namespace {

constexpr uint64_t kAlign = 4096;
uint64_t AlignDown(uint64_t v) { return v / kAlign * kAlign; }
uint64_t AlignUp(uint64_t v) { return AlignDown(v + kAlign - 1); }

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
  uint64_t bytes = 0;         // of the shared memory
  std::string name;
};

// The shared memory starts with a header: a progress counter, then one
// BlockWord per block; block data follows at 4 KiB boundaries.
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

uint64_t HeaderBytes(size_t blocks) {
  return AlignUp(sizeof(Header) + blocks * sizeof(BlockWord));
}

MachinePlan PlanMachine(const std::vector<Offer>& offers, std::vector<int> ranks,
                        const SharedReadsOptions& options) {
  MachinePlan m;
  m.ranks = std::move(ranks);
  uint64_t budget = UINT64_MAX;
  for (int r : m.ranks) budget = std::min(budget, offers[r].budget);
  uint64_t data = 0;
  const uint64_t step = std::max(AlignDown(options.block_bytes), kAlign);
  for (const Extent& e : SharedRanges(offers, m.ranks)) {
    for (uint64_t at = e.begin; at < e.end; at += step) {
      const uint64_t end = std::min(e.end, at + step);
      const int reader = m.ranks[m.blocks.size() % m.ranks.size()];
      if (HeaderBytes(m.blocks.size() + 1) + data + (end - at) > budget) break;
      m.blocks.push_back({e.file, at, end, reader, data});
      data += end - at;
    }
  }
  if (data < options.min_bytes) m.blocks.clear();
  const uint64_t header = HeaderBytes(m.blocks.size());
  for (Block& b : m.blocks) b.data_at += header;
  m.bytes = header + data;
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

  Header* header() const { return reinterpret_cast<Header*>(mem->data()); }
  BlockWord& word(size_t block) const {
    return reinterpret_cast<BlockWord*>(mem->data() + sizeof(Header))[block];
  }

  void RunReader();
  void ReadBlock(size_t index, std::map<uint32_t, std::unique_ptr<RandomAccessFile>>* files);
  // True once block `index` is in shared memory; false if it never will be.
  bool Await(size_t index) const;
  // The block of `file` holding byte `offset`, or the first one after it
  // (of_file[file].size() when none).
  size_t Find(uint32_t file, uint64_t offset) const;

  FileSystem& fs;
  const std::vector<std::string> paths;
  const MachinePlan plan;
  const int rank;
  const std::unique_ptr<SharedMemory> mem;
  const SharedReadsOptions options;
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
  char* dst = mem->data() + b.data_at;
  uint64_t valid = 0;
  Status s = mem->Reserve(b.data_at, b.end - b.begin);
  if (s.ok() && !(*files)[b.file]) {
    auto opened = fs.NewRandomAccessFile(paths[b.file], ReadOptions{.direct = true});
    s = opened.status();
    if (s.ok()) (*files)[b.file] = std::move(*opened);
  }
  if (s.ok()) {
    const RandomAccessFile& file = *(*files)[b.file];
    valid = file.size() > b.begin ? std::min(b.end, file.size()) - b.begin : 0;
    s = file.ReadAt(b.begin, dst, valid);
  }
  BlockWord& w = word(index);
  std::atomic_ref<uint64_t>(w.valid).store(valid, std::memory_order_relaxed);
  std::atomic_ref<uint32_t>(w.state).store(s.ok() ? kReady : kUnavailable,
                                           std::memory_order_release);
  std::atomic_ref<uint32_t>(header()->progress).fetch_add(1, std::memory_order_release);
  FutexWakeAll(&w.state);
}

void SharedReads::State::RunReader() {
  std::map<uint32_t, std::unique_ptr<RandomAccessFile>> files;
  for (size_t i = next_mine++; i < mine.size(); i = next_mine++) ReadBlock(mine[i], &files);
}

bool SharedReads::State::Await(size_t index) const {
  if (given_up[index].load(std::memory_order_relaxed)) return false;
  const std::atomic_ref<uint32_t> state(word(index).state);
  uint32_t s = state.load(std::memory_order_acquire);
  if (s != kPending) return s == kReady;
  const std::atomic_ref<uint32_t> progress(header()->progress);
  uint32_t seen = progress.load(std::memory_order_relaxed);
  auto since = std::chrono::steady_clock::now();
  while ((s = state.load(std::memory_order_acquire)) == kPending) {
    FutexWait(&word(index).state, kPending, std::chrono::milliseconds(100));
    const uint32_t now_seen = progress.load(std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (now_seen != seen) {
      seen = now_seen;
      since = now;
    } else if (now - since > options.stall_timeout) {
      if (given_up[index].exchange(true)) return false;  // another thread said so
      std::fprintf(stderr, "shardsafe: rank %d: shared read of %s [%llu, %llu) stalled; reading "
                   "it directly\n", rank, paths[plan.blocks[index].file].c_str(),
                   static_cast<unsigned long long>(plan.blocks[index].begin),
                   static_cast<unsigned long long>(plan.blocks[index].end));
      return false;
    }
  }
  return s == kReady;
}

size_t SharedReads::State::Find(uint32_t file, uint64_t offset) const {
  const std::vector<size_t>& v = of_file[file];
  // First block whose end is past `offset`.
  return std::partition_point(v.begin(), v.end(),
                              [&](size_t i) { return plan.blocks[i].end <= offset; }) -
         v.begin();
}

namespace {

// A data file whose shared ranges come from shared memory.
class SharedFile final : public RandomAccessFile {
 public:
  SharedFile(SharedReads::State* st, uint32_t index, std::unique_ptr<RandomAccessFile> base)
      : st_(st), index_(index), base_(std::move(base)) {}

  Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
    char* p = static_cast<char*>(dst);
    const std::vector<size_t>& blocks = st_->of_file[index_];
    size_t k = st_->Find(index_, offset);
    while (n > 0) {
      if (k == blocks.size() || st_->plan.blocks[blocks[k]].begin > offset) {
        // Up to the next block: not shared.
        const uint64_t upto = k == blocks.size() ? offset + n : st_->plan.blocks[blocks[k]].begin;
        const size_t len = std::min<uint64_t>(n, upto - offset);
        SS_RETURN_IF_ERROR(base_->ReadAt(offset, p, len));
        Advance(len, &offset, &p, &n);
        continue;
      }
      const size_t bi = blocks[k];
      const Block& b = st_->plan.blocks[bi];
      const size_t in_block = std::min<uint64_t>(n, b.end - offset);
      const uint64_t valid = st_->Await(bi)
          ? std::atomic_ref<uint64_t>(st_->word(bi).valid).load(std::memory_order_relaxed)
          : 0;
      const uint64_t have = b.begin + valid > offset ? b.begin + valid - offset : 0;
      if (have >= in_block) {
        std::memcpy(p, st_->mem->data() + b.data_at + (offset - b.begin), in_block);
        if (b.reader != st_->rank) st_->from_peers += in_block;
      } else {
        SS_RETURN_IF_ERROR(base_->ReadAt(offset, p, in_block));
      }
      Advance(in_block, &offset, &p, &n);
      ++k;
    }
    return Status();
  }

  uint64_t size() const override { return base_->size(); }

  bool FullyCached(uint64_t offset, size_t n) const override {
    const std::vector<size_t>& blocks = st_->of_file[index_];
    for (size_t k = st_->Find(index_, offset); n > 0; ++k) {
      if (k == blocks.size()) return false;
      const Block& b = st_->plan.blocks[blocks[k]];
      if (b.begin > offset) return false;
      const size_t len = std::min<uint64_t>(n, b.end - offset);
      offset += len;
      n -= len;
    }
    return true;
  }

 private:
  static void Advance(size_t len, uint64_t* offset, char** p, size_t* n) {
    *offset += len;
    *p += len;
    *n -= len;
  }

  SharedReads::State* const st_;
  const uint32_t index_;
  const std::unique_ptr<RandomAccessFile> base_;
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
    auto created = SharedMemory::Create(options.dir, m.name, m.bytes);
    if (created.ok()) mem = std::move(*created);
  }
  SS_ASSIGN_OR_RETURN(std::vector<bool> created, GatherFlags(comm, !creator || mem));
  const bool can_open = sharing && AllOf(created, m.ranks);
  if (can_open && !creator) {
    auto opened = SharedMemory::Open(options.dir, m.name, m.bytes);
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
