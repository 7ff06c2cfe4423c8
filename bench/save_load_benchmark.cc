// Save/load benchmark: shardsafe's collective Save and Load against raw-I/O
// and memcpy baselines measured in the same run, on the same directory and
// the same bytes. Ranks are threads of this process (MakeThreadComms).
//
//   save_load_benchmark [--dir D] [--gib G] [--ranks N] [--reps R] [--quick]
//                       [--layouts large,llm,small] [--load-buffered]
//                       [--no-baselines] [--keep]
//
// Rows (each the median of --reps; min-max in brackets):
//   baselines  raw O_DIRECT write (16 MiB requests, one file per thread,
//              fdatasync), raw cold read (O_DIRECT and buffered, after
//              drop_caches), memcpy between pre-faulted buffers.
//   per layout save (durable), cold load (drop_caches first), hot load
//              (after an untimed buffered load filled the page cache;
//              residency printed), cold loads with O_DIRECT unless
//              --load-buffered,
//              resharded load (another TP degree / world size, cold),
//              export-hf (ExportHf into shards of 1/4 of the state) with the
//              checkpoint in the page cache and cold.
// GB/s = 10^9 bytes / s. Save: unique checkpoint payload / wall time of the
// collective call (first rank entering to last rank leaving). Load: bytes
// delivered to destinations (sum over ranks of bytes_needed) / wall time.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "shardsafe/async_save.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "shardsafe/hf.h"

namespace shardsafe {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kAlign = 4096;

uint64_t AlignUp(uint64_t n, uint64_t a = kAlign) { return (n + a - 1) / a * a; }

double Secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "save_load_benchmark: %s\n", what.c_str());
  std::exit(1);
}

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

// ------------------------------------------------------------- memory --

// Page-aligned anonymous memory, pre-faulted (every page written) so that no
// timed section pays first-touch faults.
class Arena {
 public:
  explicit Arena(uint64_t bytes) : size_(AlignUp(std::max<uint64_t>(bytes, kAlign), 2 * kMiB)) {
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Die("mmap " + std::to_string(size_) + " bytes failed");
    madvise(p, size_, MADV_HUGEPAGE);
    data_ = static_cast<char*>(p);
    // Touch every page from two threads (first touch is the slow part here).
    std::thread t([&] { Touch(0, size_ / 2); });
    Touch(size_ / 2, size_);
    t.join();
  }
  ~Arena() { munmap(data_, size_); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }

  // Bump allocation (not thread-safe); 4 KiB aligned.
  char* Take(uint64_t bytes) {
    const uint64_t at = used_;
    used_ = AlignUp(used_ + std::max<uint64_t>(bytes, 1));
    if (used_ > size_) Die("arena overflow");
    return data_ + at;
  }
  void Reset() { used_ = 0; }

 private:
  void Touch(uint64_t lo, uint64_t hi) {
    for (uint64_t i = lo; i < hi; i += kAlign) data_[i] = 1;
  }
  char* data_ = nullptr;
  uint64_t size_ = 0;
  uint64_t used_ = 0;
};

// Deterministic non-constant contents (so nothing compresses or dedups).
void FillPattern(char* p, uint64_t n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<char>(i);
}

// ---------------------------------------------------------- utilities --

struct Stats {
  std::vector<double> v;
  void Add(double x) { v.push_back(x); }
  double Median() const {
    if (v.empty()) return 0;
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  }
  double Min() const { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
  double Max() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
};

bool g_drop_ok = true;
bool g_drop_warned = false;

// sync, then drop clean page cache. Returns false (and warns once) when the
// cache cannot be dropped (not root): "cold" numbers are then warm.
bool DropCaches() {
  sync();
  int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
  bool ok = fd >= 0 && write(fd, "3", 1) == 1;
  if (fd >= 0) close(fd);
  if (!ok) {
    g_drop_ok = false;
    if (!g_drop_warned) {
      std::fprintf(stderr,
                   "WARNING: cannot write /proc/sys/vm/drop_caches (%s): \"cold\" rows are "
                   "measured WARM\n",
                   std::strerror(errno));
      g_drop_warned = true;
    }
  }
  return ok;
}

// Fraction of the bytes of the regular files under `dir` that are in the
// page cache (mincore).
double CachedFraction(const std::string& dir) {
  uint64_t total = 0, cached = 0;
  const long page = sysconf(_SC_PAGESIZE);
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;
    const uint64_t size = e.file_size();
    if (size == 0) continue;
    int fd = open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) continue;
    const uint64_t pages = (size + page - 1) / page;
    std::vector<unsigned char> vec(pages);
    if (mincore(m, size, vec.data()) == 0) {
      for (unsigned char c : vec) cached += c & 1;
      total += pages;
    }
    munmap(m, size);
  }
  return total ? static_cast<double>(cached) / total : 0.0;
}

// Runs fn(rank, comm) on n threads that start together. Returns the wall
// time from the first rank entering to the last rank leaving.
double RunRanks(int n, const std::function<void(int, Comm&)>& fn) {
  auto comms = MakeThreadComms(n);
  std::vector<Clock::time_point> start(n), end(n);
  std::barrier sync_point(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      sync_point.arrive_and_wait();
      start[r] = Clock::now();
      fn(r, *comms[r]);
      end[r] = Clock::now();
    });
  }
  for (auto& t : threads) t.join();
  return Secs(*std::min_element(start.begin(), start.end()),
              *std::max_element(end.begin(), end.end()));
}

// Runs fn(t) on n threads; returns the wall time.
double RunThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int t = 0; t < n; ++t) threads.emplace_back([&, t] { fn(t); });
  for (auto& t : threads) t.join();
  return Secs(t0, Clock::now());
}

// ---------------------------------------------------------- baselines --

// Each of n threads writes its 1/n of `src` (rounded to 4 KiB) to its own
// file with O_DIRECT, 16 MiB requests, then fdatasync + close.
double RawWrite(const std::string& dir, const char* src, uint64_t bytes, int n) {
  const uint64_t per = AlignUp((bytes + n - 1) / n);
  const uint64_t req = 16 * kMiB;
  return RunThreads(n, [&](int t) {
    const std::string path = dir + "/raw-" + std::to_string(t);
    int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_DIRECT, 0644);
    if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
    const uint64_t lo = per * t, hi = std::min<uint64_t>(AlignUp(bytes), per * (t + 1));
    for (uint64_t at = lo; at < hi; at += req) {
      const uint64_t len = std::min(req, hi - at);
      if (pwrite(fd, src + at, len, static_cast<off_t>(at - lo)) != static_cast<ssize_t>(len)) {
        Die("pwrite " + path + ": " + std::strerror(errno));
      }
    }
    if (fdatasync(fd) != 0) Die("fdatasync " + path);
    close(fd);
  });
}

// Each thread reads its raw file back (16 MiB requests) into `dst`.
double RawRead(const std::string& dir, char* dst, uint64_t bytes, int n, bool direct) {
  const uint64_t per = AlignUp((bytes + n - 1) / n);
  const uint64_t req = 16 * kMiB;
  return RunThreads(n, [&](int t) {
    const std::string path = dir + "/raw-" + std::to_string(t);
    int fd = open(path.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
    if (fd < 0) Die("open " + path + ": " + std::strerror(errno));
    const uint64_t lo = per * t, hi = std::min<uint64_t>(AlignUp(bytes), per * (t + 1));
    for (uint64_t at = lo; at < hi; at += req) {
      const uint64_t len = std::min(req, hi - at);
      if (pread(fd, dst + at, len, static_cast<off_t>(at - lo)) != static_cast<ssize_t>(len)) {
        Die("pread " + path + ": " + std::strerror(errno));
      }
    }
    close(fd);
  });
}

double Memcpy(char* dst, const char* src, uint64_t bytes, int n) {
  const uint64_t per = AlignUp((bytes + n - 1) / n);
  return RunThreads(n, [&](int t) {
    const uint64_t lo = std::min(bytes, per * t), hi = std::min(bytes, per * (t + 1));
    std::memcpy(dst + lo, src + lo, hi - lo);
  });
}

// ------------------------------------------------------------ layouts --

// One global tensor and how a layout shards it.
struct TensorDef {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;
  int split_dim = -1;      // TP split dimension; -1: replicated over TP
  bool zero = false;       // flat-sharded over DP (ZeRO optimizer state)
  bool round_robin = false;  // whole tensor held by rank (index % world) only
};

// A parallel layout: world = tp * dp.
struct Par {
  int tp = 1;
  int dp = 1;
  int world() const { return tp * dp; }
};

uint64_t ElemBytes(DType d) { return static_cast<uint64_t>(DTypeBits(d)) / 8; }

// The slice rank `r` of `par` holds of tensor `i`, or nullopt.
std::optional<Slice> SliceOf(const TensorDef& t, size_t i, const Par& par, int r) {
  if (t.round_robin) {
    if (static_cast<int>(i % par.world()) != r) return std::nullopt;
    return Slice{Box::Whole(t.shape), std::nullopt};
  }
  const int tp_rank = r / par.dp, dp_rank = r % par.dp;
  Slice s{Box::Whole(t.shape), std::nullopt};
  if (t.split_dim >= 0) {
    const uint64_t n = t.shape[t.split_dim];
    const uint64_t lo = n * tp_rank / par.tp, hi = n * (tp_rank + 1) / par.tp;
    s.box.offset[t.split_dim] = lo;
    s.box.size[t.split_dim] = hi - lo;
  }
  if (t.zero) {
    const uint64_t n = s.NumElements();
    s.flat = FlatRange{n * dp_rank / par.dp, n * (dp_rank + 1) / par.dp};
  }
  return s;
}

// Which rank's buffer a rank uses for a tensor on save: DP replicas of a
// non-ZeRO tensor share one buffer (the same values, as in a real job).
int OwnerOf(const TensorDef& t, const Par& par, int r) {
  if (t.round_robin) return r;
  const int tp_rank = t.split_dim >= 0 ? r / par.dp : 0;  // TP replicas share
  const int dp_rank = t.zero ? r % par.dp : 0;            // DP replicas share
  return tp_rank * par.dp + dp_rank;
}

struct Layout {
  std::string name;
  std::string description;
  std::vector<TensorDef> tensors;
  Par save;
  Par reshard;
};

Layout LargeLayout(uint64_t bytes, int ranks) {
  Layout l;
  l.name = "large";
  const int n = 8;
  // Square-ish F32 matrices of bytes/8 each; 4096 columns.
  const uint64_t cols = 4096;
  const uint64_t rows = std::max<uint64_t>(ranks * 2, bytes / n / 4 / cols);
  for (int i = 0; i < n; ++i) {
    TensorDef t;
    t.key = "large." + std::to_string(i) + ".weight";
    t.dtype = DType::kF32;
    t.shape = {rows, cols};
    t.split_dim = i % 2;  // column-parallel (dim 0) and row-parallel (dim 1) alternate
    l.tensors.push_back(t);
  }
  l.save = {ranks, 1};
  l.reshard = {ranks > 1 ? ranks / 2 : 2, 1};
  char buf[200];
  std::snprintf(buf, sizeof buf, "%d x F32 [%llu, %llu] (%.0f MiB each), TP=%d; reshard TP=%d",
                n, static_cast<unsigned long long>(rows), static_cast<unsigned long long>(cols),
                rows * cols * 4.0 / kMiB, l.save.tp, l.reshard.tp);
  l.description = buf;
  return l;
}

Layout LlmLayout(uint64_t bytes, int ranks) {
  Layout l;
  l.name = "llm";
  const uint64_t h = 1024, f = 2816, v = 8192;
  // 2 bytes (BF16 weight) + 8 bytes (two F32 Adam moments) per parameter.
  const double params = static_cast<double>(bytes) / 10.0;
  const double per_layer = 4.0 * h * h + 3.0 * h * f + 2.0 * h;
  const int layers = std::max(1, static_cast<int>((params - 2.0 * v * h) / per_layer + 0.5));
  std::vector<TensorDef> w;
  w.push_back({"model.embed_tokens.weight", DType::kBF16, {v, h}, 0});
  for (int i = 0; i < layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    w.push_back({p + "input_layernorm.weight", DType::kBF16, {h}, -1});
    for (const char* name : {"q_proj", "k_proj", "v_proj"}) {
      w.push_back({p + "self_attn." + name + ".weight", DType::kBF16, {h, h}, 0});
    }
    w.push_back({p + "self_attn.o_proj.weight", DType::kBF16, {h, h}, 1});
    w.push_back({p + "post_attention_layernorm.weight", DType::kBF16, {h}, -1});
    w.push_back({p + "mlp.gate_proj.weight", DType::kBF16, {f, h}, 0});
    w.push_back({p + "mlp.up_proj.weight", DType::kBF16, {f, h}, 0});
    w.push_back({p + "mlp.down_proj.weight", DType::kBF16, {h, f}, 1});
  }
  w.push_back({"model.norm.weight", DType::kBF16, {h}, -1});
  w.push_back({"lm_head.weight", DType::kBF16, {v, h}, 0});
  l.tensors = w;
  for (const char* m : {"exp_avg", "exp_avg_sq"}) {
    for (const TensorDef& t : w) {
      TensorDef o = t;
      o.key = std::string("optim.") + m + "." + t.key;
      o.dtype = DType::kF32;
      o.zero = true;
      l.tensors.push_back(o);
    }
  }
  const int tp = ranks >= 2 && ranks % 2 == 0 ? 2 : 1;
  l.save = {tp, ranks / tp};
  l.reshard = {ranks == 2 ? 1 : ranks, ranks == 2 ? 2 : 1};
  if (ranks == 1) l.reshard = {2, 1};
  char buf[240];
  std::snprintf(buf, sizeof buf,
                "%d layers h=%llu ffn=%llu vocab=%llu, %zu tensors: BF16 weights TP x DP "
                "replicated, F32 Adam moments ZeRO-flat; save TP=%d x DP=%d, reshard TP=%d x DP=%d",
                layers, static_cast<unsigned long long>(h), static_cast<unsigned long long>(f),
                static_cast<unsigned long long>(v), l.tensors.size(), l.save.tp, l.save.dp,
                l.reshard.tp, l.reshard.dp);
  l.description = buf;
  return l;
}

Layout SmallLayout(uint64_t bytes, int ranks) {
  Layout l;
  l.name = "small";
  const uint64_t count = std::max<uint64_t>(100, 20000 * bytes / (2 * kGiB));
  const uint64_t mean_elems = bytes / count / 4;
  for (uint64_t i = 0; i < count; ++i) {
    TensorDef t;
    t.key = "small." + std::to_string(i);
    t.dtype = DType::kF32;
    // Sizes vary +-25% around the mean (not 4 KiB multiples).
    const uint64_t e = mean_elems * 3 / 4 + (i * 7919) % (mean_elems / 2 + 1);
    t.shape = {e};
    t.round_robin = true;
    l.tensors.push_back(t);
  }
  l.save = {ranks, 1};
  l.reshard = {ranks > 1 ? ranks / 2 : 2, 1};
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "%llu F32 tensors of ~%.0f KB, whole, round-robin over %d ranks; reshard over %d",
                static_cast<unsigned long long>(count), mean_elems * 4 / 1e3, l.save.world(),
                l.reshard.world());
  l.description = buf;
  return l;
}

// The save states of a layout, carved out of `src` (pattern-filled).
struct SaveSide {
  std::vector<SaveState> states;  // per rank
  uint64_t unique_bytes = 0;
};

SaveSide BuildSave(const Layout& l, Arena& src) {
  const Par& par = l.save;
  src.Reset();
  SaveSide side;
  side.states.resize(par.world());
  // buffers[owner rank][tensor]
  std::vector<std::vector<const void*>> bufs(par.world(),
                                             std::vector<const void*>(l.tensors.size()));
  for (int r = 0; r < par.world(); ++r) {
    for (size_t i = 0; i < l.tensors.size(); ++i) {
      const TensorDef& t = l.tensors[i];
      auto s = SliceOf(t, i, par, r);
      if (!s) continue;
      const int owner = OwnerOf(t, par, r);
      if (owner == r) {
        const uint64_t b = s->NumElements() * ElemBytes(t.dtype);
        bufs[r][i] = src.Take(b);
        side.unique_bytes += b;
      }
      side.states[r].tensors.push_back({t.key, t.dtype, t.shape, *s, bufs[owner][i]});
    }
    side.states[r].values = R"({"step": 1})";
  }
  return side;
}

uint64_t SaveArenaBytes(const Layout& l) {
  uint64_t total = 0;
  for (int r = 0; r < l.save.world(); ++r) {
    for (size_t i = 0; i < l.tensors.size(); ++i) {
      auto s = SliceOf(l.tensors[i], i, l.save, r);
      if (s && OwnerOf(l.tensors[i], l.save, r) == r) {
        total += AlignUp(s->NumElements() * ElemBytes(l.tensors[i].dtype));
      }
    }
  }
  return total;
}

// Load requests of a layout, carved out of `dst`.
std::vector<LoadRequest> BuildLoad(const Layout& l, const Par& par, Arena& dst) {
  dst.Reset();
  std::vector<LoadRequest> reqs(par.world());
  for (int r = 0; r < par.world(); ++r) {
    for (size_t i = 0; i < l.tensors.size(); ++i) {
      const TensorDef& t = l.tensors[i];
      auto s = SliceOf(t, i, par, r);
      if (!s) continue;
      reqs[r].tensors.push_back(
          {t.key, t.dtype, t.shape, *s, dst.Take(s->NumElements() * ElemBytes(t.dtype))});
    }
  }
  return reqs;
}

uint64_t LoadArenaBytes(const Layout& l, const Par& par) {
  uint64_t total = 0;
  for (int r = 0; r < par.world(); ++r) {
    for (size_t i = 0; i < l.tensors.size(); ++i) {
      auto s = SliceOf(l.tensors[i], i, par, r);
      if (s) total += AlignUp(s->NumElements() * ElemBytes(l.tensors[i].dtype));
    }
  }
  return total;
}

// ------------------------------------------------------------ running --

struct Config {
  std::string dir = "./bench-out";
  double gib = 2;
  int ranks = 4;
  int reps = 3;
  bool quick = false;
  bool load_direct = true;  // LoadOptions::direct_io of the timed cold loads
  bool baselines = true;
  bool keep = false;
  std::vector<std::string> layouts = {"large", "llm", "small"};
};

struct LoadOutcome {
  double seconds = 0;
  uint64_t needed = 0;
  uint64_t read = 0;
};

LoadOutcome RunLoad(const std::vector<LoadRequest>& reqs, const std::string& path,
                    bool direct_io) {
  LoadOutcome out;
  std::mutex mu;
  out.seconds = RunRanks(static_cast<int>(reqs.size()), [&](int r, Comm& comm) {
    LoadOptions opts;
    opts.direct_io = direct_io;
    auto res = Load(reqs[r], path, comm, opts);
    Check(res.status(), "load " + path);
    std::lock_guard<std::mutex> lock(mu);
    out.needed += res->bytes_needed;
    out.read += res->bytes_read;
  });
  return out;
}

// Compares each same-layout destination with the saved shard.
void VerifySameLayout(const SaveSide& side, const std::vector<LoadRequest>& reqs) {
  for (size_t r = 0; r < reqs.size(); ++r) {
    const auto& saved = side.states[r].tensors;
    const auto& loaded = reqs[r].tensors;
    if (saved.size() != loaded.size()) Die("verify: tensor count differs");
    for (size_t i = 0; i < saved.size(); ++i) {
      const uint64_t b = saved[i].slice.NumElements() * ElemBytes(saved[i].dtype);
      if (std::memcmp(saved[i].data, loaded[i].data, b) != 0) {
        Die("verify: rank " + std::to_string(r) + " tensor " + saved[i].key + " differs");
      }
    }
  }
}

struct Row {
  Row(std::string l, std::string o) : layout(std::move(l)), op(std::move(o)) {}
  std::string layout, op;
  Stats gbps;
  std::string baseline;  // name of the denominator
  double base_gbps = 0;
  Stats amp;             // bytes read / bytes needed
  std::string note;
};

void PrintRow(const Row& row) {
  const double m = row.gbps.Median();
  char ratio[32] = "";
  if (row.base_gbps > 0) std::snprintf(ratio, sizeof ratio, "%.2f", m / row.base_gbps);
  char amp[32] = "";
  if (!row.amp.v.empty()) std::snprintf(amp, sizeof amp, "%.3f", row.amp.Median());
  std::printf("| %-6s | %-18s | %6.2f | %5.2f-%-5.2f | %-18s | %5s | %6s | %s |\n",
              row.layout.c_str(), row.op.c_str(), m, row.gbps.Min(), row.gbps.Max(),
              row.baseline.c_str(), ratio, amp, row.note.c_str());
}

void PrintHeader() {
  std::printf("| %-6s | %-18s | %6s | %-11s | %-18s | %5s | %6s | %s |\n", "layout", "op",
              "GB/s", "min-max", "vs baseline", "ratio", "rd/nd", "notes");
  std::printf("|--------|--------------------|--------|-------------|--------------------|-------|--------|-------|\n");
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= s.size()) {
    size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

int Run(int argc, char** argv) {
  Config cfg;
  bool gib_set = false, reps_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--dir") cfg.dir = next();
    else if (a == "--gib") cfg.gib = std::atof(next().c_str()), gib_set = true;
    else if (a == "--ranks") cfg.ranks = std::atoi(next().c_str());
    else if (a == "--reps") cfg.reps = std::atoi(next().c_str()), reps_set = true;
    else if (a == "--quick") cfg.quick = true;
    else if (a == "--load-buffered") cfg.load_direct = false;
    else if (a == "--no-baselines") cfg.baselines = false;
    else if (a == "--keep") cfg.keep = true;
    else if (a == "--layouts") cfg.layouts = Split(next());
    else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: save_load_benchmark [--dir D] [--gib G] [--ranks N] [--reps R] [--quick]\n"
          "                           [--layouts large,llm,small] [--load-buffered]\n"
          "                           [--no-baselines] [--keep]\n");
      return 0;
    } else {
      Die("unknown argument " + a);
    }
  }
  if (cfg.quick) {
    if (!gib_set) cfg.gib = 0.25;
    if (!reps_set) cfg.reps = 1;
  }
  if (cfg.ranks < 1 || cfg.reps < 1 || cfg.gib <= 0) Die("bad --ranks/--reps/--gib");
  const uint64_t bytes = AlignUp(static_cast<uint64_t>(cfg.gib * kGiB), kMiB);

  std::error_code ec;
  fs::create_directories(cfg.dir, ec);
  if (ec) Die("create " + cfg.dir + ": " + ec.message());
  const std::string ckpt_root = cfg.dir + "/ckpt";
  const std::string raw_dir = cfg.dir + "/raw";
  fs::remove_all(ckpt_root, ec);
  fs::remove_all(raw_dir, ec);
  fs::create_directories(ckpt_root);
  fs::create_directories(raw_dir);
  struct statvfs vfs;
  if (statvfs(cfg.dir.c_str(), &vfs) == 0) {
    const double avail = static_cast<double>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < 2.5 * bytes) {
      Die("not enough free space in " + cfg.dir + ": " + std::to_string(avail / kGiB) +
          " GiB available, need ~" + std::to_string(2.5 * bytes / kGiB));
    }
  }

  // Build the layouts first, to size the arenas.
  std::vector<Layout> layouts;
  for (const std::string& name : cfg.layouts) {
    if (name == "large") layouts.push_back(LargeLayout(bytes, cfg.ranks));
    else if (name == "llm") layouts.push_back(LlmLayout(bytes, cfg.ranks));
    else if (name == "small") layouts.push_back(SmallLayout(bytes, cfg.ranks));
    else Die("unknown layout " + name);
  }
  uint64_t src_bytes = bytes, dst_bytes = bytes;
  for (const Layout& l : layouts) {
    src_bytes = std::max(src_bytes, SaveArenaBytes(l));
    dst_bytes = std::max({dst_bytes, LoadArenaBytes(l, l.save), LoadArenaBytes(l, l.reshard)});
  }
  std::printf("shardsafe save/load benchmark: %.2f GiB, %d thread-ranks, %d rep(s), dir %s, "
              "%u cpus, load direct_io=%s\n",
              bytes / double(kGiB), cfg.ranks, cfg.reps, cfg.dir.c_str(),
              std::thread::hardware_concurrency(), cfg.load_direct ? "on" : "off");
  std::fprintf(stderr, "pre-faulting %.2f GiB of source and %.2f GiB of destination memory...\n",
               src_bytes / double(kGiB), dst_bytes / double(kGiB));
  Arena src(src_bytes), dst(dst_bytes);
  FillPattern(src.data(), src.size(), 42);

  // ---- baselines
  Row raw_w{"raw", "write O_DIRECT"}, raw_rd{"raw", "cold read O_DIRECT"},
      raw_rb{"raw", "cold read buffered"}, raw_hot{"raw", "hot read buffered"},
      mcp{"raw", "memcpy"};
  if (cfg.baselines) {
    for (int rep = 0; rep < cfg.reps; ++rep) {
      std::fprintf(stderr, "baselines rep %d...\n", rep + 1);
      raw_w.gbps.Add(bytes / RawWrite(raw_dir, src.data(), bytes, cfg.ranks) / 1e9);
      DropCaches();
      raw_rd.gbps.Add(bytes / RawRead(raw_dir, dst.data(), bytes, cfg.ranks, true) / 1e9);
      DropCaches();
      raw_rb.gbps.Add(bytes / RawRead(raw_dir, dst.data(), bytes, cfg.ranks, false) / 1e9);
      raw_hot.gbps.Add(bytes / RawRead(raw_dir, dst.data(), bytes, cfg.ranks, false) / 1e9);
      if (std::memcmp(src.data(), dst.data(), bytes) != 0) Die("raw read-back differs");
      mcp.gbps.Add(bytes / Memcpy(dst.data(), src.data(), bytes, cfg.ranks) / 1e9);
      fs::remove_all(raw_dir, ec);
      fs::create_directories(raw_dir);
    }
  }
  const std::string cold = g_drop_ok ? "cold" : "WARM (drop_caches failed)";
  raw_rd.note = cold;
  raw_rb.note = cold;
  raw_hot.note = "page cache";
  mcp.note = std::to_string(cfg.ranks) + " threads, pre-faulted";
  raw_w.note = std::to_string(cfg.ranks) + " files, 16 MiB requests, fdatasync";

  // ---- layouts
  std::vector<Row> rows;
  for (const Layout& l : layouts) {
    std::printf("layout %-5s: %s\n", l.name.c_str(), l.description.c_str());
    SaveSide side = BuildSave(l, src);
    Row save{l.name, "save"}, cold_load{l.name, "load cold"}, hot{l.name, "load hot"},
        resh{l.name, "load resharded"}, ablock{l.name, "async blocked"},
        adur{l.name, "async durable"}, ehot{l.name, "export-hf (cached)"},
        ecold{l.name, "export-hf cold"};
    ehot.baseline = ecold.baseline = "raw write";
    ehot.base_gbps = ecold.base_gbps = raw_w.gbps.Median();
    ablock.baseline = "memcpy";
    ablock.base_gbps = mcp.gbps.Median();
    adur.baseline = "save";
    // One saver per rank for all reps: staging is allocated once, reused.
    std::vector<std::unique_ptr<AsyncSaver>> savers;
    for (int r = 0; r < l.save.world(); ++r) savers.push_back(std::make_unique<AsyncSaver>());
    save.baseline = "raw write";
    save.base_gbps = raw_w.gbps.Median();
    cold_load.baseline = "raw cold read (D)";
    cold_load.base_gbps = raw_rd.gbps.Median();
    hot.baseline = "memcpy";
    hot.base_gbps = mcp.gbps.Median();
    resh.baseline = "load cold (same)";
    Stats cached_hot, delivered_same, delivered_resh;
    for (int rep = 0; rep < cfg.reps; ++rep) {
      std::fprintf(stderr, "layout %s rep %d...\n", l.name.c_str(), rep + 1);
      const std::string path = ckpt_root + "/" + l.name + "-rep" + std::to_string(rep);
      fs::remove_all(path, ec);
      sync();
      // Save.
      const double save_s = RunRanks(l.save.world(), [&](int r, Comm& comm) {
        Check(Save(side.states[r], path, comm, SaveOptions{}).status(), "save " + path);
      });
      save.gbps.Add(side.unique_bytes / save_s / 1e9);
      // Async save of the same state: time the callers were blocked, and
      // time until every rank's handle reports the commit.
      {
        const std::string tag = l.name + "-async" + std::to_string(rep);
        std::vector<std::shared_ptr<AsyncSaveHandle>> handles(l.save.world());
        const auto t0 = Clock::now();
        RunRanks(l.save.world(), [&](int r, Comm& comm) {
          auto h = savers[r]->Save(side.states[r], ckpt_root, tag, comm, SaveOptions{});
          Check(h.status(), "async save " + tag);
          handles[r] = *h;
        });
        double blocked = 0;
        for (auto& h : handles) {
          Check(h->Wait().status(), "async save " + tag);
          blocked = std::max(blocked, h->blocked_seconds());
        }
        const double durable = Secs(t0, Clock::now());
        ablock.gbps.Add(side.unique_bytes / blocked / 1e9);
        adur.gbps.Add(side.unique_bytes / durable / 1e9);
        if (!cfg.keep) fs::remove_all(ckpt_root + "/" + tag, ec);
      }
      // Cold load, same layout.
      auto reqs = BuildLoad(l, l.save, dst);
      std::memset(dst.data(), 0, dst.size());
      DropCaches();
      LoadOutcome c = RunLoad(reqs, path, cfg.load_direct);
      cold_load.gbps.Add(c.needed / c.seconds / 1e9);
      cold_load.amp.Add(static_cast<double>(c.read) / c.needed);
      delivered_same.Add(c.needed);
      if (rep == 0) VerifySameLayout(side, reqs);
      // Hot load, same layout, once a buffered load filled the page cache.
      RunLoad(reqs, path, false);
      cached_hot.Add(CachedFraction(path));
      LoadOutcome h = RunLoad(reqs, path, true);
      hot.gbps.Add(h.needed / h.seconds / 1e9);
      hot.amp.Add(static_cast<double>(h.read) / h.needed);
      // Resharded load, cold.
      auto rreqs = BuildLoad(l, l.reshard, dst);
      DropCaches();
      LoadOutcome x = RunLoad(rreqs, path, cfg.load_direct);
      resh.gbps.Add(x.needed / x.seconds / 1e9);
      resh.amp.Add(static_cast<double>(x.read) / x.needed);
      delivered_resh.Add(x.needed);
      // Export to a Hugging Face directory: source cached (a buffered load
      // puts it there), then cold (reads and writes share the disk).
      RunLoad(reqs, path, false);
      for (Row* row : {&ehot, &ecold}) {
        const std::string out = cfg.dir + "/export";
        fs::remove_all(out, ec);
        if (row == &ecold) DropCaches();
        ExportHfOptions eo;
        eo.max_shard_bytes = std::max<uint64_t>(side.unique_bytes / 4, 1);
        auto stats = ExportHf(path, out, eo);
        Check(stats.status(), "export " + path);
        row->gbps.Add(stats->bytes / stats->seconds / 1e9);
        char enote[160];
        std::snprintf(enote, sizeof enote, "%zu shards, %llu checksums verified, read/written %.2f",
                      stats->files.size() - 1, (unsigned long long)stats->chunks_verified,
                      double(stats->bytes_read) / stats->bytes);
        row->note = enote;
        fs::remove_all(out, ec);
      }
      if (!cfg.keep) fs::remove_all(path, ec);
    }
    resh.base_gbps = cold_load.gbps.Median();
    char note[200];
    std::snprintf(note, sizeof note, "%.3f GB unique, durable", side.unique_bytes / 1e9);
    save.note = note;
    std::snprintf(note, sizeof note, "%s; %.3f GB delivered", cold.c_str(),
                  delivered_same.Median() / 1e9);
    cold_load.note = note;
    std::snprintf(note, sizeof note, "%.0f%% of files in page cache before", 
                  100 * cached_hot.Median());
    hot.note = note;
    std::snprintf(note, sizeof note, "%s; TP=%d x DP=%d; %.3f GB delivered", cold.c_str(),
                  l.reshard.tp, l.reshard.dp, delivered_resh.Median() / 1e9);
    resh.note = note;
    adur.base_gbps = save.gbps.Median();
    ablock.note = "staging copy + CRC; the first rep allocates the staging arena";
    adur.note = "call to commit observed on every rank";
    rows.push_back(save);
    rows.push_back(ablock);
    rows.push_back(adur);
    rows.push_back(cold_load);
    rows.push_back(hot);
    rows.push_back(resh);
    rows.push_back(ehot);
    rows.push_back(ecold);
  }

  std::printf("\n");
  PrintHeader();
  if (cfg.baselines) {
    for (const Row* r : {&raw_w, &raw_rd, &raw_rb, &raw_hot, &mcp}) PrintRow(*r);
  }
  for (const Row& r : rows) PrintRow(r);
  if (!cfg.keep) {
    fs::remove_all(ckpt_root, ec);
    fs::remove_all(raw_dir, ec);
  }
  return 0;
}

}  // namespace
}  // namespace shardsafe

int main(int argc, char** argv) { return shardsafe::Run(argc, argv); }
