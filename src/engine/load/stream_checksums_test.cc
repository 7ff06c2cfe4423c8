#include "engine/load/stream_checksums.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>

#include "base/crc32c.h"

namespace shardsafe {
namespace {

// One data file holding chunk "a" (bytes [8, 8 + 4000)) and chunk "b"
// (right after it, 1000 bytes).
struct Fixture {
  Fixture() : data(8 + 4000 + 1000) {
    std::mt19937 rng(7);
    for (char& c : data) c = static_cast<char>(rng());
    index.files.push_back({"data.safetensors", data.size(), 0});
    AddChunk("a", 8, 4000);
    AddChunk("b", 4008, 1000);
  }
  void AddChunk(const std::string& key, uint64_t at, uint64_t bytes) {
    IndexTensor t{DType::kU8, {bytes}, {}};
    t.chunks.push_back({Slice{Box::Whole({bytes}), std::nullopt}, 0, at, bytes,
                        Crc32c(data.data() + at, bytes)});
    index.tensors.emplace(key, std::move(t));
  }
  void Add(StreamChecksums& s, uint64_t lo, uint64_t hi) const {
    s.Add(0, lo, hi - lo, data.data() + lo);
  }
  const PackedTensors& Packed() {
    packed = PackedTensors::From(index.tensors);
    return packed;
  }

  std::vector<char> data;
  CheckpointIndex index;
  PackedTensors packed;
};

TEST(StreamChecksumsTest, PiecesInAnyOrderOnAnyThreadVerifyEveryChunk) {
  Fixture f;
  // Cut the file into uneven pieces, some overlapping (bytes read twice),
  // and add them shuffled from four threads.
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  std::mt19937 rng(11);
  for (uint64_t at = 0; at < f.data.size();) {
    const uint64_t n = 1 + rng() % 700;
    const uint64_t back = at >= 50 && rng() % 3 == 0 ? rng() % 50 : 0;  // an overlap
    pieces.emplace_back(at - back, std::min<uint64_t>(f.data.size(), at + n));
    at += n;
  }
  std::shuffle(pieces.begin(), pieces.end(), rng);
  StreamChecksums s(f.Packed(), {"data.safetensors"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < pieces.size(); i += 4) f.Add(s, pieces[i].first, pieces[i].second);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(s.status().ok()) << s.status().message();
  EXPECT_EQ(s.verified_count(), 2u);
  EXPECT_TRUE(s.Unverified({"a", "b"}).empty());
}

TEST(StreamChecksumsTest, AChunkNotWhollyReadStaysUnverified) {
  Fixture f;
  StreamChecksums s(f.Packed(), {"data.safetensors"});
  f.Add(s, 8, 2000);
  f.Add(s, 2100, 4008);  // a gap of 100 bytes in "a"; "b" untouched
  EXPECT_EQ(s.verified_count(), 0u);
  EXPECT_EQ(s.Unverified({"a", "b"}).size(), 2u);
  f.Add(s, 1990, 2110);  // fills the gap, overlapping both sides
  EXPECT_EQ(s.verified_count(), 1u);
  EXPECT_TRUE(s.status().ok());
}

TEST(StreamChecksumsTest, AFlippedByteInAnyPieceIsAMismatchNamingTheChunk) {
  Fixture f;
  StreamChecksums s(f.Packed(), {"data.safetensors"});
  std::vector<char> bad = f.data;
  bad[3000] ^= 0x10;
  s.Add(0, 2500, 1508, bad.data() + 2500);  // the later piece first
  s.Add(0, 0, 2500, bad.data());
  EXPECT_EQ(s.verified_count(), 0u);
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(s.status().message().find("tensor \"a\""), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("data.safetensors"), std::string::npos);
  EXPECT_EQ(s.Unverified({"a"}).size(), 1u);  // never counted as verified
}

}  // namespace
}  // namespace shardsafe
