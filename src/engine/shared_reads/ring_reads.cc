#include "engine/shared_reads/ring_reads.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/agree.h"
#include "storage/aligned_buffer.h"

namespace shardsafe {

constexpr uint32_t kReaders = 4;  // a producer's reads in flight

// A data file read from a ring: blocks [first, end) of `role`'s sequence.
class RingReads::RingFile final : public RandomAccessFile {
 public:
  RingFile(SharedRing* ring, const RingRole& role, uint32_t first, uint32_t end, uint64_t size)
      : ring_(ring), role_(role), first_(first), end_(end), size_(size) {}

  Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
    if (n == 0) return Status();
    SS_ASSIGN_OR_RETURN(uint32_t k, Enter(offset));
    char* out = static_cast<char*>(dst);
    for (uint64_t pos = offset; n > 0; ++k) {
      if (k >= end_) return OutOfRing(pos);
      const RingBlock& b = role_.blocks[k];
      if (pos < b.offset || pos >= b.offset + b.length) return OutOfRing(pos);
      SS_ASSIGN_OR_RETURN(const char* data, ring_->WaitBlock(k));
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, b.offset + b.length - pos));
      std::memcpy(out, data + (pos - b.offset), take);
      out += take;
      pos += take;
      n -= take;
      if (n > 0) ring_->Release(role_.consumer, released_ = k + 1);  // later reads go further
    }
    return Status();
  }
  // The slot itself when the range lies in one block.
  Result<const char*> View(uint64_t offset, size_t n) const override {
    if (n == 0) return static_cast<const char*>(nullptr);
    SS_ASSIGN_OR_RETURN(uint32_t k, Enter(offset));
    const RingBlock& b = role_.blocks[k];
    if (offset + n > b.offset + b.length) return static_cast<const char*>(nullptr);
    SS_ASSIGN_OR_RETURN(const char* data, ring_->WaitBlock(k));
    return data + (offset - b.offset);
  }
  uint64_t size() const override { return size_; }
  bool FullyCached(uint64_t, size_t) const override { return true; }  // memory, once published

  // All of this file is read: release up to the next file this rank reads
  // from the same ring (blocks of files it does not read, it never holds).
  void Done() const { ring_->Release(role_.consumer, released_ = std::max(released_, next_)); }
  uint32_t first() const { return first_; }
  void set_next(uint32_t next) { next_ = next; }

 private:
  // The block holding byte `offset`; releases the blocks before it (reads
  // only go forward).
  Result<uint32_t> Enter(uint64_t offset) const {
    const auto begin = role_.blocks.begin() + first_, stop = role_.blocks.begin() + end_;
    auto it = std::upper_bound(begin, stop, offset,
                               [](uint64_t o, const RingBlock& b) { return o < b.offset; });
    if (it == begin) return OutOfRing(offset);
    const uint32_t k = static_cast<uint32_t>(it - role_.blocks.begin()) - 1;
    if (k < released_) {
      return InternalError("shared read at byte " + std::to_string(offset) +
                           " goes back to a block already released");
    }
    ring_->Release(role_.consumer, released_ = k);
    return k;
  }
  Status OutOfRing(uint64_t offset) const {
    return InternalError("shared read at byte " + std::to_string(offset) +
                         " is outside the blocks planned for it");
  }

  SharedRing* ring_;
  const RingRole& role_;
  const uint32_t first_, end_;
  const uint64_t size_;
  uint32_t next_ = SharedRing::kDetached;
  // Blocks before this one are released; only the one consumer thread reads.
  mutable uint32_t released_ = 0;
};

RingReads::~RingReads() = default;

const RandomAccessFile* RingReads::FileFor(uint32_t f) const {
  return f < files_.size() ? files_[f].get() : nullptr;
}

void RingReads::FileDone(uint32_t f) const {
  if (const RingFile* file = f < files_.size() ? files_[f].get() : nullptr) file->Done();
}

int RingReads::RingOf(uint32_t f) const {
  return f < files_.size() && files_[f] ? ring_of_file_[f] : -1;
}

void RingReads::Detach(int i) const {
  rings_[i]->Release(roles_[i].consumer, SharedRing::kDetached);
}

Status RingReads::Produce(FileSystem& fs, const std::vector<std::string>& paths,
                          const std::string& within) const {
  if (produced_ < 0) return Status();
  const RingRole& role = roles_[produced_];
  SharedRing& ring = *rings_[produced_];
  // kReaders blocks in flight (the disk wants a queue, not one request at a
  // time); reader i takes blocks i, i + readers, ... in order. Blocks are
  // published in order, each once it and all before it are in.
  const uint32_t readers = std::min<uint32_t>(kReaders, ring.slots());
  const uint32_t count = static_cast<uint32_t>(role.blocks.size());
  for (const RingBlock& b : role.blocks) {
    if (b.file >= paths.size() || b.file >= file_sizes_.size()) {
      return InternalError("ring block of an unknown data file");
    }
  }
  std::mutex mu;
  std::vector<bool> done(count, false);
  uint32_t next = 0;  // guarded by mu: the first block not yet published
  std::vector<Status> failed(readers);
  auto read = [&](uint32_t reader) {
    std::unique_ptr<RandomAccessFile> file;
    // Blocks are read into a private buffer and copied into their slot. The
    // buffer's pages are huge (AlignedBuffer asks for THP), so the disk gets
    // requests of up to max_sectors_kb; read straight into a slot's 4 KiB
    // shared-memory pages, a request spanned at most max_segments pages
    // (254 x 4 KiB here): 3x the requests, and the LLM-mix resharded load
    // took 1.3-2.25 s instead of 1.04-1.46 s. Reading into a private buffer
    // also does not wait for the slot to be free.
    AlignedBuffer staging = AcquireAlignedBuffer(ring.slot_bytes());
    auto read_block = [&](const RingBlock& b, uint32_t k) -> Status {
      if (!file || b.file != role.blocks[k - readers].file) {  // k >= readers: same reader
        const ReadOptions options{.direct = true, .within = within,
                                  .size = file_sizes_[b.file]};
        SS_ASSIGN_OR_RETURN(file, fs.NewRandomAccessFile(paths[b.file], options));
      }
      SS_RETURN_IF_ERROR(file->ReadAt(b.offset, staging.data(), b.length));
      SS_ASSIGN_OR_RETURN(char* slot, ring.AcquireSlot(k));
      std::memcpy(slot, staging.data(), b.length);
      return Status();
    };
    for (uint32_t k = reader; k < count; k += readers) {
      const RingBlock& b = role.blocks[k];
      if (Status s = read_block(b, k); !s.ok()) {
        s = s.WithContext("reading " + paths[b.file]);
        ring.Fail(s.ToString());
        failed[reader] = s;
        return;
      }
      std::lock_guard<std::mutex> lock(mu);
      done[k] = true;
      for (; next < count && done[next]; ++next) ring.Publish(next);
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t i = 1; i < readers; ++i) threads.emplace_back(read, i);
  read(0);
  for (std::thread& t : threads) t.join();
  for (const Status& s : failed) SS_RETURN_IF_ERROR(s);
  return Status();
}

Result<std::unique_ptr<RingReads>> SetUpRings(Comm& comm, const SharedReadPlan& plan,
                                              const std::vector<uint64_t>& file_sizes,
                                              std::chrono::milliseconds stall_timeout) {
  if (!plan.rings_anywhere) return std::unique_ptr<RingReads>();
  std::unique_ptr<RingReads> reads(new RingReads());
  reads->roles_ = plan.rings;
  reads->rings_.resize(plan.rings.size());
  Status created;
  if (plan.produced >= 0) {
    SharedRing::RemoveAbandoned();  // leftovers of crashed loads, before taking room
    const RingRole& role = plan.rings[plan.produced];
    Result<std::unique_ptr<SharedRing>> ring =
        SharedRing::Create(role.name, role.slots, role.slot_bytes, role.consumers, role.consumer,
                           comm.rank(), stall_timeout);
    created = ring.status();
    if (ring.ok()) reads->rings_[plan.produced] = std::move(*ring);
  }
  // A ring that some rank could not set up (or a failed agreement) means no
  // rings: the load reads through the page cache, and the names are removed.
  const bool all_created = AgreeOnStatus(comm, created).ok();
  Status opened;
  for (size_t i = 0; all_created && opened.ok() && i < plan.rings.size(); ++i) {
    if (static_cast<int>(i) == plan.produced) continue;
    Result<std::unique_ptr<SharedRing>> ring = SharedRing::Open(plan.rings[i].name, stall_timeout);
    opened = ring.status();
    if (ring.ok()) {
      (*ring)->Join(plan.rings[i].consumer, comm.rank());
      reads->rings_[i] = std::move(*ring);
    }
  }
  const bool all_opened = all_created && AgreeOnStatus(comm, opened).ok();
  // Every rank has mapped it (or given up): the name is no longer needed.
  if (plan.produced >= 0 && created.ok()) SharedRing::Unlink(plan.rings[plan.produced].name);
  if (!all_opened) return std::unique_ptr<RingReads>();
  for (const auto& ring : reads->rings_) ring->Watch();  // every process has joined
  reads->files_.resize(file_sizes.size());
  reads->file_sizes_ = file_sizes;
  for (uint32_t f = 0; f < file_sizes.size(); ++f) {
    const int i = f < plan.ring_of_file.size() ? plan.ring_of_file[f] : -1;
    if (i < 0) continue;
    const RingRole& role = reads->roles_[i];
    const auto in_f = [f](const RingBlock& b) { return b.file == f; };
    const auto first = std::find_if(role.blocks.begin(), role.blocks.end(), in_f);
    const auto end = std::find_if_not(first, role.blocks.end(), in_f);
    reads->files_[f] = std::make_unique<RingReads::RingFile>(
        reads->rings_[i].get(), role, static_cast<uint32_t>(first - role.blocks.begin()),
        static_cast<uint32_t>(end - role.blocks.begin()), file_sizes[f]);
  }
  // Each ring: this rank needs nothing before the first file it reads from
  // it, nor between one such file and the next (docs/design.md).
  std::vector<RingReads::RingFile*> last(plan.rings.size(), nullptr);
  for (uint32_t f = 0; f < reads->files_.size(); ++f) {
    RingReads::RingFile* file = reads->files_[f].get();
    if (!file) continue;
    const int i = plan.ring_of_file[f];
    if (last[i]) {
      last[i]->set_next(file->first());
    } else {
      reads->rings_[i]->Release(reads->roles_[i].consumer, file->first());
    }
    last[i] = file;
  }
  reads->ring_of_file_ = plan.ring_of_file;
  reads->produced_ = plan.produced;
  return reads;
}

}  // namespace shardsafe
