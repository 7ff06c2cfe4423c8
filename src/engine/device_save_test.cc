// Saves of shards that live on a device (TensorShard::on_device), sync and
// async, and loads into targets on a device (TensorTarget::on_device),
// through a DeviceMemory test double whose "device addresses" no CPU access
// can use: the engine must move every byte through CopyToHost and
// CopyToDevice.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "shardsafe/async_save.h"
#include "shardsafe/device_memory.h"
#include "shardsafe/source.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using Json = nlohmann::json;

using ::testing::HasSubstr;

// Host memory posing as device memory: its device address is the host
// address with bit 47 flipped, which no x86-64 or AArch64 user-space load
// accepts (reading one faults), so an engine that read a device shard
// directly would crash the test. Records what it was asked to do; fails
// every copy once `fail_from` copies were made. Copies to the device must
// come from memory registered with it (a load's staging buffers). Checks the contract that a
// copy reads within one shard (given by Watch): two shards may lie back to
// back in device memory, and a device may not take a copy across them.
class ShiftedDevice final : public DeviceMemory {
 public:
  static const void* ToDevice(const void* host) { return Flip(host); }

  // The device shards of `state`: every copy must lie within one of them.
  void Watch(const SaveState& state) {
    for (const TensorShard& t : state.tensors) {
      if (!t.on_device) continue;
      const auto start = reinterpret_cast<uintptr_t>(t.data);
      shards_[start] = start + *NumBytes(t.dtype, t.slice.NumElements());
    }
  }

  Status CopyToHost(std::span<const Copy> copies) override {
    return CopyAll(copies, /*to_device=*/false);
  }
  Status CopyToDevice(std::span<const Copy> copies) override {
    return CopyAll(copies, /*to_device=*/true);
  }
  void Register(void* host, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_TRUE(registered_.emplace(host, bytes).second) << "registered twice";
    ++registrations_;
    registered_bytes_ += bytes;
    peak_registered_bytes_ = std::max(peak_registered_bytes_, registered_bytes_);
  }
  void Unregister(void* host, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = registered_.find(host);
    ASSERT_NE(it, registered_.end()) << "unregistered what was not registered";
    EXPECT_EQ(it->second, bytes);
    registered_.erase(it);
    registered_bytes_ -= bytes;
  }

  void FailFrom(uint64_t copies) { fail_from_ = copies; }
  uint64_t copies_made() const { return copies_made_; }
  uint64_t bytes_copied() const { return bytes_copied_; }
  size_t largest_copy() const { return largest_copy_; }
  int registrations() const { return registrations_; }
  uint64_t peak_registered_bytes() const { return peak_registered_bytes_; }
  std::map<void*, size_t> registered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return registered_;
  }

 private:
  // Checks and makes each copy: from a shard, or to the device from
  // registered memory; the device side's address is flipped.
  Status CopyAll(std::span<const Copy> copies, bool to_device) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Copy& c : copies) {
      if (copies_made_ >= fail_from_) return UnavailableError("device copy failed (injected)");
      if (to_device ? !FromRegistered(c) : !WithinAShard(c)) {
        ADD_FAILURE() << "a copy of " << c.bytes << " bytes "
                      << (to_device ? "to the device from unregistered memory"
                                    : "reads beyond its shard");
        return InternalError("a copy out of bounds");
      }
      void* dst = to_device ? const_cast<void*>(Flip(c.dst)) : c.dst;
      std::memcpy(dst, to_device ? c.src : Flip(c.src), c.bytes);
      ++copies_made_;
      bytes_copied_ += c.bytes;
      largest_copy_ = std::max(largest_copy_, c.bytes);
    }
    return Status();
  }
  static const void* Flip(const void* p) {
    return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) ^ (uintptr_t{1} << 47));
  }
  bool FromRegistered(const Copy& c) const {
    const auto* src = static_cast<const char*>(c.src);
    auto it = registered_.upper_bound(const_cast<char*>(src));
    return it != registered_.begin() &&
           src + c.bytes <= static_cast<const char*>(std::prev(it)->first) + std::prev(it)->second;
  }
  bool WithinAShard(const Copy& c) const {
    if (shards_.empty()) return true;  // nothing watched
    const auto src = reinterpret_cast<uintptr_t>(c.src);
    auto it = shards_.upper_bound(src);
    return it != shards_.begin() && src + c.bytes <= std::prev(it)->second;
  }
  mutable std::mutex mu_;
  std::map<uintptr_t, uintptr_t> shards_;  // start -> end of the watched shards
  uint64_t fail_from_ = UINT64_MAX;
  uint64_t copies_made_ = 0, bytes_copied_ = 0;
  size_t largest_copy_ = 0;
  int registrations_ = 0;
  std::map<void*, size_t> registered_;
  uint64_t registered_bytes_ = 0, peak_registered_bytes_ = 0;
};

const Shape kBig{4100, 2048};  // F32: 32 MiB, several copy pieces and write buffers
const Shape kSmall{64, 48};

// Rank r of 2 holds rows [r*half, (r+1)*half) of "big" on the device, a flat
// half of "small" on the host, and "tiny" (replicated: one rank writes it)
// on the device.
struct DeviceState {
  std::vector<OwnedShard> shards;
  SaveState state;
  uint64_t device_bytes = 0;
};

DeviceState MakeDeviceState(int r) {
  DeviceState s;
  const uint64_t half = kBig[0] / 2, n = kSmall[0] * kSmall[1];
  s.shards.push_back(MakeShard("big", DType::kF32, kBig, {Box{{half * r, 0}, {half, 2048}}, {}}));
  s.shards.push_back(
      MakeShard("small", DType::kBF16, kSmall,
                {Box::Whole(kSmall), FlatRange{n * r / 2, n * (r + 1) / 2}}));
  s.shards.push_back(MakeShard("tiny", DType::kI64, {5}, {Box::Whole({5}), {}}));
  for (size_t i = 0; i < s.shards.size(); ++i) {
    TensorShard t = s.shards[i].View();
    if (i != 1) {
      t.data = ShiftedDevice::ToDevice(t.data);
      t.on_device = true;
    }
    s.state.tensors.push_back(t);
  }
  s.device_bytes = s.shards[0].bytes.size();
  s.state.values = R"({"step": 1})";
  return s;
}

class DeviceSaveTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("device"); }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Two ranks load every tensor of `path` in another layout (column halves
  // of "big", whole "small" and "tiny"), checksums verified.
  void ExpectLoads(const std::string& path) {
    RunRanks(2, [&](int r, Comm& comm) {
      std::vector<OwnedTarget> targets;
      targets.push_back(
          MakeTarget("big", DType::kF32, kBig, {Box{{0, 1024u * r}, {4100, 1024}}, {}}));
      targets.push_back(MakeTarget("small", DType::kBF16, kSmall, {Box::Whole(kSmall), {}}));
      targets.push_back(MakeTarget("tiny", DType::kI64, {5}, {Box::Whole({5}), {}}));
      LoadRequest req;
      for (auto& t : targets) req.tensors.push_back(t.target);
      auto res = Load(req, path, comm, {});
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      for (const auto& t : targets) EXPECT_TRUE(MatchesOracle(t)) << t.target.key;
    });
  }

  std::string root_;
};

TEST_F(DeviceSaveTest, SyncSaveStreamsDeviceShardsThroughBoundedBuffers) {
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    const std::string path = root_ + (direct ? "/direct" : "/buffered");
    std::vector<std::shared_ptr<ShiftedDevice>> devices(2);
    RunRanks(2, [&](int r, Comm& comm) {
      DeviceState s = MakeDeviceState(r);
      devices[r] = std::make_shared<ShiftedDevice>();
      devices[r]->Watch(s.state);
      SaveOptions opts;
      opts.direct_io = direct;
      opts.io_buffer_bytes = 4 << 20;
      opts.device = devices[r];
      auto saved = Save(s.state, path, comm, opts);
      ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    });
    ExpectLoads(path);
    uint64_t copied = 0;
    for (const auto& d : devices) {
      copied += d->bytes_copied();
      // Each copy fills one write buffer (or the default's bounce buffer):
      // nothing of the state is staged whole.
      EXPECT_LE(d->largest_copy(), size_t{4} << 20);
      EXPECT_EQ(d->registrations(), 0);
    }
    // Each device byte copied once, and the replicated "tiny" once more, by
    // the holder that does not write it, to check it against the writer's.
    EXPECT_EQ(copied, 2 * MakeDeviceState(0).device_bytes + 2 * 5 * 8)
        << "each device byte copied once, replicas once more";
  }
}

TEST_F(DeviceSaveTest, AsyncSaveCopiesDeviceShardsIntoTheRegisteredStaging) {
  std::vector<std::shared_ptr<ShiftedDevice>> devices(2);
  RunRanks(2, [&](int r, Comm& comm) {
    devices[r] = std::make_shared<ShiftedDevice>();
    {
      AsyncSaver saver;
      SaveOptions opts;
      opts.device = devices[r];
      for (int step : {1, 2}) {
        DeviceState s = MakeDeviceState(r);
        devices[r]->Watch(s.state);
        auto h = saver.Save(s.state, root_, "step-" + std::to_string(step), comm, opts);
        ASSERT_TRUE(h.ok()) << h.status().ToString();
        // The device's memory (and the host's) may change once the call returns.
        for (auto& sh : s.shards) std::fill(sh.bytes.begin(), sh.bytes.end(), std::byte{0x55});
        auto stats = (*h)->Wait();
        ASSERT_TRUE(stats.ok()) << stats.status().ToString();
        // The staging arena is registered once, whole, and kept across saves.
        auto registered = devices[r]->registered();
        ASSERT_EQ(registered.size(), 1u);
        EXPECT_EQ(registered.begin()->second, saver.staging_bytes());
      }
      EXPECT_EQ(devices[r]->registrations(), 1);
      // Consecutive pieces of a tensor go as one copy.
      EXPECT_LE(devices[r]->copies_made(), 2u * 2);
    }
    EXPECT_TRUE(devices[r]->registered().empty()) << "the saver unregisters before freeing";
  });
  ExpectLoads(root_ + "/step-1");
  ExpectLoads(root_ + "/step-2");
}

// Two tensors back to back in one device allocation (as a caching allocator
// places them), written one after the other into one file: each is copied
// on its own, sync and async, never as one copy spanning both.
TEST_F(DeviceSaveTest, ShardsBackToBackOnTheDeviceAreCopiedApart) {
  RunRanks(1, [&](int, Comm& comm) {
    OwnedShard p = MakeShard("p", DType::kF32, {1000, 1000}, {Box::Whole({1000, 1000}), {}});
    OwnedShard q = MakeShard("q", DType::kF32, {3000}, {Box::Whole({3000}), {}});
    std::vector<std::byte> block(p.bytes);
    block.insert(block.end(), q.bytes.begin(), q.bytes.end());
    SaveState state;
    state.tensors = {p.View(), q.View()};
    state.tensors[0].data = ShiftedDevice::ToDevice(block.data());
    state.tensors[1].data = ShiftedDevice::ToDevice(block.data() + p.bytes.size());
    for (TensorShard& t : state.tensors) t.on_device = true;
    auto device = std::make_shared<ShiftedDevice>();
    device->Watch(state);
    SaveOptions opts;
    opts.device = device;
    ASSERT_TRUE(Save(state, root_ + "/sync", comm, opts).ok());
    AsyncSaver saver;
    auto h = saver.Save(state, root_, "async", comm, opts);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    Status async = (*h)->Wait().status();
    ASSERT_TRUE(async.ok()) << async.ToString();
    for (const char* tag : {"/sync", "/async"}) {
      std::vector<OwnedTarget> targets;
      targets.push_back(MakeTarget("p", DType::kF32, {1000, 1000}, {Box::Whole({1000, 1000}), {}}));
      targets.push_back(MakeTarget("q", DType::kF32, {3000}, {Box::Whole({3000}), {}}));
      LoadRequest req;
      for (auto& t : targets) req.tensors.push_back(t.target);
      auto res = Load(req, root_ + tag, comm, {});
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      for (const auto& t : targets) EXPECT_TRUE(MatchesOracle(t)) << tag << " " << t.target.key;
    }
  });
}

TEST_F(DeviceSaveTest, ReserveRegistersTheStagingAndGrowingReplacesIt) {
  RunRanks(1, [&](int, Comm& comm) {
    auto device = std::make_shared<ShiftedDevice>();
    AsyncSaver saver;
    SaveOptions opts;
    opts.device = device;
    // One whole tensor on the device: 64 B, then 32 MiB.
    auto on_device = [](const OwnedShard& shard) {
      SaveState state;
      state.tensors.push_back(shard.View());
      state.tensors.back().data = ShiftedDevice::ToDevice(shard.bytes.data());
      state.tensors.back().on_device = true;
      return state;
    };
    OwnedShard small = MakeShard("t", DType::kF32, {16}, {Box::Whole({16}), {}});
    ASSERT_TRUE(saver.Reserve(on_device(small), comm, opts).ok());
    auto first = device->registered();
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(first.begin()->second, saver.staging_bytes());
    EXPECT_EQ(device->copies_made(), 0u) << "a reservation copies nothing";
    // A larger state needs a larger arena: the old one is unregistered first.
    OwnedShard big = MakeShard("t", DType::kF32, kBig, {Box::Whole(kBig), {}});
    auto h = saver.Save(on_device(big), root_, "grown", comm, opts);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE((*h)->Wait().ok());
    auto second = device->registered();
    ASSERT_EQ(second.size(), 1u);
    EXPECT_EQ(second.begin()->second, saver.staging_bytes());
    EXPECT_GT(saver.staging_bytes(), first.begin()->second);
    EXPECT_EQ(device->registrations(), 2);
  });
}

// A failed device copy, sync or async, commits nothing and names the cause
// (the sync save also the tensor); the previous checkpoint still loads.
TEST_F(DeviceSaveTest, FailedDeviceCopyCommitsNothing) {
  RunRanks(2, [&](int r, Comm& comm) {
    DeviceState s = MakeDeviceState(r);
    SaveOptions opts;
    opts.io_buffer_bytes = 4 << 20;  // "big" takes several copies
    opts.device = std::make_shared<ShiftedDevice>();
    ASSERT_TRUE(Save(s.state, root_ + "/good", comm, opts).ok());
    auto failing = std::make_shared<ShiftedDevice>();
    failing->FailFrom(r == 1 ? 1 : UINT64_MAX);  // rank 1's second copy fails
    opts.device = failing;
    Status sync = Save(s.state, root_ + "/sync", comm, opts).status();
    EXPECT_TRUE(IsError(sync, StatusCode::kUnavailable, "rank 1: copying tensor \"big\"")) << r;
    EXPECT_THAT(sync.message(), HasSubstr("from the device: device copy failed (injected)")) << r;
    failing->FailFrom(0);
    AsyncSaver saver;
    auto h = saver.Save(s.state, root_, "async", comm, opts);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    Status async = (*h)->Wait().status();
    EXPECT_THAT(async.message(), HasSubstr("device copy failed (injected)"));
  });
  EXPECT_FALSE(std::filesystem::exists(root_ + "/sync"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/async"));
  ExpectLoads(root_ + "/good");
}

TEST_F(DeviceSaveTest, DeviceShardWithoutDeviceMemoryIsRefusedOnEveryRank) {
  RunRanks(2, [&](int r, Comm& comm) {
    DeviceState s = MakeDeviceState(r);
    if (r == 0) {
      for (TensorShard& t : s.state.tensors) {
        t.on_device = false;
        t.data = s.shards[&t - s.state.tensors.data()].bytes.data();
      }
    }
    Status sync = Save(s.state, root_ + "/x", comm, {}).status();
    EXPECT_TRUE(IsError(sync, StatusCode::kInvalidArgument, "tensor \"big\" is on a device"))
        << r;
    AsyncSaver saver;
    EXPECT_TRUE(IsError(saver.Save(s.state, root_, "y", comm, {}), StatusCode::kInvalidArgument,
                        "tensor \"big\" is on a device"))
        << r;
  });
  EXPECT_FALSE(std::filesystem::exists(root_ + "/x"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/y"));
}

// The state of MakeDeviceState, saved from host memory by two ranks.
void SaveFromHost(const std::string& path) {
  RunRanks(2, [&](int r, Comm& comm) {
    DeviceState s = MakeDeviceState(r);
    for (size_t i = 0; i < s.state.tensors.size(); ++i) {
      s.state.tensors[i].on_device = false;
      s.state.tensors[i].data = s.shards[i].bytes.data();
    }
    ASSERT_TRUE(Save(s.state, path, comm, {}).ok());
  });
}

// Targets on the "device" in another layout than saved: "big" whole and a
// column half of it, a flat range of "small", "tiny" whole.
struct DeviceTargets {
  std::vector<OwnedTarget> owned;
  LoadRequest request;
  uint64_t bytes = 0;
};

DeviceTargets MakeDeviceTargets() {
  DeviceTargets d;
  const uint64_t n = kSmall[0] * kSmall[1];
  d.owned.push_back(MakeTarget("big", DType::kF32, kBig, {Box::Whole(kBig), {}}));
  d.owned.push_back(MakeTarget("big", DType::kF32, kBig, {Box{{0, 1024}, {4100, 1024}}, {}}));
  d.owned.push_back(
      MakeTarget("small", DType::kBF16, kSmall, {Box::Whole(kSmall), FlatRange{7, n - 9}}));
  d.owned.push_back(MakeTarget("tiny", DType::kI64, {5}, {Box::Whole({5}), {}}));
  for (OwnedTarget& t : d.owned) {
    TensorTarget target = t.target;
    target.data = const_cast<void*>(ShiftedDevice::ToDevice(t.target.data));
    target.on_device = true;
    d.request.tensors.push_back(target);
    d.bytes += t.buffer.size() - 1;
  }
  return d;
}

TEST_F(DeviceSaveTest, LoadIntoDeviceTargetsGoesThroughBoundedRegisteredStaging) {
  SaveFromHost(root_ + "/ckpt");
  DeviceTargets d = MakeDeviceTargets();
  auto device = std::make_shared<ShiftedDevice>();
  LoadOptions options;
  options.device = device;
  options.device_staging_bytes = 4 << 20;  // "big" alone is 32 MiB
  auto comm = MakeSingleProcessComm();
  auto res = Load(d.request, root_ + "/ckpt", *comm, options);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  for (const OwnedTarget& t : d.owned) EXPECT_TRUE(MatchesOracle(t)) << t.target.key;
  EXPECT_EQ(device->bytes_copied(), d.bytes) << "each target byte copied to the device once";
  EXPECT_LE(device->peak_registered_bytes(), uint64_t{4} << 20);
  EXPECT_GE(device->registrations(), 2);
  EXPECT_TRUE(device->registered().empty()) << "staging left registered after the load";
  EXPECT_LE(device->largest_copy(), size_t{2} << 20);
  // "big" is taken whole: both of its saved chunks were checked, from the
  // bytes as they were read (on several threads, out of order), not again.
  EXPECT_GE(res->chunks_verified, 2u);
  LoadOptions unverified = options;
  unverified.verify_checksums = false;
  auto plain = Load(d.request, root_ + "/ckpt", *comm, unverified);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(res->bytes_read, plain->bytes_read) << "a chunk was read again to verify it";
}

// Records the length of every read of the files it opens.
class ReadLengths final : public testing::ForwardingFileSystem {
 public:
  using ForwardingFileSystem::ForwardingFileSystem;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const ReadOptions& o) override {
    SS_ASSIGN_OR_RETURN(auto file, base_->NewRandomAccessFile(p, o));
    return std::unique_ptr<RandomAccessFile>(new File(this, std::move(file)));
  }
  std::vector<uint64_t> lengths() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lengths_;
  }

 private:
  class File final : public RandomAccessFile {
   public:
    File(ReadLengths* fs, std::unique_ptr<RandomAccessFile> base)
        : fs_(fs), base_(std::move(base)) {}
    Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
      fs_->Add(n);
      return base_->ReadAt(offset, dst, n);
    }
    uint64_t size() const override { return base_->size(); }

   private:
    ReadLengths* const fs_;
    std::unique_ptr<RandomAccessFile> base_;
  };
  void Add(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    lengths_.push_back(n);
  }
  mutable std::mutex mu_;
  std::vector<uint64_t> lengths_;
};

// A chunk that goes whole into one contiguous run (what a device load's
// batch of one large tensor is) is still read in reads of at most
// max_read_bytes, so the reader's threads share it, and is verified once.
TEST_F(DeviceSaveTest, SourceReaderCutsAReadStraightIntoItsTargetIntoWindows) {
  SaveFromHost(root_ + "/ckpt");
  auto src = OpenSource(*DefaultFileSystem(), root_ + "/ckpt");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ReadLengths fs(DefaultFileSystem());
  SourceReader reader(*src, fs, /*verify_checksums=*/true, {4, 1 << 20, false});
  OwnedTarget target = MakeTarget("big", DType::kF32, kBig, {Box::Whole(kBig), {}});
  const std::string key = "big";
  const SourcePiece piece{&key, target.target.slice, target.target.data, DType::kF32};
  ASSERT_TRUE(reader.Read({&piece, 1}, 1 << 20).ok());
  EXPECT_TRUE(MatchesOracle(target));
  const std::vector<uint64_t> lengths = fs.lengths();
  EXPECT_GE(lengths.size(), 32u) << "32 MiB in reads of at most 1 MiB";
  EXPECT_LE(*std::max_element(lengths.begin(), lengths.end()), uint64_t{1} << 20);
  EXPECT_EQ(reader.bytes_read(), uint64_t{4100} * 2048 * 4) << "a byte read twice";
  EXPECT_EQ(reader.chunks_verified(), 2u) << "both saved halves of big, from the stream";
}

// Memory the caller keeps registered and lends to each load is where the
// staging buffers go: loads register nothing of their own; memory too
// small for both buffers is not used.
TEST_F(DeviceSaveTest, LoadsIntoDeviceTargetsStageInLentMemory) {
  SaveFromHost(root_ + "/ckpt");
  auto device = std::make_shared<ShiftedDevice>();
  constexpr size_t kLent = 4 << 20;
  void* lent = std::aligned_alloc(4096, kLent);
  ASSERT_NE(lent, nullptr);
  device->Register(lent, kLent);
  auto comm = MakeSingleProcessComm();
  for (int load = 0; load < 2; ++load) {
    DeviceTargets d = MakeDeviceTargets();
    LoadOptions options;
    options.device = device;
    options.device_staging_bytes = kLent;
    options.device_staging_memory = {static_cast<char*>(lent), kLent};
    auto res = Load(d.request, root_ + "/ckpt", *comm, options);
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    for (const OwnedTarget& t : d.owned) EXPECT_TRUE(MatchesOracle(t)) << t.target.key;
    EXPECT_EQ(device->bytes_copied(), d.bytes * (load + 1));
  }
  EXPECT_EQ(device->registrations(), 1) << "a load registered staging of its own";
  EXPECT_EQ(device->registered().size(), 1u);

  DeviceTargets d = MakeDeviceTargets();
  LoadOptions options;
  options.device = device;
  options.device_staging_bytes = kLent;
  options.device_staging_memory = {static_cast<char*>(lent), kLent - 4096};
  auto res = Load(d.request, root_ + "/ckpt", *comm, options);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  for (const OwnedTarget& t : d.owned) EXPECT_TRUE(MatchesOracle(t)) << t.target.key;
  EXPECT_EQ(device->registrations(), 3) << "too little lent: two buffers of its own";
  EXPECT_EQ(device->registered().size(), 1u) << "its own unregistered after the load";
  device->Unregister(lent, kLent);
  std::free(lent);
}

TEST_F(DeviceSaveTest, LoadIntoDeviceFailuresAreClearAndNeverHang) {
  SaveFromHost(root_ + "/ckpt");
  auto comm = MakeSingleProcessComm();
  {
    DeviceTargets d = MakeDeviceTargets();
    Status s = Load(d.request, root_ + "/ckpt", *comm, {}).status();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("tensor \"big\": the target is on a device"));
  }
  {
    DeviceTargets d = MakeDeviceTargets();
    auto failing = std::make_shared<ShiftedDevice>();
    failing->FailFrom(3);
    LoadOptions options;
    options.device = failing;
    options.device_staging_bytes = 4 << 20;
    Status s = Load(d.request, root_ + "/ckpt", *comm, options).status();
    EXPECT_THAT(s.message(), HasSubstr("device copy failed (injected)"));
    EXPECT_THAT(s.message(), HasSubstr("may be partly overwritten"));
    EXPECT_TRUE(failing->registered().empty());
  }
  {
    // A flipped byte in "big"'s data: DataLoss naming it, as a host load.
    std::string data_file;
    for (const auto& e : std::filesystem::directory_iterator(root_ + "/ckpt")) {
      if (e.path().filename().string().rfind("data-00000-", 0) == 0) data_file = e.path();
    }
    ASSERT_FALSE(data_file.empty());
    testing::FlipByte(data_file, std::filesystem::file_size(data_file) - 100, 0x10);
    DeviceTargets d = MakeDeviceTargets();
    LoadOptions options;
    options.device = std::make_shared<ShiftedDevice>();
    options.device_staging_bytes = 4 << 20;
    Status s = Load(d.request, root_ + "/ckpt", *comm, options).status();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("checksum mismatch"));
  }
}

}  // namespace
}  // namespace shardsafe
