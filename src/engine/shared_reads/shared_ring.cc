#include "engine/shared_reads/shared_ring.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>

#include "storage/aligned_buffer.h"

namespace shardsafe {
namespace {

constexpr uint64_t kMagic = 0x676e69526e616853;  // "ShanRing"
constexpr auto kPoll = std::chrono::milliseconds(50);  // liveness checks while waiting

static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Sleeps until *word may differ from `seen` (or kPoll passes). Shared, not
// private, futex: the word lives in memory other processes map.
void FutexWait(std::atomic<uint32_t>* word, uint32_t seen) {
  timespec ts{0, std::chrono::nanoseconds(kPoll).count()};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
          0);
}

// This process's pid namespace (0 if unknown): pids written by processes of
// another namespace mean nothing here.
uint64_t PidNamespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// A pidfd for `pid`, or -1 (no such process here, or pidfds refused).
int PidFd(int32_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// True once the process behind `pidfd` has exited (zombies included).
bool Exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

}  // namespace

// A process taking part (a consumer, the producer among them): pid is set
// last (release), when the rest is valid.
struct SharedRing::Process {
  std::atomic<int32_t> pid;
  int32_t rank;
  uint64_t pid_namespace;
};

struct SharedRing::Header {
  uint64_t magic;
  uint32_t slots;
  uint32_t consumers;
  uint64_t slot_bytes;
  uint64_t data_offset;
  std::atomic<uint32_t> published;    // blocks published so far
  std::atomic<uint32_t> release_seq;  // bumped on every release (the producer waits on it)
  std::atomic<uint32_t> failed;
  char message[512];
  uint32_t producer;  // the producer's index among the consumers
  std::atomic<uint32_t> released[kMaxConsumers];
  Process consumer[kMaxConsumers];
};

SharedRing::SharedRing(void* base, size_t bytes, std::chrono::milliseconds stall_timeout)
    : header_(static_cast<Header*>(base)), mapped_bytes_(bytes), stall_timeout_(stall_timeout) {}

SharedRing::~SharedRing() {
  for (const Watched& w : watched_) close(w.pidfd);
  munmap(header_, mapped_bytes_);
}

// The segment `name` of `bytes`, mapped. Its pages are reserved, not
// touched: the producer's first reads into each slot fault them in, on its
// reader threads while other reads are in flight (MAP_POPULATE here put
// 30-150 ms of page clearing before any read on these VMs).
Result<void*> SharedRing::Allocate(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "create shared memory", name);
  // posix_fallocate, not ftruncate: a full /dev/shm fails here, not with
  // SIGBUS on first touch.
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = rc == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                       : MAP_FAILED;
  const int err = rc != 0 ? rc : errno;
  close(fd);
  if (base != MAP_FAILED) return base;
  shm_unlink(name.c_str());
  Status s = ErrnoError(err, "allocate " + std::to_string(bytes) + " bytes of shared memory", name);
  const bool no_room = err == ENOSPC || err == ENOMEM || err == EFBIG;  // EFBIG: a size limit
  return no_room ? ResourceExhaustedError(s.message()) : s;
}

Result<std::unique_ptr<SharedRing>> SharedRing::Create(const std::string& name, uint32_t slots,
                                                       uint64_t slot_bytes, uint32_t consumers,
                                                       uint32_t self, int rank,
                                                       std::chrono::milliseconds stall_timeout) {
  if (slots == 0 || consumers == 0 || consumers > kMaxConsumers || self >= consumers ||
      !IsAligned(slot_bytes)) {
    return InvalidArgumentError("shared ring " + name + ": bad geometry");
  }
  const size_t data_offset = AlignUp(sizeof(Header));
  Result<void*> base = Allocate(name, data_offset + size_t{slots} * slot_bytes);
  while (!base.ok() && base.status().code() == StatusCode::kResourceExhausted && slots > 2) {
    slots /= 2;  // /dev/shm may be small (a container's 64 MiB)
    base = Allocate(name, data_offset + size_t{slots} * slot_bytes);
  }
  SS_RETURN_IF_ERROR(base.status());
  const size_t bytes = data_offset + size_t{slots} * slot_bytes;
  auto* h = new (*base) Header{};
  h->slots = slots;
  h->consumers = consumers;
  h->slot_bytes = slot_bytes;
  h->data_offset = data_offset;
  for (auto& r : h->released) r.store(0, std::memory_order_relaxed);
  h->producer = self;
  auto ring = std::unique_ptr<SharedRing>(new SharedRing(*base, bytes, stall_timeout));
  ring->Join(self, rank);
  std::atomic_ref<uint64_t>(h->magic).store(kMagic, std::memory_order_release);
  return ring;
}

Result<std::unique_ptr<SharedRing>> SharedRing::Open(const std::string& name,
                                                     std::chrono::milliseconds stall_timeout) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoError(errno, "open shared memory", name);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoError(err, "stat shared memory", name);
  }
  if (static_cast<size_t>(st.st_size) < sizeof(Header)) {
    close(fd);
    return InternalError("shared memory " + name + ": not a shardsafe ring");
  }
  void* base =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) return ErrnoError(err, "map shared memory", name);
  auto ring = std::unique_ptr<SharedRing>(
      new SharedRing(base, static_cast<size_t>(st.st_size), stall_timeout));
  const Header& h = *ring->header_;
  const bool sane =
      std::atomic_ref<const uint64_t>(h.magic).load(std::memory_order_acquire) == kMagic &&
      h.consumers <= kMaxConsumers && h.producer < h.consumers &&
      h.data_offset >= sizeof(Header) &&
      h.data_offset + uint64_t{h.slots} * h.slot_bytes <= static_cast<uint64_t>(st.st_size);
  if (!sane) return InternalError("shared memory " + name + ": not a shardsafe ring");
  return ring;
}

void SharedRing::Unlink(const std::string& name) { shm_unlink(name.c_str()); }

// The pid of the producer that created ring `name`, when it is a complete
// ring of this pid namespace; 0 otherwise.
int32_t SharedRing::ProducerOf(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct stat st {};
  const size_t need = AlignUp(sizeof(Header));
  void* base = fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= need
                   ? mmap(nullptr, need, PROT_READ, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  close(fd);
  if (base == MAP_FAILED) return 0;
  int32_t pid = 0;
  const auto* h = static_cast<const Header*>(base);
  if (std::atomic_ref<const uint64_t>(h->magic).load(std::memory_order_acquire) == kMagic &&
      h->producer < kMaxConsumers && h->consumer[h->producer].pid_namespace == PidNamespace()) {
    pid = h->consumer[h->producer].pid.load(std::memory_order_acquire);
  }
  munmap(base, need);
  return pid;
}

int SharedRing::RemoveAbandoned() {
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind("shardsafe-", 0) != 0) continue;
    const int32_t pid = ProducerOf("/" + file);
    if (pid <= 0) continue;
    const int fd = PidFd(pid);
    if (fd >= 0) {
      close(fd);  // alive
    } else if (errno == ESRCH && shm_unlink(("/" + file).c_str()) == 0) {
      ++removed;
    }
  }
  return removed;
}

uint64_t SharedRing::slot_bytes() const { return header_->slot_bytes; }
uint32_t SharedRing::slots() const { return header_->slots; }

void SharedRing::Join(uint32_t c, int rank) {
  if (c >= header_->consumers) return;
  Process& p = header_->consumer[c];
  p.rank = rank;
  p.pid_namespace = PidNamespace();
  p.pid.store(getpid(), std::memory_order_release);
}

void SharedRing::Watch() {
  const uint64_t ns = PidNamespace();
  const uint32_t producer = header_->producer;
  const bool producing = header_->consumer[producer].pid.load(std::memory_order_acquire) == getpid();
  for (uint32_t c = 0; c < header_->consumers; ++c) {
    if (!producing && c != producer) continue;  // a consumer waits only on the producer
    const Process& p = header_->consumer[c];
    const int32_t pid = p.pid.load(std::memory_order_acquire);
    if (pid <= 0 || pid == getpid() || ns == 0 || p.pid_namespace != ns) continue;
    const int fd = PidFd(pid);
    if (fd >= 0) watched_.push_back({fd, p.rank, pid, c});
  }
}

template <typename Blocking>
const SharedRing::Watched* SharedRing::ExitedPeer(Blocking blocking) const {
  for (const Watched& w : watched_) {
    if (blocking(w.consumer) && Exited(w.pidfd)) return &w;
  }
  return nullptr;
}

Status SharedRing::PeerExited(const Watched& w, const std::string& what) {
  return UnavailableError("shared read: rank " + std::to_string(w.rank) + " (pid " +
                          std::to_string(w.pid) + "), " + what + ", exited");
}

char* SharedRing::Slot(uint32_t block) const {
  return reinterpret_cast<char*>(header_) + header_->data_offset +
         (block % header_->slots) * header_->slot_bytes;
}

Result<char*> SharedRing::AcquireSlot(uint32_t block) {
  Header& h = *header_;
  if (block < h.slots) return Slot(block);
  const uint32_t need = block - h.slots + 1;  // releases of every consumer
  auto since = std::chrono::steady_clock::now();  // the last progress
  uint32_t last_low = 0;
  for (;;) {
    const uint32_t seq = h.release_seq.load(std::memory_order_acquire);
    uint32_t low = kDetached;
    for (uint32_t c = 0; c < h.consumers; ++c) {
      low = std::min(low, h.released[c].load(std::memory_order_acquire));
    }
    if (low >= need) return Slot(block);
    const auto now = std::chrono::steady_clock::now();
    if (low != last_low) {
      last_low = low;
      since = now;
    } else if (now - since >= kPoll) {  // quiet for a futex timeout: anyone gone?
      if (const Watched* gone = ExitedPeer([&](uint32_t c) {
            return h.released[c].load(std::memory_order_acquire) < need;
          })) {
        return PeerExited(*gone, "which has yet to take block " + std::to_string(need - 1));
      }
      if (now - since > stall_timeout_) {
        return UnavailableError("shared read: no rank took block " + std::to_string(low) +
                                " for " + std::to_string(stall_timeout_.count()) +
                                " ms (did a rank stop?)");
      }
    }
    FutexWait(&h.release_seq, seq);
  }
}

void SharedRing::Publish(uint32_t block) {
  header_->published.store(block + 1, std::memory_order_release);
  FutexWakeAll(&header_->published);
}

void SharedRing::Fail(const std::string& message) {
  Header& h = *header_;
  if (h.failed.load(std::memory_order_acquire) == 0) {
    const size_t n = std::min(message.size(), sizeof h.message - 1);
    std::memcpy(h.message, message.data(), n);
    h.message[n] = '\0';
    h.failed.store(1, std::memory_order_release);
  }
  FutexWakeAll(&h.published);
}

Result<const char*> SharedRing::WaitBlock(uint32_t block) {
  Header& h = *header_;
  auto since = std::chrono::steady_clock::now();  // the last progress
  uint32_t last = h.published.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t published = h.published.load(std::memory_order_acquire);
    if (published > block) return Slot(block);
    if (h.failed.load(std::memory_order_acquire) != 0) {
      return UnavailableError(std::string("shared read: the reading rank failed: ") + h.message);
    }
    const auto now = std::chrono::steady_clock::now();
    if (published != last) {
      last = published;
      since = now;
    } else if (now - since >= kPoll) {  // quiet for a futex timeout: is the producer gone?
      if (const Watched* gone = ExitedPeer([&](uint32_t c) { return c == h.producer; })) {
        return PeerExited(*gone, "which reads the blocks of this ring");
      }
      if (now - since > stall_timeout_) {
        return UnavailableError("shared read: block " + std::to_string(block) +
                                " did not come for " + std::to_string(stall_timeout_.count()) +
                                " ms (did the reading rank stop?)");
      }
    }
    FutexWait(&h.published, published);
  }
}

void SharedRing::Release(uint32_t c, uint32_t blocks) {
  Header& h = *header_;
  if (c >= h.consumers) return;
  if (h.released[c].load(std::memory_order_relaxed) >= blocks) return;
  h.released[c].store(blocks, std::memory_order_release);
  h.release_seq.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&h.release_seq);
}

}  // namespace shardsafe
